"""XRec's user and item profiles (Ma, Ren & Huang, EMNLP 2024), written by an LLM.

XRec's explainer reads a short text profile of the user and of the item beside the
collaborative signal; each is written once by an LLM from that user's (item's) training
reviews only, so no valid or test text leaks into what the explainer sees. This job writes
one profile per user and item of a `rexeval split` as a resumable sharded job through the
common LLM backends, greedily so the call cache makes a re-run free. A failed or empty
answer is an error row and a profile row without text: every user and item ends in
exactly one row.

The split and the output may be local folders or URIs (`pipelines/core/storage.py`).
The driver plans the shards from counts alone (how many distinct users and items the
training reviews have); each actor reads the training reviews from storage itself, once,
and works out the same sorted entities, so no table passes through the driver.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.models.llm.base import ChatRequest, LLMResult, SamplingParams
from rexeval.models.llm.pricing import Usage
from rexeval.pipelines.core.inputs import resolved_text
from rexeval.pipelines.core.io import ShardedOutput, parquet_schema, read_parquet, read_table, table_files
from rexeval.pipelines.core.job_metrics import record_llm_usage
from rexeval.pipelines.core.llm_cache import build_cached_backend
from rexeval.pipelines.core.llm_job import LLMJobSettings
from rexeval.pipelines.core.schema import TABLES, error_rows, validate_table
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus, worker_resources
from rexeval.pipelines.core.storage import PathLike, location

PROFILES = pa.schema([
    pa.field("kind", pa.string(), nullable=False),  # "user" | "item"
    pa.field("id", pa.string(), nullable=False),  # user_id / item_id
    pa.field("profile", pa.string()),  # None when it failed
    pa.field("reviews", pa.int32(), nullable=False),  # training reviews shown to the LLM
    pa.field("prompt", pa.string(), nullable=False),  # prompt name
    pa.field("prompt_version", pa.string(), nullable=False),
    pa.field("model", pa.string(), nullable=False),  # model id the backend reports
    pa.field("error", pa.string()),  # None when ok
])
JOB = "xrec-profiles"
PROMPTS = {"user": "xrec_user_profile", "item": "xrec_item_profile"}
SHARD_SIZE = 64  # users or items per shard
REVIEW_COLUMNS = ["review_id", "user_id", "item_id", "rating", "timestamp", "text", "item_title"]
COUNTS = ("users", "items", "ok", "errors", "truncated", "cached_calls", "prompt_tokens",
          "completion_tokens")


@dataclass(frozen=True)
class ProfileSettings:
    """What a shard needs: where the training reviews are, and how to ask."""

    max_tokens: int
    shard_size: int
    source: str  # the training reviews' folder (path or URI): read by the actors, named in error rows
    max_reviews: int = 8
    max_review_chars: int = 400
    limit: int | None = None

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.max_tokens)


# ------------------------------------------------------------------ requests


def profile_requests(train: pa.Table, max_reviews: int = 8, max_review_chars: int = 400,
                     limit: int | None = None) -> list[dict[str, Any]]:
    """One entity per distinct user (sorted), then per distinct item (sorted), each with
    its `max_reviews` most recent reviews (timestamp descending, review_id breaking
    ties), their texts cut to `max_review_chars` characters. `limit` keeps the first
    `limit` users and the first `limit` items."""
    order = train.sort_by([("timestamp", "descending"), ("review_id", "ascending")])
    cols = {c: (order.column(c).to_pylist() if c in order.column_names else [None] * order.num_rows)
            for c in ("user_id", "item_id", "rating", "text", "item_title")}
    shown: dict[str, dict[str, list[dict]]] = {"user": defaultdict(list), "item": defaultdict(list)}
    titles: dict[str, str] = {}
    for uid, iid, rating, text, title in zip(*cols.values()):
        title = title.strip() if isinstance(title, str) and title.strip() else None
        if title and iid not in titles:
            titles[iid] = title  # the most recent title the item's reviews carry
        review = {"text": text[:max_review_chars], "cut": len(text) > max_review_chars,
                  "rating": f"{float(rating):g}"}
        if len(u := shown["user"][uid]) < max_reviews:
            u.append({**review, "item_title": title})
        if len(i := shown["item"][iid]) < max_reviews:
            i.append(review)
    users = sorted(shown["user"])[:limit]
    items = sorted(shown["item"])[:limit]
    return ([{"kind": "user", "id": u, "reviews": shown["user"][u]} for u in users]
            + [{"kind": "item", "id": i, "item_title": titles.get(i), "reviews": shown["item"][i]}
               for i in items])


def read_ids(train: PathLike) -> pa.Table:
    """The user and item ids of the training reviews, each part checked against the
    reviews schema (what the driver plans the shards from; the actors read the rest)."""
    schema = pa.schema([TABLES["reviews"].field(c) for c in ("user_id", "item_id")])
    parts = []
    for f in table_files(train):
        cols = [c for c in schema.names if c in parquet_schema(f).names]
        parts.append(validate_table(read_parquet(f, columns=cols), schema, source=str(f), name="reviews"))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def entity_counts(ids: pa.Table, limit: int | None = None) -> tuple[int, int]:
    """(users, items) `profile_requests` makes of a table with the same user_id and
    item_id columns: its distinct ids, each side cut at `limit`."""
    n_users, n_items = (len(pc.unique(ids.column(c))) for c in ("user_id", "item_id"))
    return (n_users, n_items) if limit is None else (min(n_users, limit), min(n_items, limit))


def read_entities(settings: ProfileSettings) -> list[dict]:
    """Every entity of the job, from the training reviews in storage (see `profile_requests`)."""
    train = read_table(settings.source, "reviews", columns=REVIEW_COLUMNS)
    return profile_requests(train, settings.max_reviews, settings.max_review_chars, settings.limit)


def render(entity: dict, prompts: dict) -> list[dict[str, str]]:
    """The chat messages that ask for one entity's profile."""
    if entity["kind"] == "user":
        return prompts["user"].render(reviews=entity["reviews"])
    return prompts["item"].render(item_title=entity["item_title"], reviews=entity["reviews"])


def ask(entities: list[dict], llm, prompts: dict, settings: ProfileSettings) -> list[LLMResult]:
    """One greedy call per entity, in one `generate()` (the backend batches them)."""
    if not entities:
        return []
    sampling = settings.sampling()
    return llm.generate([ChatRequest(messages=render(e, prompts), sampling=sampling) for e in entities])


def shard_tables(entities: list[dict], results: list[LLMResult], model_id: str, prompts: dict,
                 source: str) -> tuple[pa.Table, pa.Table, dict[str, int]]:
    """(PROFILES rows, error rows, counts) of one shard's answers."""
    rows, errors = [], []
    counts = dict.fromkeys(COUNTS, 0)
    for e, res in zip(entities, results, strict=True):
        kind, prompt = e["kind"], prompts[e["kind"]]
        counts["users" if kind == "user" else "items"] += 1
        counts["cached_calls"] += int(res.cached)
        counts["prompt_tokens"] += res.prompt_tokens
        counts["completion_tokens"] += res.completion_tokens
        text = (res.text or "").strip() if res.ok else None
        error = None
        if not res.ok:
            error, etype = f"{kind} {e['id']}: the LLM call failed: {res.error}", "llm_error"
        elif not text:
            error, etype = f"{kind} {e['id']}: the LLM wrote an empty profile", "empty_profile"
        if error is None:
            counts["ok"] += 1
            counts["truncated"] += int(res.finish_reason == "length")
        else:
            counts["errors"] += 1
            errors.append({"source": source, "row_id": f"{kind}:{e['id']}", "field": "profile",
                           "error_type": etype, "message": error, "raw": res.text})
        rows.append({"kind": kind, "id": e["id"], "profile": text if error is None else None,
                     "reviews": len(e["reviews"]), "prompt": prompt.name,
                     "prompt_version": prompt.version, "model": model_id, "error": error})
    profiles = validate_table(pa.Table.from_pylist(rows, schema=PROFILES), PROFILES,
                              source=f"{JOB} shard", name="profiles")
    return profiles, error_rows(JOB, errors), counts


def shard_slice(entities: list[dict], shard: int, size: int) -> list[dict]:
    return entities[shard * size:(shard + 1) * size]


# ------------------------------------------------------------------ the job


class ProfileStage(Stage):
    """One shard of users or items per call: ask for their profiles, write the shard."""

    name = JOB
    batch_size = 1

    def __init__(self, llm: LLMJobSettings, models: dict, prompts: dict, output: ShardedOutput,
                 settings: ProfileSettings, resources: Resources):
        self.llm_cfg, self.models, self.prompts, self.output = llm, models, prompts, output
        self.settings, self.resources = settings, resources

    def setup(self) -> None:
        use_cpus(self.resources)
        self.entities = read_entities(self.settings)
        self.llm = build_cached_backend(self.models["backend"], self.models["llm"],
                                        self.llm_cfg.backend_options, self.llm_cfg.cache_path())

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            part = shard_slice(self.entities, shard, self.settings.shard_size)
            results = ask(part, self.llm, self.prompts, self.settings)
            record_llm_usage(self.name, self.llm.model_id, Usage().add_all(results))
            profiles, errors, counts = shard_tables(part, results, self.llm.model_id, self.prompts,
                                                    self.settings.source)
            self.output.write_shard(shard, {"profiles": profiles, "errors": errors}, counts)
            rows.append({"shard": shard, **counts})
        return pa.Table.from_pylist(rows)


def resolve_models(llm: LLMJobSettings) -> dict[str, str]:
    """The profile's `llm` role and backend, as the extract and judge jobs resolve them."""
    from rexeval.models.profiles import load_profile

    from rexeval.models.llm.base import check_model_here

    profile = load_profile(llm.profile, llm.models)
    models = {"backend": llm.backend or profile.llm_backend, "llm": profile.require("llm")}
    check_model_here(models["backend"], models["llm"])
    return models


def write_profiles(split: PathLike, out: PathLike, llm: LLMJobSettings, *,
                   max_reviews: int = 8, max_review_chars: int = 400, max_tokens: int = 128,
                   limit: int | None = None, overwrite: bool = False,
                   progress: Callable[[str], None] = print) -> dict:
    """Write (or resume) <out>/ : profiles/ (PROFILES shards), errors/, manifest.json;
    return the manifest."""
    from rexeval.prompts import load_prompt

    for name, value in (("max_reviews", max_reviews), ("max_review_chars", max_review_chars),
                        ("max_tokens", max_tokens), ("limit", limit)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    t0 = time.time()
    llm = llm.with_resolved_cache(out)  # a URI output keeps its calls beside it
    models = resolve_models(llm)
    split_text = resolved_text(split)
    train_dir = location(split_text) / "train"
    if not train_dir.is_dir():
        raise FileNotFoundError(f"{train_dir} not found: expected a `rexeval split` output folder")
    ids = read_ids(train_dir)
    n_users, n_items = entity_counts(ids, limit)
    prompts = {kind: load_prompt(name) for kind, name in PROMPTS.items()}
    settings = ProfileSettings(max_tokens=max_tokens, shard_size=SHARD_SIZE, source=str(train_dir),
                               max_reviews=max_reviews, max_review_chars=max_review_chars, limit=limit)
    prompt_versions = {p.name: p.version for p in prompts.values()}
    config = {"split": split_text, "prompts": prompt_versions, "model": models["llm"],
              "backend": models["backend"], "backend_options": llm.hashed_backend_options(),
              "max_reviews": max_reviews, "max_review_chars": max_review_chars,
              "max_tokens": max_tokens, "sampling": settings.sampling().model_dump(),
              "limit": limit, "shard_size": settings.shard_size}
    n_shards = max(1, -(-(n_users + n_items) // settings.shard_size))
    job = ShardedJob(ShardedOutput(out, JOB, config, ["profiles", "errors"]), n_shards,
                     overwrite=overwrite, progress=progress)
    if (manifest := job.finished(JOB)) is not None:
        return manifest
    progress(f"{JOB} ({models['backend']}: {models['llm']}): {n_users:,} user(s) and "
             f"{n_items:,} item(s) from {ids.num_rows:,} training review(s) "
             f"in {n_shards} shard(s) -> {out}")
    job.say_resumed()
    if job.todo:
        if models["backend"] == "vllm":
            _run_in_driver(llm, models, prompts, job, settings)
        else:
            _run_on_actors(llm, models, prompts, job, settings)
    manifest = job.finish(backend=models["backend"], model=models["llm"], prompts=prompt_versions)
    c = manifest["counts"]
    progress(f"{JOB}: {c.get('ok', 0):,} profile(s), {c.get('errors', 0):,} error(s) -> {out}")
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _shard_line(shard: int, k: int, n: int, c: dict) -> str:
    cached = f", {c['cached_calls']} cached" if c.get("cached_calls") else ""
    return (f"  shard {shard} done ({k}/{n}): {c['users']} user(s), {c['items']} item(s), "
            f"{c['ok']} profile(s), {c['errors']} error(s){cached}")


def _run_on_actors(llm, models, prompts, job: ShardedJob, settings) -> None:
    from rexeval.pipelines.core.runtime import init_ray

    init_ray()
    stage = ProfileStage(llm, models, prompts, job.output, settings, worker_resources(llm))
    job.run(stage, workers=llm.workers, report=lambda row, k, n: _shard_line(row["shard"], k, n, row))


def _run_in_driver(llm, models, prompts, job: ShardedJob, settings, group: int = 64) -> None:
    """vLLM: one `ray.data.llm` pass over up to `group` shards at a time (the engine then
    streams over many requests); the driver, which runs the engine, reads the entities
    and writes the shards."""
    entities = read_entities(settings)
    backend = build_cached_backend(models["backend"], models["llm"], llm.backend_options, llm.cache_path())
    try:
        done = 0
        for g in range(0, len(job.todo), group):
            shards = job.todo[g:g + group]
            parts = [shard_slice(entities, s, settings.shard_size) for s in shards]
            results = ask([e for p in parts for e in p], backend, prompts, settings)
            start = 0
            for s, part in zip(shards, parts):
                res, start = results[start:start + len(part)], start + len(part)
                profiles, errors, counts = shard_tables(part, res, backend.model_id, prompts, settings.source)
                job.output.write_shard(s, {"profiles": profiles, "errors": errors}, counts)
                done += 1
                job.progress(_shard_line(s, done, len(job.todo), counts))
    finally:
        backend.close()


def read_profiles(out: PathLike) -> dict[tuple[str, str], str]:
    """{(kind, id): profile text} of the successful rows of a write_profiles output."""
    table = read_table(location(out) / "profiles", PROFILES, columns=["kind", "id", "profile", "error"])
    return {(k, i): p for k, i, p, e in zip(*(table.column(c).to_pylist() for c in table.column_names))
            if p is not None and e is None}
