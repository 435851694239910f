"""LLM jobs over chunks of rows, each a resumable shard, streamed through Ray Data.

`rexeval judge likert|pairwise|detect` and `rexeval generate llm` share this runner. A
job gives a task function `fn(llm, rows, settings)` -> (tables, CallStats) that asks its
LLM through `llm.calls.ask` (the judges' tasks are in `pipelines/judge/tasks.py`, the
prompted generators' in `pipelines/generate/prompted/`). The function runs twice per
chunk, on workers, never calling a model itself:

1. with a `Recorder` for its LLM: it says which questions it asks (conversations, how
   to read and retry their answers);
2. the questions of every chunk go through one stream (`llm.stream.run_stream` with
   `llm.calls.AskSteps`): each question's conversation runs on its own, an unreadable
   answer asked again with the reason at once, against the engines of the job's backend
   (`llm.engines`: the judge Serve deployment, an OpenAI-compatible server, vLLM engines,
   or the job's own model actors with `judge_service: none`), started once per job;
3. with a `Replayer` over the chunk's settled questions: it turns the answers into the
   chunk's tables, which the worker commits as the chunk's shard, with a one-row `usage`
   table (calls, tokens, seconds, retries, unreadable answers), so a re-run skips
   finished chunks and the report's totals still count every call the results cost.

A call that failed in transport is retried and, if it keeps failing, leaves its chunk
unwritten: the job then raises `AwaitingRerun` after saving the rest, and a plain re-run
does the rest. The output folder may be a URI (`rexeval/storage.py`): the payload,
the shards and the report go there, and every worker reads the payload from there.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.io import ShardedOutput, write_json_atomic
from rexeval.pipelines.core.job_metrics import record_llm_usage
from rexeval.storage import PathLike, location
from rexeval.pipelines.core.sharded import ShardedJob, shard_line
from rexeval.pipelines.core.llm.calls_plan import CallPlan
from rexeval.pipelines.core.llm.job import ChunkedLLMSettings
from rexeval.pipelines.core.llm.placement import judge_service_for, place_llm

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


class JudgeService:
    """The judge a job uses (`serve.judge_client.JudgeService` set up from the job's settings):
    `address()` is what `build_llm` takes, `model_id` the served model's id."""

    def __init__(self, cfg: ChunkedLLMSettings, spec: dict, progress: Callable[[str], None]):
        from rexeval.models.llm.base import BackendSpec
        from rexeval.models.llm.cache import node_cache
        from rexeval.serve.judge import JudgeServeConfig
        from rexeval.serve.judge_client import JudgeService as Service

        service, note = judge_service_for(spec["backend"], cfg.judge_service)  # `llm.placement`
        if note:
            progress(note)
        explicit = service != "auto"
        backend = BackendSpec(backend=spec["backend"], model="auto" if explicit else spec["model"],
                              options=spec["options"])
        # The deployment (serve layer) opens only a local SQLite cache; in-process calls
        # (judge_service none) use the spec's cache, a URI included.
        serve_cfg = JudgeServeConfig(backend=backend, cache=node_cache(spec["cache"]),
                                     max_replicas=cfg.judge_replicas,
                                     num_gpus=cfg.judge_gpus)
        self.service = Service(serve_cfg, service=service, port=cfg.serve_port, progress=progress)
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


class ChunkQuestions:
    """`source_rows`' reader: the questions a chunk's task function asks (one row each, the
    question as JSON; a chunk that asks nothing gives one empty row, so it is still written)."""

    def __init__(self, fn: ChunkTask, payload: str, chunk: int, settings: dict, model_id: str, rows_hash: str):
        self.fn, self.payload, self.chunk, self.settings, self.model_id = fn, payload, chunk, settings, model_id
        self.rows_hash = rows_hash  # the payload's content

    def rows(self, shard: int) -> pd.DataFrame:
        """Chunk `shard` of the payload, and only it: the payload is written with one row
        group per chunk, so a worker reads its own rows, not the whole job's."""
        import pyarrow.parquet as pq

        with location(self.payload).open_input() as fh:
            f = pq.ParquetFile(fh)
            if shard >= f.num_row_groups:  # a job of no rows: its one chunk is empty
                return f.schema_arrow.empty_table().to_pandas()
            return f.read_row_group(shard).to_pandas()

    def __call__(self, shard: int) -> pa.Table:
        import json

        from rexeval.pipelines.core.llm.calls import Recorder

        recorder = Recorder(self.model_id)
        self.fn(recorder, self.rows(shard), self.settings)
        qs = [json.dumps(q) for q in recorder.questions.values()] or [None]
        return pa.table({"question": pa.array(qs, pa.string())})


class ChunkSteps:
    """The stream's steps for one question (`llm.calls.AskSteps`); an empty row settles at once."""

    def __init__(self):
        from rexeval.pipelines.core.llm.calls import AskSteps

        self.ask = AskSteps()

    def start(self, row: dict) -> dict:
        import json

        return self.ask.start(json.loads(row["question"])) if row.get("question") else {"done": True}

    def request(self, work: dict):
        return None if work.get("done") and "q" not in work else self.ask.request(work)

    def role(self, work: dict) -> str:
        return "llm"

    def advance(self, work: dict, result) -> dict:
        return self.ask.advance(work, result)


class ChunkWriter:
    """A chunk's settled questions -> its task function's tables, committed as its shard."""

    def __init__(self, task: str, questions: ChunkQuestions, output: ShardedOutput):
        self.task, self.questions, self.output = task, questions, output

    def __call__(self, shard: int, works: list[dict]) -> dict:
        from rexeval.pipelines.core.llm.calls import Replayer

        q = self.questions
        part = q.rows(shard)
        tables, stats = q.fn(Replayer(q.model_id, works), part, q.settings)
        record_llm_usage(f"llm:{self.task}", q.model_id, stats.usage)
        tables = {k: v if isinstance(v, pa.Table) else pa.Table.from_pandas(v, preserve_index=False)
                  for k, v in tables.items()}
        tables["usage"] = _stats_row(stats)
        counts = {"rows": len(part), "unparseable": int(stats.unparseable), "errors": int(stats.errors)}
        self.output.write_shard(shard, tables, counts)
        return counts


def chunk_plan(spec: dict, address: str, cfg: ChunkedLLMSettings) -> CallPlan:
    """Where a chunked job's calls go, as `llm.placement.place_llm` decides for every LLM
    stage: the judge deployment (serve:APP) or a judge app's URL when the job has one,
    else the spec's backend (vLLM engines, an OpenAI-compatible server, or the job's own
    model actors, which take the CPUs free now)."""
    where = place_llm(spec["backend"], spec.get("options"), cfg, job="chunks", address=address)
    return CallPlan.placed(where, spec["model"], spec.get("options"), spec.get("cache"))


def chunk_engines(spec: dict, address: str, cfg: ChunkedLLMSettings, progress: Callable[[str], None],
                  label: str = "llm"):
    """The engines of a job that calls `run_chunks` for several tasks with one spec (a
    context manager: `SharedEngines`): its model loads once, when the first task has work,
    placed then as `run_chunks` places its own."""
    from rexeval.pipelines.core.llm.engines import SharedEngines

    return SharedEngines(lambda: {"llm": chunk_plan(spec, address, cfg)}, progress, label)


def run_chunks(task: str, fn: ChunkTask, rows: pd.DataFrame, root: PathLike, tables: list[str], settings: dict,
               spec: dict | None, address: str, cfg: ChunkedLLMSettings,
               progress: Callable[[str], None], shared=None) -> ShardedOutput:
    """Run `fn` (named `task` in the output's config and progress) over `rows` in
    chunks, streamed (module docstring), resuming finished ones; returns the output.
    Raises `AwaitingRerun` when calls that failed in transport left chunks unwritten.
    `shared` (`chunk_engines`): the job's engines, for a job that runs several tasks."""
    from rexeval.pipelines.core.io import config_hash
    from rexeval.pipelines.core.llm.stream import awaiting_line, retry_settings, run_stream, source_rows
    from rexeval.pipelines.core.runtime import init_ray

    if not spec:
        raise ValueError(f"{task}: an LLM chunk job needs the LLM's spec (llm_spec)")
    root = location(root)
    root.mkdir()
    payload = root / "payload.parquet"
    rows_hash = config_hash({"rows": pd.util.hash_pandas_object(rows, index=False).tolist()})
    conf = {"task": task, "rows": rows_hash,
            "settings": settings, "model": spec.get("model"), "chunk": cfg.chunk_size}
    n = max(1, -(-len(rows) // cfg.chunk_size))
    job = ShardedJob(ShardedOutput(root, f"llm:{task}", conf, [*tables, "usage"]), n, overwrite=True,
                     progress=progress)
    # One row group per chunk: each worker reads its chunk alone (`ChunkQuestions.rows`).
    location(payload).write_parquet(pa.Table.from_pandas(rows, preserve_index=False), row_group_size=cfg.chunk_size)
    job.say_chunks(task, f"{len(rows)} rows")
    if job.todo:
        init_ray()
        plan = shared.plans["llm"] if shared is not None else chunk_plan(spec, address, cfg)
        questions = ChunkQuestions(fn, str(payload), cfg.chunk_size, settings, spec["model"], rows_hash)
        t0, k = time.time(), [0]

        def done(row: dict) -> None:
            if row["written"]:
                k[0] += 1
                progress(shard_line(f"{row['shard'] + 1}/{n}", k[0], len(job.todo), unit="chunk", label=task,
                                    elapsed=time.time() - t0, indent="    "))

        summary = run_stream(source_rows(questions, sorted(job.todo)), ChunkSteps, {"llm": plan},
                             ChunkWriter(task, questions, job.output), label=task, progress=progress,
                             on_shard=done, shared=shared, **retry_settings(plan.options))
        job.engines = summary.engines  # the manifest's llm_engines
        if summary.awaiting:
            progress("  " + awaiting_line(summary, "question(s)"))
            job.finish_partial(summary.awaiting, "question(s)")  # raises AwaitingRerun
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


