"""XRec's user and item profiles (Ma, Ren & Huang, EMNLP 2024), written by an LLM.

XRec's explainer reads a short text profile of the user and of the item beside the
collaborative signal; each is written once by an LLM from that user's (item's) training
reviews only, so no valid or test text leaks into what the explainer sees. This job writes
one profile per user and item of a `rexeval split` as a resumable sharded job through the
common LLM backends, greedily so the call cache makes a re-run free. A failed or empty
answer is an error row and a profile row without text: every user and item ends in
exactly one row.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from rexeval.models.llm.base import ChatRequest, LLMResult, SamplingParams
from rexeval.models.llm.cache import build_cached_backend
from rexeval.pipelines.core.io import ShardedOutput, read_table
from rexeval.pipelines.core.llm_job import LLMJobSettings
from rexeval.pipelines.core.schema import error_rows, validate_table
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus, worker_resources

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
    """What a shard needs besides its entities."""

    max_tokens: int
    shard_size: int
    source: str  # the training reviews' folder, named in error rows

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
                 entities_ref, settings: ProfileSettings, resources: Resources):
        self.llm_cfg, self.models, self.prompts, self.output = llm, models, prompts, output
        self.entities_ref, self.settings, self.resources = entities_ref, settings, resources

    def setup(self) -> None:
        import ray

        use_cpus(self.resources)
        self.entities = self.entities_ref if isinstance(self.entities_ref, list) else ray.get(self.entities_ref)
        self.llm = build_cached_backend(self.models["backend"], self.models["llm"],
                                        self.llm_cfg.backend_options, self.llm_cfg.cache_path())

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            part = shard_slice(self.entities, shard, self.settings.shard_size)
            results = ask(part, self.llm, self.prompts, self.settings)
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


def write_profiles(split: str | Path, out: str | Path, llm: LLMJobSettings, *,
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
    llm = llm.with_resolved_cache()
    models = resolve_models(llm)
    train_dir = Path(split).resolve() / "train"
    if not train_dir.is_dir():
        raise FileNotFoundError(f"{train_dir} not found: expected a `rexeval split` output folder")
    train = read_table(train_dir, "reviews", columns=REVIEW_COLUMNS)
    entities = profile_requests(train, max_reviews, max_review_chars, limit)
    prompts = {kind: load_prompt(name) for kind, name in PROMPTS.items()}
    settings = ProfileSettings(max_tokens=max_tokens, shard_size=SHARD_SIZE, source=str(train_dir))
    prompt_versions = {p.name: p.version for p in prompts.values()}
    config = {"split": str(train_dir.parent), "prompts": prompt_versions, "model": models["llm"],
              "backend": models["backend"], "backend_options": llm.hashed_backend_options(),
              "max_reviews": max_reviews, "max_review_chars": max_review_chars,
              "max_tokens": max_tokens, "sampling": settings.sampling().model_dump(),
              "limit": limit, "shard_size": settings.shard_size}
    n_shards = max(1, -(-len(entities) // settings.shard_size))
    job = ShardedJob(ShardedOutput(out, JOB, config, ["profiles", "errors"]), n_shards,
                     overwrite=overwrite, progress=progress)
    if (manifest := job.finished(JOB)) is not None:
        return manifest
    n_users = sum(e["kind"] == "user" for e in entities)
    progress(f"{JOB} ({models['backend']}: {models['llm']}): {n_users:,} user(s) and "
             f"{len(entities) - n_users:,} item(s) from {train.num_rows:,} training review(s) "
             f"in {n_shards} shard(s) -> {out}")
    job.say_resumed()
    if job.todo:
        if models["backend"] == "vllm":
            _run_in_driver(llm, models, prompts, job, entities, settings)
        else:
            _run_on_actors(llm, models, prompts, job, entities, settings)
    manifest = job.finish(backend=models["backend"], model=models["llm"], prompts=prompt_versions)
    c = manifest["counts"]
    progress(f"{JOB}: {c.get('ok', 0):,} profile(s), {c.get('errors', 0):,} error(s) -> {out}")
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _shard_line(shard: int, k: int, n: int, c: dict) -> str:
    cached = f", {c['cached_calls']} cached" if c.get("cached_calls") else ""
    return (f"  shard {shard} done ({k}/{n}): {c['users']} user(s), {c['items']} item(s), "
            f"{c['ok']} profile(s), {c['errors']} error(s){cached}")


def _run_on_actors(llm, models, prompts, job: ShardedJob, entities, settings) -> None:
    from rexeval.pipelines.core.runtime import init_ray

    ray = init_ray()
    stage = ProfileStage(llm, models, prompts, job.output, ray.put(entities), settings,
                         worker_resources(llm))
    job.run(stage, workers=llm.workers, report=lambda row, k, n: _shard_line(row["shard"], k, n, row))


def _run_in_driver(llm, models, prompts, job: ShardedJob, entities, settings, group: int = 64) -> None:
    """vLLM: one `ray.data.llm` pass over up to `group` shards at a time (the engine then
    streams over many requests); the driver writes the shards."""
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


def read_profiles(out: str | Path) -> dict[tuple[str, str], str]:
    """{(kind, id): profile text} of the successful rows of a write_profiles output."""
    table = read_table(Path(out) / "profiles", PROFILES, columns=["kind", "id", "profile", "error"])
    return {(k, i): p for k, i, p, e in zip(*(table.column(c).to_pylist() for c in table.column_names))
            if p is not None and e is None}
