"""The extract job: reviews streamed through LLM actor pools into sharded statement tables.

Reviews are cut into shards of `shard_size`; each shard is one task for an actor that
holds the LLM (loaded once) behind the call cache, runs `pipelines.extract.extractor.Extractor`
and writes its statements and errors with a done-marker. A re-run skips finished
shards, and the cache answers every call already made, so a job killed half-way
resumes where it stopped and ends with the same files as an uninterrupted run.

The `vllm` backend runs differently: each round of calls is one `ray.data.llm` pass on
the GPUs over many shards at once (an engine per actor lives for the whole pass), and
the driver writes the shards.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.pipelines.extract.extractor import ExtractSettings, Extractor
from rexeval.pipelines.core.io import ShardedOutput, read_table
from rexeval.models.llm.base import check_model_here
from rexeval.models.llm.cache import build_cached_backend
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.inputs import reviews_path
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus, worker_resources

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

    src = reviews_path(cfg.input)
    names = ["extract_triplets"] if cfg.method == "triplets" else ["star_candidates", "star_verify"]
    prompts = {n: load_prompt(n).version for n in names + ["retry_feedback"]}
    if cfg.method == "triplets":
        prompts["domains"] = {d: load_prompt("extract_triplets").version_for(load_domain(d))
                              for d in list_domains()}
    opts = cfg.hashed_backend_options()
    return {"input": str(src.resolve()), "method": cfg.method, "models": models,
            "backend_options": opts, "prompts": prompts, "domain": cfg.domain,
            "sampling": cfg.sampling().model_dump(), "max_retries": cfg.max_retries,
            "max_review_words": cfg.max_review_words, "constrained": cfg.constrained,
            "limit": cfg.limit, "shard_size": cfg.shard_size}


def load_reviews(cfg: ExtractConfig) -> pa.Table:
    src = reviews_path(cfg.input)
    reviews = read_table(src, "reviews")
    cols = [c for c in REVIEW_COLUMNS if c in reviews.column_names]
    reviews = reviews.select(cols)
    if cfg.limit is not None:
        reviews = reviews.slice(0, cfg.limit)
    return reviews


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


class ExtractStage(Stage):
    """One shard per call: extract its reviews' statements and write the shard."""

    name = "extract"
    batch_size = 1

    def __init__(self, cfg: ExtractConfig, models: dict, output: ShardedOutput, reviews_ref,
                 resources: Resources):
        self.cfg, self.models, self.output, self.reviews_ref = cfg, models, output, reviews_ref
        self.resources = resources
        self.extractor = None

    def setup(self) -> None:
        import ray

        use_cpus(self.resources)
        self.reviews = ray.get(self.reviews_ref) if not isinstance(self.reviews_ref, pa.Table) \
            else self.reviews_ref
        generate, verify, self.close = make_generators(self.cfg, self.models)
        self.extractor = Extractor(make_settings(self.cfg, self.models), generate, verify,
                                   make_topic_mapper(self.models))

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            part = self.reviews.slice(shard * self.cfg.shard_size, self.cfg.shard_size)
            statements, errors, counters = self.extractor.run(part)
            counts = shard_counts(part, statements, errors, self.cfg.method, counters)
            self.output.write_shard(shard, {"statements": statements, "errors": errors}, counts)
            rows.append({"shard": shard, **counts})
        return pa.Table.from_pylist(rows)


def run_extract(cfg: ExtractConfig, overwrite: bool = False,
                progress: Callable[[str], None] = print) -> dict:
    """Run extraction end to end (resuming finished shards) and return the manifest."""
    t0 = time.time()
    cfg = cfg.with_resolved_cache()
    models = resolve_models(cfg)
    reviews = load_reviews(cfg)
    n_shards = max(1, -(-reviews.num_rows // cfg.shard_size))
    job = ShardedJob(ShardedOutput(cfg.out, "extract", output_config(cfg, models), ["statements", "errors"]),
                     n_shards, overwrite=overwrite, progress=progress)
    progress(f"extract ({cfg.method}, {models['backend']}: {models['llm']}): "
             f"{reviews.num_rows:,} review(s) in {n_shards} shard(s) -> {cfg.out}")
    job.say_resumed()
    if job.todo:
        if models["backend"] == "vllm":
            _run_in_driver(cfg, models, job.output, reviews, job.todo, progress)
        else:
            _run_on_actors(cfg, models, job, reviews)
    manifest = job.finish(method=cfg.method, models=models)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _shard_line(shard: int, n: int, total: int, c: dict) -> str:
    cached = f", {c['cached_calls']} cached" if c.get("cached_calls") else ""
    return (f"  shard {shard} done ({n}/{total}): reviews={c['in']} with statements={c['out']} "
            f"errors={c['errors']} statements={c['statements']} llm calls={c['llm_calls']}{cached}")


def _run_on_actors(cfg, models, job: ShardedJob, reviews) -> None:
    import ray

    stage = ExtractStage(cfg, models, job.output, ray.put(reviews), worker_resources(cfg))
    job.run(stage, workers=cfg.workers, report=lambda row, k, n: _shard_line(row["shard"], k, n, row))


def _run_in_driver(cfg, models, out, reviews, todo, progress, group: int = 64) -> None:
    """vLLM: one Extractor pass over up to `group` shards, so each round of calls is one
    large ray.data.llm pass; the driver then writes the shards of the group."""
    generate, verify, close = make_generators(cfg, models)
    extractor = Extractor(make_settings(cfg, models), generate, verify, make_topic_mapper(models))
    try:
        n = 0
        for g in range(0, len(todo), group):
            shards = todo[g:g + group]
            parts = {s: reviews.slice(s * cfg.shard_size, cfg.shard_size) for s in shards}
            statements, errors, counters = extractor.run(pa.concat_tables(parts.values()))
            for k, s in enumerate(shards):
                ids = parts[s].column("review_id")
                st = statements.filter(pc.is_in(statements.column("review_id"), value_set=ids))
                er = errors.filter(pc.is_in(errors.column("row_id"), value_set=ids))
                # The group's call counters are recorded once, on its first shard.
                counts = shard_counts(parts[s], st, er, cfg.method, counters if k == 0 else None)
                out.write_shard(s, {"statements": st, "errors": er}, counts)
                n += 1
                progress(_shard_line(s, n, len(todo), counts))
    finally:
        close()
