"""Extraction quality (seed 002, section 5.2.1 and Table 2): an LLM judges a sample.

For a seeded sample of interactions, every statement is judged for explanatoriness
(a general fact about the item that affects the experience) and atomicity (one
opinion on one aspect). With STAR output both the candidates (no verification) and the
verified statements are judged, giving Table 2's columns without / with verification
and the gain. Unusable judge answers are counted and reported, never guessed.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.models.llm.base import SamplingParams, check_model_here
from rexeval.pipelines.extract.config import QualityConfig
from rexeval.pipelines.core.io import ShardedOutput, read_table, table_files, write_json_atomic
from rexeval.models.llm.cache import build_cached_backend
from rexeval.pipelines.extract.outputs import QUALITY
from rexeval.pipelines.core.schema import error_rows
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus, worker_resources
from rexeval.pipelines.extract.structured import Task, answer_all

JUDGEMENTS = pa.schema([
    pa.field("statement_id", pa.string(), nullable=False),
    pa.field("review_id", pa.string(), nullable=False),
    pa.field("stage", pa.string(), nullable=False),
    pa.field("statement", pa.string(), nullable=False),
    pa.field("explanatory", pa.bool_()),
    pa.field("atomic", pa.bool_()),
])
STAGE_LABEL = {"candidate": "without verification", "verified": "with verification",
               "triplet": "triplets"}


def sample_statements(statements: pa.Table, n: int, seed: int) -> pa.Table:
    """Statements of `n` reviews drawn with `seed` (sorted ids first, so reruns agree)."""
    ids = sorted(set(statements.column("review_id").to_pylist()))
    rng = np.random.default_rng(seed)
    chosen = ids if n >= len(ids) else sorted(rng.choice(ids, size=n, replace=False).tolist())
    picked = statements.filter(pc.is_in(statements.column("review_id"), value_set=pa.array(chosen)))
    return picked.sort_by([("review_id", "ascending"), ("stage", "ascending"),
                           ("statement_id", "ascending")])


def summarise(judgements: pa.Table, unparsed: dict[str, int]) -> dict[str, dict]:
    """Per stage: statements judged, % explanatory, % atomic, unusable answers."""
    df = judgements.to_pandas()
    out = {}
    for stage in sorted(set(df["stage"]) | set(unparsed)):
        part = df[df["stage"] == stage]
        ok = part.dropna(subset=["explanatory", "atomic"])
        out[stage] = {"statements": int(len(ok)), "unparsed": int(unparsed.get(stage, 0)),
                      "explanatory_pct": round(float(100 * ok["explanatory"].astype(bool).mean()), 2)
                      if len(ok) else None,
                      "atomic_pct": round(float(100 * ok["atomic"].astype(bool).mean()), 2)
                      if len(ok) else None}
    return out


def format_table2(label: str, summary: dict[str, dict]) -> str:
    """Markdown in the layout of seed 002's Table 2 (without / with verification, gain)."""
    def pct(v):
        return "n/a" if v is None else f"{v:.2f}"

    if "candidate" in summary or "verified" in summary:
        c, v = summary.get("candidate", {}), summary.get("verified", {})

        def gain(key):
            a, b = c.get(key), v.get(key)
            return "n/a" if a is None or b is None else f"{b - a:+.2f}"

        return "\n".join([
            "| Dataset | Explanatory ✗ | Explanatory ✓ | Gain | Atomic ✗ | Atomic ✓ | Gain |",
            "|---|---|---|---|---|---|---|",
            f"| {label} | {pct(c.get('explanatory_pct'))} | {pct(v.get('explanatory_pct'))} | "
            f"{gain('explanatory_pct')} | {pct(c.get('atomic_pct'))} | {pct(v.get('atomic_pct'))} | "
            f"{gain('atomic_pct')} |",
            "", "✗ = candidates before verification, ✓ = verified statements; % of statements.",
        ])
    t = summary.get("triplet", {})
    return "\n".join(["| Dataset | Explanatory | Atomic |", "|---|---|---|",
                      f"| {label} | {pct(t.get('explanatory_pct'))} | {pct(t.get('atomic_pct'))} |"])


class JudgeStage(Stage):
    """One shard of sampled statements per call: judge each, write the shard."""

    name = "extract-quality"
    batch_size = 1

    def __init__(self, cfg: QualityConfig, model: dict, output: ShardedOutput, sample_ref,
                 reviews: dict[str, str] | None, resources: Resources):
        self.cfg, self.model, self.output, self.sample_ref = cfg, model, output, sample_ref
        self.reviews, self.resources = reviews, resources

    def setup(self) -> None:
        import ray

        from rexeval.prompts import load_prompt

        use_cpus(self.resources)
        self.sample = self.sample_ref if isinstance(self.sample_ref, pa.Table) else ray.get(self.sample_ref)
        self.llm = build_cached_backend(self.model["backend"], self.model["judge"], self.cfg.backend_options,
                                self.cfg.cache_path())
        self.prompt = load_prompt("extract_quality")

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            part = self.sample.slice(shard * self.cfg.shard_size, self.cfg.shard_size)
            judged, errors = judge(part, self.llm.generate, self.prompt, self.cfg, self.reviews)
            counts = {"in": part.num_rows, "out": judged.num_rows - errors.num_rows,
                      "errors": errors.num_rows}
            self.output.write_shard(shard, {"judgements": judged, "errors": errors}, counts)
            rows.append({"shard": shard, **counts})
        return pa.Table.from_pylist(rows)


def judge(part: pa.Table, generate, prompt, cfg: QualityConfig,
          reviews: dict[str, str] | None) -> tuple[pa.Table, pa.Table]:
    """Judge each statement of `part`; unusable answers get null labels and an error row."""
    rows = part.to_pylist()
    tasks = []
    for r in rows:
        review = reviews.get(r["review_id"]) if reviews is not None else None
        tasks.append(Task(prompt.render(statement=r["statement"], review=review), QUALITY,
                          QUALITY.json_schema()))
    sampling = SamplingParams(max_tokens=cfg.max_tokens)
    outcomes = answer_all(tasks, generate, sampling, cfg.max_retries)
    judged, errors = [], []
    for r, out in zip(rows, outcomes):
        j = out.parsed.items[0] if out.ok else None
        judged.append({"statement_id": r["statement_id"], "review_id": r["review_id"],
                       "stage": r["stage"], "statement": r["statement"],
                       "explanatory": j.explanatory if j else None,
                       "atomic": j.atomic if j else None})
        if j is None:
            errors.append({"row_id": r["statement_id"],
                           "error_type": out.error_type, "message": out.message, "raw": out.raw})
    return pa.Table.from_pylist(judged, schema=JUDGEMENTS), error_rows("extract-quality", errors)


def run_quality(cfg: QualityConfig, overwrite: bool = False,
                progress: Callable[[str], None] = print) -> dict:
    """Judge a sample of an extract output and write judgements + the Table 2 report."""
    from pathlib import Path

    from rexeval.models.profiles import load_profile
    from rexeval.prompts import load_prompt

    t0 = time.time()
    cfg = cfg.with_resolved_cache()
    src = Path(cfg.input)
    st_path = src / "statements" if (src / "statements").is_dir() else src
    if not table_files(st_path):
        raise FileNotFoundError(f"no statements found in {cfg.input} (expected an `rexeval extract` output)")
    statements = read_table(st_path, "statements")
    profile = load_profile(cfg.profile, cfg.models)
    model = {"backend": cfg.backend or profile.llm_backend, "judge": profile.require("judge_llm")}
    check_model_here(model["backend"], model["judge"])
    sample = sample_statements(statements, cfg.sample, cfg.seed)
    n_shards = max(1, -(-sample.num_rows // cfg.shard_size))
    conf = {"input": str(st_path.resolve()), "sample": cfg.sample, "seed": cfg.seed,
            "with_review": cfg.with_review, "model": model, "max_tokens": cfg.max_tokens,
            "max_retries": cfg.max_retries, "shard_size": cfg.shard_size,
            "prompt": load_prompt("extract_quality").version,
            "backend_options": cfg.hashed_backend_options()}
    job = ShardedJob(ShardedOutput(cfg.out, "extract-quality", conf, ["judgements", "errors"]), n_shards,
                     overwrite=overwrite, progress=progress)
    out = job.output
    reviews = None
    if cfg.with_review:
        import json

        from rexeval.pipelines.extract.pipeline import ExtractConfig, load_reviews

        manifest_file = src / "manifest.json"
        if not manifest_file.exists():
            raise FileNotFoundError(f"{manifest_file} not found: --with-review needs an "
                                    "`rexeval extract` output folder")
        ext = json.loads(manifest_file.read_text())["config"]
        reviews_tab = load_reviews(ExtractConfig(input=ext["input"], out=str(src), limit=ext.get("limit")))
        reviews = dict(zip(reviews_tab.column("review_id").to_pylist(),
                           reviews_tab.column("text").to_pylist()))
    n_reviews = len(set(sample.column("review_id").to_pylist()))
    progress(f"extract-quality ({model['backend']}: {model['judge']}): {sample.num_rows:,} "
             f"statement(s) of {n_reviews:,} review(s) -> {cfg.out}")
    if job.todo:
        import ray

        stage = JudgeStage(cfg, model, out, ray.put(sample), reviews, worker_resources(cfg))
        job.run(stage, workers=cfg.workers, report=lambda row, k, n: (
            f"  shard {row['shard']} judged ({k}/{n}): {row['out']} ok, {row['errors']} unusable answer(s)"))
    judgements = out.read("judgements")
    errors = out.read("errors")
    unparsed: dict[str, int] = {}
    if errors.num_rows:
        bad = set(errors.column("row_id").to_pylist())
        for sid, stage in zip(judgements.column("statement_id").to_pylist(),
                              judgements.column("stage").to_pylist()):
            if sid in bad:
                unparsed[stage] = unparsed.get(stage, 0) + 1
    summary = summarise(judgements, unparsed)
    label = cfg.label or Path(cfg.input).resolve().name
    table = format_table2(label, summary)
    (Path(cfg.out) / "report.md").write_text(
        f"# Extraction quality: {label}\n\nJudge: {model['judge']} ({model['backend']}), "
        f"{n_reviews} interaction(s) sampled with seed {cfg.seed}.\n\n{table}\n")
    write_json_atomic(Path(cfg.out) / "report.json", {"label": label, "summary": summary,
                                                      "interactions": n_reviews})
    manifest = job.finish(summary=summary)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    manifest["table"] = table
    return manifest
