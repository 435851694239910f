"""Extraction quality (seed 002, section 5.2.1 and Table 2): an LLM judges a sample.

For a seeded sample of interactions, every statement is judged for explanatoriness
(a general fact about the item that affects the experience) and atomicity (one
opinion on one aspect). With STAR output both the candidates (no verification) and the
verified statements are judged, giving Table 2's columns without / with verification
and the gain. Unusable judge answers are counted and reported, never guessed.

The driver reads the input's review ids (one column) to draw the sample and plans which
reviews each shard holds; each worker reads those reviews' statements (and, with
`with_review`, their texts) from the input itself, local or by URI.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rexeval.models.llm.base import SamplingParams, check_model_here
from rexeval.pipelines.extract.config import QUALITY_OUTPUTS, QualityConfig
from rexeval.pipelines.core.io import ShardedOutput, write_json_atomic
from rexeval.storage import location
from rexeval.pipelines.core.inputs import resolved_text
from rexeval.pipelines.extract.rows import TableParts
from rexeval.pipelines.extract.outputs import QUALITY
from rexeval.pipelines.core.schema import SchemaError, error_rows
from rexeval.pipelines.core.sharded import shard_line
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.extract.structured import Task

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


SAMPLE_ORDER = [("review_id", "ascending"), ("stage", "ascending"), ("statement_id", "ascending")]


def sample_ids(review_ids: Iterable[str], n: int, seed: int) -> list[str]:
    """`n` review ids drawn with `seed`, sorted (sorted ids first, so reruns agree)."""
    ids = sorted(set(review_ids))
    rng = np.random.default_rng(seed)
    return ids if n >= len(ids) else sorted(rng.choice(ids, size=n, replace=False).tolist())


def sample_statements(statements: pa.Table, n: int, seed: int) -> pa.Table:
    """Statements of `n` reviews drawn with `seed`, in the sample's order."""
    chosen = sample_ids(statements.column("review_id").to_pylist(), n, seed)
    picked = statements.filter(pc.is_in(statements.column("review_id"), value_set=pa.array(chosen)))
    return picked.sort_by(SAMPLE_ORDER)


@dataclass(frozen=True)
class SamplePlan:
    """The sample without its rows: the chosen reviews in order and how many statements
    each has, so that shard `k` (rows [k*size, (k+1)*size) of the sorted sample) can be
    read by a worker from the input itself."""

    ids: tuple[str, ...]
    counts: tuple[int, ...]

    @classmethod
    def draw(cls, parts: TableParts, n: int, seed: int) -> "SamplePlan":
        per_review: dict[str, int] = {}
        for path in parts.files:
            loc = location(path)
            col = pq.read_table(loc.path, filesystem=loc.fs, columns=["review_id"]).column("review_id")
            if col.null_count:
                raise SchemaError("statements", path, "review_id", pc.index(pc.is_null(col), True).as_py(),
                                  "null in a required field")
            for rid, k in zip(*(c.to_pylist() for c in pc.value_counts(col).flatten())):
                per_review[rid] = per_review.get(rid, 0) + k
        chosen = sample_ids(per_review, n, seed)
        return cls(tuple(chosen), tuple(per_review[r] for r in chosen))

    @property
    def num_rows(self) -> int:
        return sum(self.counts)

    def shard(self, parts: TableParts, shard: int, size: int) -> pa.Table:
        """Rows [shard*size, (shard+1)*size) of the sorted sample, read from `parts`."""
        lo, hi = shard * size, (shard + 1) * size
        ids, start, first = [], 0, None
        for rid, k in zip(self.ids, self.counts):
            if start < hi and start + k > lo:
                ids.append(rid)
                first = start if first is None else first
            start += k
        if not ids:
            return parts.read(0, 0)
        rows = parts.read_where("review_id", ids).sort_by(SAMPLE_ORDER)
        return rows.slice(lo - first, hi - lo)


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


class QualityReader:
    """`source_rows`' reader: shard `k` of the sample, read from the input by the worker
    (with each statement's review text when judged with the review)."""

    def __init__(self, statements: TableParts, plan: SamplePlan, reviews: TableParts | None, size: int):
        self.statements, self.plan, self.reviews, self.size = statements, plan, reviews, size

    def __call__(self, shard: int) -> pa.Table:
        part = self.plan.shard(self.statements, shard, self.size).select(
            ["statement_id", "review_id", "stage", "statement"])
        texts: dict[str, str] = {}
        if self.reviews is not None:
            ids = sorted(set(part.column("review_id").to_pylist()))
            found = self.reviews.read_where("review_id", ids, ["review_id", "text"])
            texts = dict(zip(found.column("review_id").to_pylist(), found.column("text").to_pylist()))
        review = [texts.get(r) for r in part.column("review_id").to_pylist()]
        return part.append_column("review", pa.array(review, pa.string()))


class QualitySteps:
    """One statement's judgement as stream steps (`llm.stream.StreamSteps`): the prompt,
    then `structured.record_answer` on each answer (the reading and bounded retries of
    every structured answer, extraction's included)."""

    def __init__(self, max_tokens: int, max_retries: int):
        from rexeval.prompts import load_prompt

        self.prompt, self.feedback = load_prompt("extract_quality"), load_prompt("retry_feedback")
        self.sampling = SamplingParams(max_tokens=max_tokens)
        self.max_retries = max_retries

    def start(self, row: dict) -> dict:
        review = row.pop("review", None)  # None unless judged with the review (QualityReader)
        messages = self.prompt.render(statement=row["statement"], review=review)
        return {"row": row, "convo": messages, "attempts": 0, "done": False, "explanatory": None,
                "atomic": None, "error_type": None, "message": "", "raw": None}

    def request(self, work: dict):
        from rexeval.models.llm.base import ChatRequest

        if work["done"]:
            return None
        return ChatRequest(messages=work["convo"], sampling=self.sampling, json_schema=QUALITY.json_schema())

    def role(self, work: dict) -> str:
        return "llm"

    def advance(self, work: dict, res) -> dict:
        from rexeval.pipelines.extract.structured import Outcome, record_answer

        task = Task(work["convo"], QUALITY, QUALITY.json_schema())
        out = Outcome(attempts=work["attempts"])
        nxt = record_answer(out, work["convo"], task, res, self.sampling,
                            work["attempts"] >= self.max_retries, self.feedback)
        w = {**work, "attempts": out.attempts, "error_type": out.error_type, "message": out.message,
             "raw": out.raw}
        if nxt is not None:
            return {**w, "convo": nxt}
        j = out.parsed.items[0] if out.ok else None
        return {**w, "done": True, "explanatory": j.explanatory if j else None, "atomic": j.atomic if j else None}


class QualityWriter:
    """A shard's settled judgements -> its tables, committed."""

    def __init__(self, output: ShardedOutput):
        self.output = output

    def __call__(self, shard: int, works: list[dict]) -> dict:
        judged, errors = [], []
        for w in works:
            r = w["row"]
            judged.append({**{k: r[k] for k in ("statement_id", "review_id", "stage", "statement")},
                           "explanatory": w["explanatory"], "atomic": w["atomic"]})
            if w["explanatory"] is None:
                errors.append({"row_id": r["statement_id"], "error_type": w["error_type"],
                               "message": w["message"], "raw": w["raw"]})
        judged_t = pa.Table.from_pylist(judged, schema=JUDGEMENTS)
        errors_t = error_rows("extract-quality", errors)
        counts = {"in": len(works), "out": len(judged) - len(errors), "errors": len(errors)}
        self.output.write_shard(shard, {"judgements": judged_t, "errors": errors_t}, counts)
        return counts


def _judge_streamed(cfg: QualityConfig, model: dict, job: ShardedJob, statements: TableParts,
                    plan: SamplePlan, reviews: TableParts | None, progress: Callable[[str], None]) -> None:
    """The shards still to do, through the streaming LLM path (`core.llm.stream`) with the
    judge's engines (`llm.calls_plan.job_plan`); raises AwaitingRerun when transport
    failures left shards unwritten."""
    import functools

    from rexeval.pipelines.core.llm.stream import awaiting_line, retry_settings, run_stream, source_rows
    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.core.llm.calls_plan import job_plan

    init_ray()
    done = [0]

    def on_shard(row: dict) -> None:
        if row["written"]:
            done[0] += 1
            c = row["counts"]
            progress(shard_line(row["shard"], done[0], len(job.todo),
                                f"{c['out']} ok, {c['errors']} unusable answer(s)", verb="judged"))

    steps = functools.partial(QualitySteps, cfg.max_tokens, cfg.max_retries)
    summary = run_stream(source_rows(QualityReader(statements, plan, reviews, cfg.shard_size), job.todo), steps,
                         {"llm": job_plan(cfg, model["backend"], model["judge"])}, QualityWriter(job.output),
                         label="extract-quality", progress=progress, on_shard=on_shard,
                         **retry_settings(cfg.backend_options))
    job.engines = summary.engines  # the manifest's llm_engines
    if summary.awaiting:
        progress("  " + awaiting_line(summary, "statement(s)"))
        job.finish_partial(summary.awaiting, "statement(s)")  # raises AwaitingRerun


def run_quality(cfg: QualityConfig, overwrite: bool = False,
                progress: Callable[[str], None] = print) -> dict:
    """Judge a sample of an extract output and write judgements + the Table 2 report."""
    from pathlib import Path

    from rexeval.models.profiles import load_profile
    from rexeval.prompts import load_prompt

    t0 = time.time()
    cfg = cfg.with_resolved_cache(cfg.out)
    src = location(cfg.input)
    st_path = src / "statements" if (src / "statements").is_dir() else src
    statements = TableParts.of(st_path, "statements")
    if not statements.files:
        raise FileNotFoundError(f"no statements found in {cfg.input} (expected an `rexeval extract` output)")
    profile = load_profile(cfg.profile, cfg.models)
    model = {"backend": cfg.backend or profile.llm_backend, "judge": profile.require("judge_llm")}
    check_model_here(model["backend"], model["judge"])
    plan = SamplePlan.draw(statements, cfg.sample, cfg.seed)
    n_shards = max(1, -(-plan.num_rows // cfg.shard_size))
    conf = {"input": resolved_text(st_path), "sample": cfg.sample, "seed": cfg.seed,
            "with_review": cfg.with_review, "model": model, "max_tokens": cfg.max_tokens,
            "max_retries": cfg.max_retries, "shard_size": cfg.shard_size,
            "prompt": load_prompt("extract_quality").version,
            "backend_options": cfg.hashed_backend_options()}
    job = ShardedJob(ShardedOutput(cfg.out, "extract-quality", conf, [QUALITY_OUTPUTS.judgements, QUALITY_OUTPUTS.errors],
                                   owns=QUALITY_OUTPUTS.paths()), n_shards,
                     overwrite=overwrite, progress=progress)
    out = job.output
    reviews = None
    if cfg.with_review:
        from rexeval.pipelines.core.inputs import reviews_path

        manifest_file = src / "manifest.json"
        if not manifest_file.exists():
            raise FileNotFoundError(f"{manifest_file} not found: --with-review needs an "
                                    "`rexeval extract` output folder")
        ext = manifest_file.read_json()["config"]
        reviews = TableParts.of(location(reviews_path(ext["input"])), "reviews")
    n_reviews = len(plan.ids)
    progress(f"extract-quality ({model['backend']}: {model['judge']}): {plan.num_rows:,} "
             f"statement(s) of {n_reviews:,} review(s) -> {cfg.out}")
    if job.todo:
        _judge_streamed(cfg, model, job, statements, plan, reviews, progress)
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
    label = cfg.label or (Path(src.path).resolve().name if src.is_local else src.name)
    table = format_table2(label, summary)
    (out.root / QUALITY_OUTPUTS.report_md).write_text(
        f"# Extraction quality: {label}\n\nJudge: {model['judge']} ({model['backend']}), "
        f"{n_reviews} interaction(s) sampled with seed {cfg.seed}.\n\n{table}\n")
    write_json_atomic(out.root / QUALITY_OUTPUTS.report, {"label": label, "summary": summary,
                                                 "interactions": n_reviews})
    manifest = job.finish(summary=summary)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    manifest["table"] = table
    return manifest
