"""XRec's user and item profiles (Ma, Ren & Huang, EMNLP 2024), written by an LLM.

XRec's explainer reads a short text profile of the user and of the item beside the
collaborative signal; each is written once by an LLM from that user's (item's) training
reviews only, so no valid or test text leaks into what the explainer sees. This job writes
one profile per user and item of a `rexeval split` as a resumable sharded job through the
common LLM backends, greedily so the call cache makes a re-run free. A failed or empty
answer is an error row and a profile row without text: every user and item ends in
exactly one row.

The split and the output may be local folders or URIs (`rexeval/storage.py`).
The driver plans the shards from counts alone (how many distinct users and items the
training reviews have); each worker reads the training reviews from storage itself, once
per job, and works out the same sorted entities, so no table passes through the driver.
The calls go through the streaming LLM path (`pipelines/core/llm/stream.py`), like
extraction's: the backend's engines, transport failures left for a plain re-run.
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
from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.pipelines.core.schema import TABLES, error_rows, validate_table
from rexeval.pipelines.core.sharded import shard_line
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.storage import PathLike, location

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


class EntityReader:
    """`source_rows`' reader: one row per user or item of shard `k` (the entity as JSON).
    A worker process reads the training reviews once per job and keeps the entities."""

    def __init__(self, settings: ProfileSettings):
        self.settings = settings

    def __call__(self, shard: int) -> pa.Table:
        import json

        from rexeval.pipelines.core.llm.stream import kept

        entities = kept(("profiles", self.settings), lambda: read_entities(self.settings))
        part = shard_slice(entities, shard, self.settings.shard_size)
        return pa.table({"entity": pa.array([json.dumps(e) for e in part], pa.string())})


class ProfileSteps:
    """One entity's profile as stream steps (`llm.stream.StreamSteps`): one greedy call."""

    def __init__(self, prompts: dict, settings: ProfileSettings):
        self.prompts, self.sampling = prompts, settings.sampling()

    def start(self, row: dict) -> dict:
        import json

        return {"entity": json.loads(row["entity"]), "result": None}

    def request(self, work: dict):
        if work["result"] is not None:
            return None
        return ChatRequest(messages=render(work["entity"], self.prompts), sampling=self.sampling)

    def role(self, work: dict) -> str:
        return "llm"

    def advance(self, work: dict, res: LLMResult) -> dict:
        return {**work, "result": res.model_dump()}


class ProfileWriter:
    """A shard's answered entities -> its profile and error rows, committed."""

    def __init__(self, output: ShardedOutput, model_id: str, prompts: dict, source: str):
        self.output, self.model_id, self.prompts, self.source = output, model_id, prompts, source

    def __call__(self, shard: int, works: list[dict]) -> dict:
        entities = [w["entity"] for w in works]
        results = [LLMResult.model_validate(w["result"]) for w in works]
        record_llm_usage(JOB, self.model_id, Usage().add_all(results))
        profiles, errors, counts = shard_tables(entities, results, self.model_id, self.prompts, self.source)
        self.output.write_shard(shard, {"profiles": profiles, "errors": errors}, counts)
        return counts


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
        _run_streamed(llm, models, prompts, job, settings)
    manifest = job.finish(backend=models["backend"], model=models["llm"], prompts=prompt_versions)
    c = manifest["counts"]
    progress(f"{JOB}: {c.get('ok', 0):,} profile(s), {c.get('errors', 0):,} error(s) -> {out}")
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _shard_line(shard: int, k: int, n: int, c: dict) -> str:
    return shard_line(shard, k, n, f"{c['users']} user(s), {c['items']} item(s), {c['ok']} profile(s), "
                      f"{c['errors']} error(s)", cached=c.get("cached_calls", 0))


def _run_streamed(llm, models, prompts, job: ShardedJob, settings) -> None:
    """The shards still to do through the streaming LLM path (`core.llm.stream`): workers
    read the entities, the backend's engines answer (`llm.calls_plan.job_plan`),
    workers write the shards; raises AwaitingRerun when transport failures left some."""
    import functools

    from rexeval.pipelines.core.llm.stream import awaiting_line, retry_settings, run_stream, source_rows
    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.core.llm.calls_plan import job_plan

    init_ray()
    done = [0]

    def on_shard(row: dict) -> None:
        if row["written"]:
            done[0] += 1
            job.progress(_shard_line(row["shard"], done[0], len(job.todo), row["counts"]))

    summary = run_stream(source_rows(EntityReader(settings), job.todo),
                         functools.partial(ProfileSteps, prompts, settings),
                         {"llm": job_plan(llm, models["backend"], models["llm"])},
                         ProfileWriter(job.output, models["llm"], prompts, settings.source), label=JOB,
                         progress=job.progress, on_shard=on_shard,
                         **retry_settings(llm.backend_options))
    job.engines = summary.engines  # the manifest's llm_engines
    if summary.awaiting:
        job.progress("  " + awaiting_line(summary, "profile(s)"))
        job.finish_partial(summary.awaiting, "profile(s)")  # raises AwaitingRerun


def read_profiles(out: PathLike) -> dict[tuple[str, str], str]:
    """{(kind, id): profile text} of the successful rows of a write_profiles output."""
    table = read_table(location(out) / "profiles", PROFILES, columns=["kind", "id", "profile", "error"])
    return {(k, i): p for k, i, p, e in zip(*(table.column(c).to_pylist() for c in table.column_names))
            if p is not None and e is None}
