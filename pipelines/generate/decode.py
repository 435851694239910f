"""The `generate run` job: decode one split with a trained generator on a Ray Data actor pool.

The split's examples (prepared at training time, so ids and vocabulary match the
checkpoint) are cut into shards; each actor loads the model once (`setup`), decodes
its shards in batches of `batch_size` (greedy, or beam search with `beam_size` > 1),
and writes per shard:
- `explanations/`: the EXPLANATIONS table `rexeval evaluate` and `rexeval judge` read as
  is (system = the model, example id = the review id, so it joins the ground truth; the
  target text as `reference`);
- `ratings/`: the predicted rating beside the true one (models that predict ratings);
- `errors/`: an example whose decoding failed or produced no word, with the reason.
The split's reviews without a target (recorded when the data was prepared) are copied
to `errors/` too, so every review of the split is in the output or an error row. The
manifest holds the counts and, for rating models, RMSE and MAE. A re-run skips done shards.

The checkpoint (and the data folder it names) and the output may be local folders or
URIs (`rexeval/storage.py`): each actor copies the checkpoint's state down itself
and writes its shards to the output, and the driver reads only the prepared folder's
index and error rows, the markers and the two rating columns.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import torch

from rexeval.models.generators.base import beam, generator_class, greedy
from rexeval.pipelines.core.inputs import resolved_text
from rexeval.pipelines.core.io import ShardedOutput, read_table, write_parquet_atomic
from rexeval.pipelines.core.schema import EXPLANATIONS, error_rows
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import (Resources, Stage, actor_count, cpu_share, custom_resources, memory_bytes,
                                          use_cpus)
from rexeval.storage import Location, PathLike, location
from rexeval.pipelines.core.tune import STATE_FILE
from rexeval.pipelines.generate.config import GENERATE_RUN_OUTPUTS, RunConfig
from rexeval.pipelines.generate.data import data_errors, read_index

STAGE = "generate"
TABLES = [GENERATE_RUN_OUTPUTS.explanations, GENERATE_RUN_OUTPUTS.ratings, GENERATE_RUN_OUTPUTS.errors]
RATINGS = pa.schema([
    pa.field("example_id", pa.string(), nullable=False),
    pa.field("system", pa.string(), nullable=False),
    pa.field("rating", pa.float32(), nullable=False),
    pa.field("predicted_rating", pa.float32(), nullable=False),
])
_RESULT = pa.schema([("shard", pa.int64()), ("in", pa.int64()), ("out", pa.int64()), ("errors", pa.int64()),
                     ("sq_error", pa.float64()), ("abs_error", pa.float64()), ("rated", pa.int64())])


def checkpoint_dir(path: PathLike) -> Location:
    """A `generate train` output folder's best checkpoint, or an epoch checkpoint folder."""
    p = location(path)
    for cand in (p / "best", p):
        if (cand / STATE_FILE).exists():
            return cand
    raise FileNotFoundError(f"{p} holds no generator checkpoint: give a `rexeval generate train` output "
                            f"folder (with best/{STATE_FILE}) or an epoch checkpoint folder")


class DecodeStage(Stage):
    """Decode one shard of examples per call (batch_size 1: a task row is a shard)."""

    name = "generate-decode"
    batch_size = 1

    def __init__(self, checkpoint: str, output: ShardedOutput, split: str, shard_size: int, *, system: str,
                 beam_size: int, decode_batch: int, max_words: int | None, limit: int | None,
                 resources: Resources):
        self.checkpoint, self.output, self.split, self.shard_size = checkpoint, output, split, shard_size
        self.system, self.beam_size, self.decode_batch = system, beam_size, decode_batch
        self.max_words, self.limit, self.resources = max_words, limit, resources

    def setup(self) -> None:
        from rexeval.pipelines.generate.train import load_checkpoint_model

        use_cpus(self.resources)
        self.device = "cuda" if self.resources.gpus else "cpu"
        self.model, self.settings, self.data = load_checkpoint_model(self.checkpoint, self.device)
        self.examples = self.data.examples(self.split)

    def process(self, batch: pa.Table) -> pa.Table:
        rows = [{"shard": s, **self.build(s)} for s in batch.column("shard").to_pylist()]
        return pa.Table.from_pylist(rows, schema=_RESULT)

    def decode(self, rows: list[int]) -> tuple[list[str], list[float] | None]:
        """Texts (and predicted ratings) for example rows of the split, in one batch."""
        b = self.data.batch(self.split, rows).to(self.device)
        n = self.max_words or self.data.max_words
        if self.beam_size > 1:
            ids = beam(self.model, b.user, b.item, b.rating, n, beam_size=self.beam_size)
        else:
            ids = greedy(self.model, b.user, b.item, b.rating, n)
        with torch.no_grad():
            r = self.model.predict_rating(b.user, b.item)
        return [self.data.vocab.decode(x) for x in ids], (None if r is None else r.float().cpu().tolist())

    def batches(self, start: int, n: int) -> list[list[int]]:
        """The shard's rows (0..n-1) in decoding batches. Models with prompts of different
        lengths (XRec's profiles) get their rows sorted by prompt length first, so a batch
        holds prompts of one shape or nearly (the rest is left-padded and masked)."""
        order = list(range(n))
        lengths = getattr(self.model, "prompt_lengths", None)
        if lengths is not None and n:
            a = self.data.arrays[self.split]
            size = lengths(torch.from_numpy(a["user"][start:start + n]), torch.from_numpy(a["item"][start:start + n]))
            order.sort(key=lambda k: size[k])
        return [order[k:k + self.decode_batch] for k in range(0, n, self.decode_batch)]

    def build(self, shard: int) -> dict:
        end = self.examples.num_rows if self.limit is None else min(self.limit, self.examples.num_rows)
        start, stop = shard * self.shard_size, min((shard + 1) * self.shard_size, end)
        ex = self.examples.slice(start, stop - start).to_pylist()
        done: dict[int, tuple[str, float | None] | Exception] = {}
        for part in self.batches(start, len(ex)):
            try:
                texts, ratings = self.decode([start + k for k in part])
            except Exception as exc:  # noqa: BLE001 - a failed batch becomes error rows, the job goes on
                done.update({k: exc for k in part})
                continue
            done.update({k: (t, None if ratings is None else ratings[j]) for j, (k, t) in enumerate(zip(part, texts))})
        out, rated, errors = [], [], []
        for k, e in enumerate(ex):  # in the split's order, whatever order the batches ran in
            got = done[k]
            if isinstance(got, Exception):
                errors.append({"row_id": e["example_id"], "error_type": "decode_failed",
                               "message": f"{self.split} example {e['example_id']}: decoding failed: "
                                          f"{type(got).__name__}: {got}"})
                continue
            text, rating = got
            if rating is not None:
                rated.append({"example_id": e["example_id"], "system": self.system, "rating": e["rating"],
                              "predicted_rating": rating})
            if not text.strip():
                errors.append({"row_id": e["example_id"], "error_type": "empty_output",
                               "message": f"{self.split} example {e['example_id']}: the model generated "
                                          "no word (EOS first)"})
                continue
            out.append({"example_id": e["example_id"], "system": self.system, "user_id": e["user_id"],
                        "item_id": e["item_id"], "explanation": text, "reference": e["reference"]})
        sq = sum((r["predicted_rating"] - r["rating"]) ** 2 for r in rated)
        ab = sum(abs(r["predicted_rating"] - r["rating"]) for r in rated)
        counts = {"in": len(ex), "out": len(out), "errors": len(errors)}
        self.output.write_shard(shard, {"explanations": pa.Table.from_pylist(out, schema=EXPLANATIONS),
                                        "ratings": pa.Table.from_pylist(rated, schema=RATINGS),
                                        "errors": error_rows(STAGE, errors)},
                                {**counts, "rated": len(rated)})
        return {**counts, "sq_error": sq, "abs_error": ab, "rated": len(rated)}


def run_generate(cfg: RunConfig, overwrite: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Decode the split (resuming finished shards) and return the manifest."""
    from rexeval.pipelines.generate.train import read_state

    t0 = time.time()
    ck = checkpoint_dir(cfg.checkpoint)
    state = read_state(ck)
    index = read_index(state["data"])
    system = cfg.system or generator_class(state["settings"]["model"]).system_name(state["settings"])
    size = int(index["counts"][cfg.split])
    n = size if cfg.limit is None else min(cfg.limit, size)
    shards = max(1, math.ceil(n / cfg.shard_size))
    # What the output depends on (not where it goes or how many actors make it).
    exclude = {"checkpoint", "out", "workers", "min_workers", "cpus_per_worker", "gpus_per_worker",
               "memory_per_worker", "resources_per_worker"}
    config = {"checkpoint": resolved_text(ck), "epoch": state["epoch"], **cfg.model_dump(exclude=exclude),
              "system": system}
    job = ShardedJob(ShardedOutput(cfg.out, STAGE, config, TABLES), shards, overwrite=overwrite, progress=progress)
    if (manifest := job.finished("generate run")) is not None:
        return manifest
    workers = actor_count(cfg.workers, shards, Resources(cpus=1, gpus=cfg.gpus_per_worker))
    resources = Resources(cpus=cfg.cpus_per_worker or cpu_share(workers), gpus=cfg.gpus_per_worker,
                          custom=custom_resources(cfg), memory=memory_bytes(cfg))
    how = "greedy" if cfg.beam_size == 1 else f"beam search ({cfg.beam_size} beams)"
    progress(f"generate run: {system} (epoch {state['epoch']}) on {n:,} {cfg.split} examples, {how}, "
             f"{shards} shard(s), {workers} actor(s)")
    job.say_resumed()
    stage = DecodeStage(str(ck), job.output, cfg.split, cfg.shard_size, system=system, beam_size=cfg.beam_size,
                        decode_batch=cfg.batch_size, max_words=cfg.max_words, limit=cfg.limit, resources=resources)
    job.run(stage, workers=workers, min_workers=cfg.min_workers,
            report=lambda row, k, m: f"  shard {row['shard']}: {row['out']:,} explanation(s), "
                                     f"{row['errors']} error(s) ({k}/{m})")
    # Reviews of this split that had no target: one error row each (written once).
    missing = data_errors(state["data"])
    missing = missing.filter(pc.starts_with(missing.column("message"), f"{cfg.split} split:"))
    if cfg.limit is None:
        write_parquet_atomic(location(cfg.out) / "errors" / "no-target.parquet", missing)
    ratings = read_ratings(cfg.out, columns=["rating", "predicted_rating"])
    # `target` tells `rexeval evaluate` what the references are (review: seed 000 Table VII).
    extra = {"system": system, "split": cfg.split, "target": index.get("target"),
             "seconds": round(time.time() - t0, 2)}
    if ratings.num_rows:
        diff = pc.subtract(ratings.column("predicted_rating").cast(pa.float64()),
                           ratings.column("rating").cast(pa.float64()))
        extra["rmse"] = math.sqrt(pc.mean(pc.multiply(diff, diff)).as_py())
        extra["mae"] = pc.mean(pc.abs(diff)).as_py()
    counts = job.output.total_counts()
    counts["no_target"] = missing.num_rows if cfg.limit is None else 0
    counts["errors"] = counts.get("errors", 0) + counts["no_target"]
    return job.output.finish(shards, counts=counts, **extra)


def read_ratings(folder: PathLike, columns: list[str] | None = None) -> pa.Table:
    """The predicted ratings of a `generate run` output (empty for models without them)."""
    return read_table(location(folder) / "ratings", RATINGS, columns=columns)
