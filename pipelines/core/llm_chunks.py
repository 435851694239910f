"""LLM jobs on Ray in chunks of work, each a resumable shard, calling the LLM through
the judge Serve deployment (or an in-process backend).

`rexeval judge likert|pairwise|detect` and `rexeval generate llm` share this runner: the
driver writes the rows to work on (`payload.parquet`), splits them into chunks, and a
Ray Data actor pool runs one task function per chunk (`fn(llm, rows, settings)` ->
(tables, CallStats); the judges' are in `pipelines/judge/tasks.py`, the prompted
generators' in `pipelines/generate/prompted/`). Each actor holds one LLM client: a handle
to the `rexeval-judge` Serve deployment (it serves any chat LLM; the job starts it when
none is running and stops it at the end), an HTTP client of a remote one, or, with
`judge_service: none`, an in-process backend behind the call cache. Every chunk writes
its tables and a one-row `usage` table (calls, tokens, seconds, retries, unreadable
answers), so a re-run skips finished chunks and the report's totals still count every
call the results cost.

The output folder may be a URI (`pipelines/core/storage.py`): the payload, the shards
and the report go there, and each actor reads the payload from there.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.io import ShardedOutput, write_json_atomic, write_parquet_atomic
from rexeval.pipelines.core.job_metrics import record_llm_usage
from rexeval.pipelines.core.storage import PathLike, location
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Resources, Stage, worker_resources
from rexeval.pipelines.core.llm_job import ChunkedLLMSettings

# fn(llm, rows, settings) -> ({table name: DataFrame | pa.Table}, CallStats)
ChunkTask = Callable[[Any, pd.DataFrame, dict], tuple[dict, Any]]

USAGE_FIELDS = ("asked", "retries", "unparseable", "errors", "calls", "cached_calls", "call_errors",
                "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "cached_completion_tokens",
                "seconds")


# ------------------------------------------------------------------ LLM clients


def llm_spec(cfg: ChunkedLLMSettings, profile, role: str = "judge_llm", model: str | None = None) -> dict:
    """Backend, model and options of the judge, resolved in the driver (the call cache
    under the job's output when that is a URI and no cache was given)."""
    from rexeval.models.llm.base import check_model_here

    c = cfg.with_resolved_cache(cfg.out)
    spec = {"backend": cfg.backend or profile.llm_backend, "model": model or profile.require(role),
            "options": dict(cfg.backend_options), "cache": c.cache_path()}
    check_model_here(spec["backend"], spec["model"])
    return spec


def build_llm(spec: dict, address: str):
    """The LLM a task calls: a client of the judge deployment (which keeps the call
    cache), or an in-process backend behind the cache."""
    if address != "none":
        from rexeval.models.llm.base import BackendSpec, build_backend

        return build_backend(BackendSpec(backend="serve", model="auto", options={"address": address}))
    from rexeval.pipelines.core.llm_cache import build_cached_backend

    return build_cached_backend(spec["backend"], spec["model"], spec["options"], spec["cache"])


class JudgeService:
    """The judge a job uses (`serve.judge_client.JudgeService` set up from the job's settings):
    `address()` is what `build_llm` takes, `model_id` the served model's id."""

    def __init__(self, cfg: ChunkedLLMSettings, spec: dict, progress: Callable[[str], None]):
        from rexeval.models.llm.base import BackendSpec
        from rexeval.pipelines.core.llm_cache import node_cache
        from rexeval.serve.judge import JudgeServeConfig
        from rexeval.serve.judge_client import JudgeService as Service

        explicit = cfg.judge_service != "auto"
        backend = BackendSpec(backend=spec["backend"], model="auto" if explicit else spec["model"],
                              options=spec["options"])
        # The deployment (serve layer) opens only a local SQLite cache; in-process calls
        # (judge_service none) use the spec's cache, a URI included.
        serve_cfg = JudgeServeConfig(backend=backend, cache=node_cache(spec["cache"]),
                                     max_replicas=cfg.judge_replicas,
                                     num_gpus=cfg.judge_gpus)
        self.service = Service(serve_cfg, service=cfg.judge_service, port=cfg.serve_port, progress=progress)
        self.model_id = spec["model"]
        self.wanted = None if explicit else spec["model"]

    def app(self) -> tuple[str, str] | None:
        """(Serve application, hash of what it would serve) when the job starts or joins
        the judge application itself (judge_service auto); None when it calls a given one
        or runs the LLM in-process."""
        from rexeval.pipelines.core.io import config_hash

        if self.service.service != "auto":
            return None
        return self.service.app_name, config_hash(self.service.cfg.model_dump())

    def address(self) -> str:
        address = self.service.address()
        if address != "none":
            self.model_id = self.service.check()
            if self.wanted is not None and not self.service.started and self.model_id != self.wanted:
                self.service.stop()
                raise ValueError(f"the running Serve application {self.service.app_name!r} serves "
                                 f"{self.model_id!r}, not {self.wanted!r} which this job asks for: stop it "
                                 f"(serve delete {self.service.app_name}) or pass judge_service "
                                 f"serve:{self.service.app_name} to use it as it is")
        return address

    def stop(self) -> None:
        self.service.stop()


# ------------------------------------------------------------------ the chunk runner


def _stats_row(stats) -> pa.Table:
    d = stats.as_dict()
    return pa.table({k: pa.array([float(d.get(k, 0) or 0)], pa.float64()) for k in USAGE_FIELDS})


class LLMChunkStage(Stage):
    """Runs one task function over chunks of the payload and writes each as a shard."""

    batch_size = 1

    def __init__(self, task: str, fn: ChunkTask, spec: dict, address: str, payload: str, chunk: int,
                 output: ShardedOutput, settings: dict, resources: Resources):
        # `fn` is a module-level function: Ray pickles it by reference, so each actor
        # imports the module that defines it.
        self.task, self.fn, self.spec, self.address, self.payload = task, fn, spec, address, payload
        self.chunk, self.output, self.settings, self.resources = chunk, output, settings, resources
        self.name = f"llm:{task}"

    def setup(self) -> None:
        from rexeval.pipelines.core.stage import use_cpus

        use_cpus(self.resources)
        with location(self.payload).open_input() as fh:
            self.rows = pd.read_parquet(fh)
        self.llm = build_llm(self.spec, self.address) if self.spec else None

    def process(self, batch: pa.Table) -> pa.Table:
        out = []
        for shard in batch.column("shard").to_pylist():
            part = self.rows.iloc[shard * self.chunk:(shard + 1) * self.chunk].reset_index(drop=True)
            tables, stats = self.fn(self.llm, part, self.settings)
            record_llm_usage(self.name, getattr(self.llm, "model_id", None) or self.spec.get("model"), stats.usage)
            tables = {k: v if isinstance(v, pa.Table) else pa.Table.from_pandas(v, preserve_index=False)
                      for k, v in tables.items()}
            tables["usage"] = _stats_row(stats)
            counts = {"rows": len(part), "unparseable": int(stats.unparseable), "errors": int(stats.errors)}
            self.output.write_shard(shard, tables, counts)
            out.append({"shard": shard, "rows": len(part)})
        return pa.Table.from_pylist(out)


def run_chunks(task: str, fn: ChunkTask, rows: pd.DataFrame, root: PathLike, tables: list[str], settings: dict,
               spec: dict | None, address: str, cfg: ChunkedLLMSettings,
               progress: Callable[[str], None]) -> ShardedOutput:
    """Run `fn` (named `task` in the output's config and progress) over `rows` in
    chunks, resuming finished ones; returns the output."""
    from rexeval.pipelines.core.io import config_hash

    root = location(root)
    root.mkdir()
    payload = root / "payload.parquet"
    conf = {"task": task, "rows": config_hash({"rows": pd.util.hash_pandas_object(rows, index=False).tolist()}),
            "settings": settings, "model": (spec or {}).get("model"), "chunk": cfg.chunk_size}
    n = max(1, -(-len(rows) // cfg.chunk_size))
    job = ShardedJob(ShardedOutput(root, f"llm:{task}", conf, [*tables, "usage"]), n, overwrite=True,
                     progress=progress)
    write_parquet_atomic(payload, pa.Table.from_pandas(rows, preserve_index=False))
    job.say_chunks(task, f"{len(rows)} rows")
    if job.todo:
        # A client of the Serve deployment needs little CPU; an in-process model takes
        # the CPUs free now, shared by `workers` actors.
        res = Resources(cpus=0.25) if address != "none" or not spec else worker_resources(cfg, free=True)
        stage = LLMChunkStage(task, fn, spec or {}, address, str(payload), cfg.chunk_size, job.output, settings, res)
        t0 = time.time()
        job.run(stage, workers=cfg.workers, report=lambda row, k, todo: (
            f"    {task}: chunk {row['shard'] + 1}/{n} done ({k}/{todo}, {time.time() - t0:.0f}s)"))
    job.finish()
    return job.output


def usage_totals(outputs: list[ShardedOutput], price_table: str | None, model_id: str | None) -> dict:
    """Summed usage of every chunk of the given outputs, with the cost when priced."""
    total = {k: 0.0 for k in USAGE_FIELDS}
    for o in outputs:
        if (o.root / "usage").is_dir():
            t = o.read("usage").to_pandas()
            for k in USAGE_FIELDS:
                total[k] += float(t[k].sum())
    out: dict[str, Any] = {k: (round(v, 3) if k == "seconds" else int(v)) for k, v in total.items()}
    out["model"] = model_id
    if price_table and model_id:
        from rexeval.models.llm.pricing import PriceTable

        prices = PriceTable.load(price_table)
        billed = prices.cost(model_id, out["prompt_tokens"], out["completion_tokens"])
        out["cost_usd"] = None if billed is None else round(billed, 6)
        if billed is None:
            out["cost_note"] = f"no price for {model_id!r} in {price_table}"
    return out


def write_report(root: PathLike, report: dict) -> None:
    write_json_atomic(location(root) / "report.json", report)


