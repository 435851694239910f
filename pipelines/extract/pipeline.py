"""The extract job: reviews streamed through the LLM with Ray Data into sharded statement tables.

Reviews are cut into shards of `shard_size` (the driver reads only the Parquet footers:
`pipelines.extract.rows`); workers read each shard's reviews, and every review flows
through `pipelines/core/llm/stream.py`: its prompt, the model (the job's engine group of
its backend, started once: `llm/engines.py`), the parse, a repair of an unreadable answer
(and STAR's verification) at once, within its own conversation, and finally its shard,
written by a worker with a done-marker as soon as its reviews have settled. A re-run skips finished shards, and the cache answers every
call already made, so a job killed half-way resumes and ends with the same files as an
uninterrupted run. Reviews whose calls failed in transport are never written as errors:
their shards wait for a re-run. Input and output may be URIs; with an output at a URI
and no cache given, the calls are cached under it (`models/llm/cache.py`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.extract.config import EXTRACT_OUTPUTS, ExtractConfig
from rexeval.pipelines.extract.extractor import ExtractSettings, Extractor, settle_works
from rexeval.pipelines.extract.rows import TableParts
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.job_metrics import record_llm_calls
from rexeval.models.llm.base import check_model_here
from rexeval.pipelines.core.llm.calls_plan import CallPlan, job_plan
from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.sharded import ShardedJob, shard_line
from rexeval.pipelines.core.inputs import resolved_text, reviews_input, reviews_path
from rexeval.storage import location

REVIEW_COLUMNS = ["review_id", "user_id", "item_id", "text", "category", "source", "line"]
COUNTERS = ("llm_calls", "cached_calls", "retries", "repaired_answers", "truncated_reviews",
            "topics_mapped", "item_errors", "prompt_tokens", "completion_tokens")


def resolve_models(cfg: ExtractConfig) -> dict[str, Any]:
    """Backend, model refs and embedder for this run, from the profile and overrides."""
    from rexeval.models.profiles import load_profile

    profile = load_profile(cfg.profile, cfg.models)
    backend = cfg.backend or profile.llm_backend
    llm = profile.require("llm")
    for model in {llm, cfg.verify_model or llm}:  # in the driver, before any actor loads it
        check_model_here(backend, model)
    return {"backend": backend, "llm": llm, "verify": cfg.verify_model or llm,
            "embedder": profile.ref("embedder") if cfg.method == "triplets" else None}


def output_config(cfg: ExtractConfig, models: dict[str, Any]) -> dict:
    """What decides the output: input, method, models, prompts' versions, decoding."""
    from rexeval.prompts import list_domains, load_domain, load_prompt

    src = location(reviews_path(cfg.input))
    names = ["extract_triplets"] if cfg.method == "triplets" else ["star_candidates", "star_verify"]
    prompts = {n: load_prompt(n).version for n in names + ["retry_feedback"]}
    if cfg.method == "triplets":
        prompts["domains"] = {d: load_prompt("extract_triplets").version_for(load_domain(d))
                              for d in list_domains()}
    opts = cfg.hashed_backend_options()
    return {"input": resolved_text(src), "method": cfg.method, "models": models,
            "backend_options": opts, "prompts": prompts, "domain": cfg.domain,
            "sampling": cfg.sampling().model_dump(), "max_retries": cfg.max_retries,
            "max_review_words": cfg.max_review_words, "constrained": cfg.constrained,
            "limit": cfg.limit, "shard_size": cfg.shard_size}


def review_parts(cfg: ExtractConfig) -> tuple[TableParts, int]:
    """The input's reviews parts (footers only) and how many reviews the job takes."""
    parts = TableParts.of(reviews_input(cfg.input), "reviews")  # refused when it holds no review
    total = parts.num_rows if cfg.limit is None else min(parts.num_rows, cfg.limit)
    return parts, total


def shard_reviews(parts: TableParts, total: int, shard: int, size: int) -> pa.Table:
    """The reviews of one shard, read from the input by whoever runs it."""
    return parts.read(shard * size, min((shard + 1) * size, total), REVIEW_COLUMNS)


def load_reviews(cfg: ExtractConfig) -> pa.Table:
    """Every review the job takes, in one table (for small inputs and tests)."""
    parts, total = review_parts(cfg)
    return parts.read(0, total, REVIEW_COLUMNS)


def shard_counts(reviews: int, statements: pa.Table, errors: pa.Table, method: str,
                 counters: dict[str, int] | None = None) -> dict[str, int]:
    """in = out + errors at review level: out = reviews with final-stage statements."""
    final = "triplet" if method == "triplets" else "verified"
    fin = statements.filter(pc.equal(statements.column("stage"), final))
    out = len(set(fin.column("review_id").to_pylist()))
    counts = {"in": reviews, "out": out, "errors": reviews - out,
              "statements": fin.num_rows, "error_rows": errors.num_rows}
    if method == "star":
        counts["candidates"] = statements.num_rows - fin.num_rows
    for k in COUNTERS:
        counts[k] = int((counters or {}).get(k, 0))
    return counts


def make_settings(cfg: ExtractConfig, models: dict[str, Any]) -> ExtractSettings:
    return ExtractSettings(method=cfg.method, domain=cfg.domain, sampling=cfg.sampling(),
                           max_retries=cfg.max_retries, max_review_words=cfg.max_review_words,
                           constrained=cfg.constrained, model=models["llm"],
                           backend=models["backend"],
                           verify_model=models["verify"] if models["verify"] != models["llm"] else None)


def make_topic_mapper(models: dict[str, Any]):
    if not models.get("embedder"):
        return None
    from rexeval.models.refs import resolve
    from rexeval.pipelines.extract.statements import TopicMapper, sentence_encoder

    return TopicMapper(sentence_encoder(resolve(models["embedder"]).location))


def call_plans(cfg: ExtractConfig, models: dict[str, Any]) -> dict[str, CallPlan]:
    """The model behind each role: "llm", and "verify" for STAR (`llm.calls_plan.job_plan`)."""
    plans = {"llm": job_plan(cfg, models["backend"], models["llm"])}
    plans["verify"] = (job_plan(cfg, models["backend"], models["verify"]) if models["verify"] != models["llm"]
                       else plans["llm"])
    return plans


def extract_steps(cfg: ExtractConfig, models: dict[str, Any]) -> Extractor:
    """The stream's per-review steps (built once per worker): the Extractor itself, whose
    start / request / role / advance are what `llm.stream.StreamSteps` asks for."""
    return Extractor(make_settings(cfg, models), None, None, make_topic_mapper(models))


class ShardReader:
    """A shard's reviews, read by the worker that starts it; an input row that breaks the
    schema comes back as the shard's input error (the job raises it once the rest is saved)."""

    def __init__(self, parts: TableParts, total: int, size: int):
        self.parts, self.total, self.size = parts, total, size

    def __call__(self, shard: int) -> pa.Table:
        from rexeval.pipelines.core.llm.stream import input_error_table

        try:
            return shard_reviews(self.parts, self.total, shard, self.size)
        except SchemaError as exc:
            return input_error_table(json.dumps(dataclasses.asdict(exc)))


class ShardWriter:
    """A shard's settled reviews -> its statements, error rows and counts, committed."""

    def __init__(self, method: str, output: ShardedOutput, model: str):
        self.method, self.output, self.model = method, output, model

    def __call__(self, shard: int, works: list[dict]) -> dict:
        statements, errors, counters = settle_works(works)
        counts = shard_counts(len(works), statements, errors, self.method, counters)
        record_llm_calls("extract", self.model, int(counters.get("llm_calls", 0)),
                         cache_hits=int(counters.get("cached_calls", 0)))
        self.output.write_shard(shard, {"statements": statements, "errors": errors}, counts)
        return counts


def run_extract(cfg: ExtractConfig, overwrite: bool = False,
                progress: Callable[[str], None] = print) -> dict:
    """Run extraction end to end (resuming finished shards) and return the manifest.
    Reviews whose calls failed in transport leave their shards unwritten: the manifest
    says how many (`awaiting_rerun`) and stays "running", so a re-run does them."""
    from rexeval.pipelines.core.llm.stream import awaiting_line, retry_settings, run_stream, source_rows

    t0 = time.time()
    cfg = cfg.with_resolved_cache(cfg.out)
    models = resolve_models(cfg)
    parts, total = review_parts(cfg)
    n_shards = max(1, -(-total // cfg.shard_size))
    job = ShardedJob(ShardedOutput(cfg.out, "extract", output_config(cfg, models), [EXTRACT_OUTPUTS.statements, EXTRACT_OUTPUTS.errors]),
                     n_shards, overwrite=overwrite, progress=progress)
    plans = call_plans(cfg, models)
    progress(f"extract ({cfg.method}, {models['backend']}: {models['llm']}, calls: {plans['llm'].kind}): "
             f"{total:,} review(s) in {n_shards} shard(s) -> {cfg.out}")
    job.say_resumed()
    if job.todo:
        done = [0]

        def on_shard(row: dict) -> None:
            if row["written"]:
                done[0] += 1
                progress(_shard_line(row["shard"], done[0], len(job.todo), row["counts"]))

        summary = run_stream(
            source_rows(ShardReader(parts, total, cfg.shard_size), job.todo),
            functools.partial(extract_steps, cfg, models), plans,
            ShardWriter(cfg.method, job.output, models["llm"]), label="extract", progress=progress,
            on_shard=on_shard, **retry_settings(cfg.backend_options))
        if summary.input_errors:
            raise SchemaError(**json.loads(summary.input_errors[0]))
        job.engines = summary.engines  # the manifest's llm_engines
        if summary.awaiting:
            progress("  " + awaiting_line(summary, "review(s)"))
            job.finish_partial(summary.awaiting, "review(s)")  # raises AwaitingRerun
    manifest = job.finish(method=cfg.method, models=models)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _shard_line(shard: int, n: int, total: int, c: dict) -> str:
    return shard_line(shard, n, total, f"reviews={c['in']} with statements={c['out']} errors={c['errors']} "
                      f"statements={c['statements']} llm calls={c['llm_calls']}", cached=c.get("cached_calls", 0))
