"""The extract job: reviews streamed through LLM actor pools into sharded statement tables.

Reviews are cut into shards of `shard_size`; each shard is one task for an actor that
holds the LLM (loaded once) behind the call cache, reads its own reviews from the input
(the driver reads only the Parquet footers: `pipelines.extract.rows`), runs
`pipelines.extract.extractor.Extractor` and writes its statements and errors with a
done-marker. A re-run skips finished shards, and the cache answers every call already
made, so a job killed half-way resumes where it stopped and ends with the same files as
an uninterrupted run. Input and output may be URIs; with an output at a URI and no
cache given, the calls are cached under it (`pipelines/core/llm_cache.py`), so a re-run
from any node makes none for finished work.

The `vllm` backend runs differently: each round of calls is one `ray.data.llm` pass on
the GPUs over many shards at once (an engine per actor lives for the whole pass), and
the driver writes the shards.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.pipelines.extract.extractor import ExtractSettings, Extractor
from rexeval.pipelines.extract.rows import TableParts
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.job_metrics import record_llm_calls
from rexeval.models.llm.base import check_model_here
from rexeval.pipelines.core.llm_cache import build_cached_backend
from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.inputs import resolved_text, reviews_path
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus, worker_resources
from rexeval.pipelines.core.storage import location

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
    parts = TableParts.of(location(reviews_path(cfg.input)), "reviews")
    total = parts.num_rows if cfg.limit is None else min(parts.num_rows, cfg.limit)
    return parts, total


def shard_reviews(parts: TableParts, total: int, shard: int, size: int) -> pa.Table:
    """The reviews of one shard, read from the input by whoever runs it."""
    return parts.read(shard * size, min((shard + 1) * size, total), REVIEW_COLUMNS)


def load_reviews(cfg: ExtractConfig) -> pa.Table:
    """Every review the job takes, in one table (for small inputs and tests)."""
    parts, total = review_parts(cfg)
    return parts.read(0, total, REVIEW_COLUMNS)


def shard_counts(reviews: pa.Table, statements: pa.Table, errors: pa.Table, method: str,
                 counters: dict[str, int] | None = None) -> dict[str, int]:
    """in = out + errors at review level: out = reviews with final-stage statements."""
    final = "triplet" if method == "triplets" else "verified"
    fin = statements.filter(pc.equal(statements.column("stage"), final))
    out = len(set(fin.column("review_id").to_pylist()))
    counts = {"in": reviews.num_rows, "out": out, "errors": reviews.num_rows - out,
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


def make_generators(cfg: ExtractConfig, models: dict[str, Any]):
    """(generate, verify_generate, close) for this process, behind the call cache."""
    main = build_cached_backend(models["backend"], models["llm"], cfg.backend_options, cfg.cache_path())
    verify = main
    if cfg.method == "star" and models["verify"] != models["llm"]:
        verify = build_cached_backend(models["backend"], models["verify"], cfg.backend_options,
                              cfg.cache_path())

    def close():
        for b in {id(main): main, id(verify): verify}.values():
            b.close()

    return main.generate, verify.generate, close


def make_topic_mapper(models: dict[str, Any]):
    if not models.get("embedder"):
        return None
    from rexeval.models.refs import resolve
    from rexeval.pipelines.extract.statements import TopicMapper, sentence_encoder

    return TopicMapper(sentence_encoder(resolve(models["embedder"]).location))


def result_schema(method: str) -> pa.Schema:
    """The row a shard sends back: its counts, or the input's SchemaError (as JSON)."""
    keys = ["in", "out", "errors", "statements", "error_rows", *(["candidates"] if method == "star" else []),
            *COUNTERS]
    return pa.schema([("shard", pa.int64()), *[(k, pa.int64()) for k in keys], ("schema_error", pa.string())])


class ExtractStage(Stage):
    """One shard per call: read its reviews, extract their statements, write the shard."""

    name = "extract"
    batch_size = 1

    def __init__(self, cfg: ExtractConfig, models: dict, output: ShardedOutput, parts: TableParts,
                 total: int, resources: Resources):
        self.cfg, self.models, self.output, self.parts, self.total = cfg, models, output, parts, total
        self.resources = resources
        self.extractor = None

    def setup(self) -> None:
        use_cpus(self.resources)
        generate, verify, self.close = make_generators(self.cfg, self.models)
        self.extractor = Extractor(make_settings(self.cfg, self.models), generate, verify,
                                   make_topic_mapper(self.models))

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            try:
                part = shard_reviews(self.parts, self.total, shard, self.cfg.shard_size)
            except SchemaError as exc:
                # Sent back as data: the driver raises the same SchemaError, not a Ray
                # wrapper around a worker traceback.
                rows.append({"shard": shard, "schema_error": json.dumps(dataclasses.asdict(exc))})
                continue
            statements, errors, counters = self.extractor.run(part)
            counts = shard_counts(part, statements, errors, self.cfg.method, counters)
            record_llm_calls("extract", self.models.get("llm") if isinstance(self.models, dict) else None,
                             int(counters.get("llm_calls", 0)), cache_hits=int(counters.get("cached_calls", 0)))
            self.output.write_shard(shard, {"statements": statements, "errors": errors}, counts)
            rows.append({"shard": shard, **counts})
        return pa.Table.from_pylist(rows, schema=result_schema(self.cfg.method))


def run_extract(cfg: ExtractConfig, overwrite: bool = False,
                progress: Callable[[str], None] = print) -> dict:
    """Run extraction end to end (resuming finished shards) and return the manifest."""
    t0 = time.time()
    cfg = cfg.with_resolved_cache(cfg.out)
    models = resolve_models(cfg)
    parts, total = review_parts(cfg)
    n_shards = max(1, -(-total // cfg.shard_size))
    job = ShardedJob(ShardedOutput(cfg.out, "extract", output_config(cfg, models), ["statements", "errors"]),
                     n_shards, overwrite=overwrite, progress=progress)
    progress(f"extract ({cfg.method}, {models['backend']}: {models['llm']}): "
             f"{total:,} review(s) in {n_shards} shard(s) -> {cfg.out}")
    job.say_resumed()
    if job.todo:
        if models["backend"] == "vllm":
            _run_in_driver(cfg, models, job.output, parts, total, job.todo, progress)
        else:
            _run_on_actors(cfg, models, job, parts, total)
    manifest = job.finish(method=cfg.method, models=models)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _shard_line(shard: int, n: int, total: int, c: dict) -> str:
    cached = f", {c['cached_calls']} cached" if c.get("cached_calls") else ""
    return (f"  shard {shard} done ({n}/{total}): reviews={c['in']} with statements={c['out']} "
            f"errors={c['errors']} statements={c['statements']} llm calls={c['llm_calls']}{cached}")


def _run_on_actors(cfg, models, job: ShardedJob, parts: TableParts, total: int) -> None:
    """Each actor reads its shards' reviews itself; an input row that breaks the schema
    fails the job with that SchemaError once the other shards are saved."""
    failures: list[SchemaError] = []

    def report(row: dict, k: int, n: int) -> str:
        if row.get("schema_error"):
            failures.append(SchemaError(**json.loads(row["schema_error"])))
            return f"  shard {row['shard']} failed ({k}/{n}): {failures[-1]}"
        return _shard_line(row["shard"], k, n, row)

    stage = ExtractStage(cfg, models, job.output, parts, total, worker_resources(cfg))
    job.run(stage, workers=cfg.workers, report=report)
    if failures:
        raise failures[0]


def _run_in_driver(cfg, models, out, parts: TableParts, total: int, todo, progress, group: int = 64) -> None:
    """vLLM: one Extractor pass over up to `group` shards, so each round of calls is one
    large ray.data.llm pass; the driver then writes the shards of the group (it reads
    only the group's reviews)."""
    generate, verify, close = make_generators(cfg, models)
    extractor = Extractor(make_settings(cfg, models), generate, verify, make_topic_mapper(models))
    try:
        n = 0
        for g in range(0, len(todo), group):
            shards = todo[g:g + group]
            reviews = {s: shard_reviews(parts, total, s, cfg.shard_size) for s in shards}
            statements, errors, counters = extractor.run(pa.concat_tables(reviews.values()))
            for k, s in enumerate(shards):
                ids = reviews[s].column("review_id")
                st = statements.filter(pc.is_in(statements.column("review_id"), value_set=ids))
                er = errors.filter(pc.is_in(errors.column("row_id"), value_set=ids))
                # The group's call counters are recorded once, on its first shard.
                counts = shard_counts(reviews[s], st, er, cfg.method, counters if k == 0 else None)
                out.write_shard(s, {"statements": st, "errors": er}, counts)
                n += 1
                progress(_shard_line(s, n, len(todo), counts))
    finally:
        close()
