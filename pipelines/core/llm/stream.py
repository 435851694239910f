"""LLM work as one stream per job: shards read, conversed and written by workers, with
the job's engines started once and transport failures left for a re-run.

A job gives three things:
- `source`: `source_rows(read, shards)`, where `read(shard)` gives that shard's input rows
  (a worker reads its own slice: Parquet parts, a row group of the payload);
- `steps`: picklable per-row logic (`StreamSteps`): `start(row)` -> work, `request(work)`
  -> the `ChatRequest` it sends next or None once settled, `role(work)` -> which model
  answers it, `advance(work, result)` -> the next work. Work is a plain JSON dict.
- `write(shard, works)`: commits one shard from its settled works (on a worker).

The pipeline (`run_stream`) is one Ray Data dataset of shard numbers mapped by a pool of
conversation workers (`ShardConversations`, async actors, `shards_in_flight` shards each
at a time). A worker reads a shard, starts every row, and each row's conversation runs
on its own (ask -> parse -> repair or verify -> next question, as the steps say) against
the job's engine groups (`llm/engines.py`: started once per job, whatever the turns), its
requests merged with every other conversation's into the engine's batches. As soon as a
shard's rows are all settled the worker writes it and takes the next shard. There is no
barrier between turns, and nothing holds a job's rows in the object store: the driver
gets one small row per shard.

Errors that heal: a result marked `transient` (connection, 5xx, timeout, a dead replica
or actor, a failed call) is never given to `advance`. The row asks again after a backoff
(doubled each time), `transport_retries` times; a row still failing is left unsettled and
its shard is not written, so a plain re-run of the same command does it (the call cache
answers what was done). A shard whose worker failed outright (its block errored: counted
on this dataset's own context, never the global one) is left the same way.
`StreamSummary.awaiting` counts the rows, `engines` what each model's engines did.
"""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from rexeval.models.llm.base import LLMResult
from rexeval.pipelines.core.llm.calls_plan import CallPlan
from rexeval.pipelines.core.stage import Resources

INPUT_ERROR = "__input_error__"
"""A source row holding only this column (text) stands for a shard whose input could
not be read (a schema error): the shard is not written and the job reports it."""
WRITTEN = pa.schema([("shard", pa.int64()), ("written", pa.bool_()), ("left", pa.int64()),
                     ("counts", pa.string()), (INPUT_ERROR, pa.string()), ("calls", pa.string()),
                     ("failed", pa.string())])
MAX_TURNS = 64  # a row's calls at most (each steps' own rules bound them far lower)


class StreamSteps(Protocol):
    def start(self, row: dict) -> dict: ...
    def request(self, work: dict): ...
    def role(self, work: dict) -> str: ...
    def advance(self, work: dict, result: LLMResult) -> dict: ...


@dataclass
class StreamSummary:
    """What a streamed job did: shards written, rows left for a re-run, and per model
    (`engines`) how often its engines were started and how many calls, turns, transport
    retries and cache hits they served."""

    shards: list[dict] = field(default_factory=list)
    awaiting: int = 0  # rows whose calls failed in transport: a re-run does them
    awaiting_shards: list[int] = field(default_factory=list)
    input_errors: list[str] = field(default_factory=list)  # one per shard that could not be read
    engines: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0


_KEPT: dict[Any, Any] = {}  # a worker process's job input (`kept`)
_KEPT_LOCK = threading.Lock()


def kept(key: Any, load: Callable[[], Any]) -> Any:
    """`load()` once per worker process for `key` (the last key only): a job's shards are
    read on reused worker processes, so a table every shard slices (the examples) is read
    once per process, not once per shard. The key must change when the content may (a
    hash of it, the job's settings)."""
    with _KEPT_LOCK:
        if key not in _KEPT:
            _KEPT.clear()
            _KEPT[key] = load()
        return _KEPT[key]


@dataclass(frozen=True)
class Source:
    """A job's input: `read(shard)` for each of `shards`, run by the conversation workers."""

    read: Callable[[int], pa.Table]
    shards: list[int]
    resources: Resources = Resources(cpus=0)


def source_rows(read: Callable[[int], pa.Table], shards, resources: Resources = Resources(cpus=0)) -> Source:
    """The job's shards, each read by the worker that converses it with `read(shard)`."""
    return Source(read, sorted(shards), resources)


# -- the conversation worker --------------------------------------------------------------


def _new_counts() -> dict[str, int]:
    return {"calls": 0, "turns": 0, "retries": 0, "cached": 0, "left": 0}


class ShardConversations:
    """A conversation worker (a Ray Data async actor): each call is one shard, read,
    conversed row by row against the engines, and written when every row has settled.
    Several shards run at once; their requests share the engines' batches."""

    def __init__(self, read, factory, write, clients: dict[str, dict], transport_retries: int, backoff_s: float):
        from rexeval.pipelines.core.llm.engines import EngineClient

        self.read, self.write = read, write
        self.steps = factory()
        by_spec: dict[str, EngineClient] = {}
        # One client per engine group in this worker (roles of one model share it).
        self.clients = {role: by_spec.setdefault(json.dumps(spec, sort_keys=True, default=repr), EngineClient(spec))
                        for role, spec in clients.items()}
        self.transport_retries, self.backoff_s = transport_retries, backoff_s
        self.started = 0  # shards begun in this worker: their order is their calls' priority

    async def _converse(self, work: dict, stats: dict[str, dict], order: int) -> tuple[dict, bool]:
        """One row to the end: (its settled work, left for a re-run?). `order` is its
        shard's place in this worker: earlier shards' calls go first."""
        tries = 0
        for _ in range(MAX_TURNS):
            req = self.steps.request(work)
            if req is None:
                return work, False
            role = self.steps.role(work)
            got = stats.setdefault(role, _new_counts())
            got["calls"] += 1
            res = await self.clients[role].ask(req, order)
            if res.transient:
                tries += 1
                if tries > self.transport_retries:
                    got["left"] += 1
                    return work, True
                got["retries"] += 1
                await asyncio.sleep(min(30.0, self.backoff_s * 2 ** (tries - 1)) * random.uniform(0.5, 1.0))
                continue
            tries = 0
            got["turns"] += 1
            got["cached"] += int(res.cached)
            work = self.steps.advance(work, res)
        return work, True  # never expected: the steps bound their own calls

    async def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_pylist([await self._shard(int(s)) for s in batch.column("shard").to_pylist()],
                                    schema=WRITTEN)

    async def _shard(self, shard: int) -> dict:
        row = {"shard": shard, "written": False, "left": 0, "counts": "{}", INPUT_ERROR: None, "calls": "{}",
               "failed": None}
        try:
            return await self._conversed(shard, row)
        except Exception as exc:  # noqa: BLE001  (our code or the job's failed: the driver raises it)
            import traceback

            from rexeval.failures import reason_of

            traceback.print_exc()
            return {**row, "failed": reason_of(exc)}

    async def _conversed(self, shard: int, row: dict) -> dict:
        table = await asyncio.to_thread(self.read, shard)
        if INPUT_ERROR in table.column_names:
            return {**row, INPUT_ERROR: table.column(INPUT_ERROR)[0].as_py()}
        stats: dict[str, dict] = {}
        rows = [json_safe(r) for r in table.to_pylist()]
        self.started += 1
        order = self.started
        done = await asyncio.gather(*(self._converse(self.steps.start(r), stats, order) for r in rows))
        left = sum(1 for _, was_left in done if was_left)
        row.update(left=left, calls=json.dumps(stats))
        if left:
            return row
        counts = await asyncio.to_thread(self.write, shard, [w for w, _ in done])
        return {**row, "written": True, "counts": json.dumps(counts)}


# -- the driver ---------------------------------------------------------------------------


def stream_width(plans: dict[str, CallPlan], shards: int) -> tuple[int, int]:
    """(conversation workers, shards in flight on each): backend options
    `stream_workers` and `shards_in_flight` when given; else one worker per 8 engine
    replicas (one async worker drives thousands of calls a second) and 16 shards each."""
    opts: dict[str, Any] = {}
    for p in plans.values():
        opts.update(p.options)
    per = max(1, int(opts.get("shards_in_flight", 16)))
    engines = sum(p.concurrency[-1] for p in {id(p): p for p in plans.values()}.values())
    workers = int(opts.get("stream_workers", 1 + engines // 8))
    return max(1, min(workers, -(-shards // per))), per


def run_stream(source: Source, factory: Callable[[], StreamSteps], plans: dict[str, CallPlan],
               write: Callable[[int, list[dict]], dict], *, label: str = "llm",
               progress: Callable[[str], None] = print, transport_retries: int = 3, backoff_s: float = 1.0,
               on_shard: Callable[[dict], None] | None = None,
               steps_resources: Resources = Resources(cpus=0), shared=None) -> StreamSummary:
    """Run the job (see the module docstring); returns its summary. The conversation
    workers take no CPU of their own by default: they mostly wait on the engines, and a
    local job's model actors hold the CPUs it has. With `shared` (`llm.engines.SharedEngines`
    of these `plans`), the engines are the job's, opened once for all its streams and
    left running for the next."""
    from rexeval.pipelines.core.llm.engines import open_engines

    summary = StreamSummary()
    t0 = time.time()
    groups = shared.open() if shared is not None else open_engines(plans, progress, label)
    try:
        _say_placements(plans, groups, label, progress)
        _run(source, factory, plans, groups, write, summary, progress, label, transport_retries, backoff_s,
             on_shard, max(source.resources.cpus, steps_resources.cpus))
    finally:
        for g in groups.values():
            if shared is None:
                g.stop()
            else:
                g.counted = g.starts
    summary.seconds = round(time.time() - t0, 3)
    for model, entry in summary.engines.items():
        progress(f"    {label} {model}: {engines_line(entry)}")
    return summary


def engines_line(entry: dict) -> str:
    """What one model's engines did in a job, for its last progress line."""
    if entry.get("engines_reused"):
        started = f"the job's engines, already started ({entry['replicas']} replica(s))"
    elif not entry["engine_starts"]:
        started = "a standing service (started by no one in this job)"
    else:
        started = f"its engines started {entry['engine_starts']}x ({entry['replicas']} replica(s))"
    retries = entry["retries"]
    return (f"{entry['calls']} call(s) for {entry['turns']} answer(s), {retries} transport "
            f"retr{'y' if retries == 1 else 'ies'}, {entry['cached']} from the cache; {started}")


def _say_placements(plans: dict[str, CallPlan], groups: dict, label: str, progress: Callable[[str], None]) -> None:
    """One line per model: where its calls go (`llm.placement.place_llm` decided)."""
    roles: dict[int, tuple[CallPlan, list[str]]] = {}
    for role, plan in plans.items():
        roles.setdefault(id(plan), (plan, []))[1].append(role)
    for plan, names in roles.values():
        g = groups[id(plan)]
        progress(f"    {label} {'/'.join(names)}: {plan.describe(len(g.hosts) if g.hosts else None)}")


def _run(source, factory, plans, groups, write, summary, progress, label, transport_retries, backoff_s,
         on_shard, cpus) -> None:
    import ray

    shards = list(source.shards)
    if not shards:
        _count_engines(plans, groups, {}, summary)
        return
    workers, per = stream_width(plans, len(shards))
    clients = {role: groups[id(plan)].client_spec() for role, plan in plans.items()}
    ds = ray.data.from_items([{"shard": s} for s in shards], override_num_blocks=len(shards))
    # A shard whose worker failed outright is left for a re-run (found missing below),
    # not the end of the job: counted on this dataset's own context.
    ds.context.max_errored_blocks = -1
    out = ds.map_batches(
        ShardConversations, batch_size=1, batch_format="pyarrow", num_cpus=cpus,
        fn_constructor_kwargs={"read": source.read, "factory": factory, "write": write, "clients": clients,
                               "transport_retries": transport_retries, "backoff_s": backoff_s},
        compute=ray.data.ActorPoolStrategy(size=workers, max_concurrent_calls_per_actor=per,
                                           max_tasks_in_flight_per_actor=per))
    calls: dict[str, dict] = {}
    seen: set[int] = set()
    failed: list[tuple[int, str]] = []
    for row in out.iter_rows():
        row = {**row, "counts": json.loads(row["counts"])}
        seen.add(row["shard"])
        reason = row.pop("failed")
        if reason:
            failed.append((row["shard"], reason))
            continue
        retried = 0
        for role, c in json.loads(row.pop("calls")).items():
            mine = calls.setdefault(role, _new_counts())
            for k, v in c.items():
                mine[k] += v
            retried += c.get("retries", 0)
        if retried:
            progress(f"    {label}: shard {row['shard']}: {retried} call(s) failed in transport and were asked "
                     "again" + ("" if row["written"] or not row["left"] else f"; {row['left']} row(s) left for a re-run"))
        summary.shards.append(row)
        if row[INPUT_ERROR]:
            summary.input_errors.append(row[INPUT_ERROR])
        if row["left"]:
            summary.awaiting += row["left"]
            summary.awaiting_shards.append(row["shard"])
        if on_shard is not None:
            on_shard(row)
    lost = [s for s in shards if s not in seen]
    if lost:
        progress(f"    {label}: {len(lost)} shard(s) failed in their worker; a re-run does them")
        summary.awaiting += len(lost)  # at least one row each
        summary.awaiting_shards.extend(lost)
    summary.awaiting_shards.sort()
    _count_engines(plans, groups, calls, summary)
    if failed:
        from rexeval.failures import WorkerFailed

        more = f" (and {len(failed) - 1} other shard(s))" if len(failed) > 1 else ""
        raise WorkerFailed(f"{label}: shard {failed[0][0]} failed{more}: {failed[0][1]}")


def _count_engines(plans: dict[str, CallPlan], groups: dict, calls: dict[str, dict], summary: StreamSummary) -> None:
    """Per model: its engine group's starts and replicas, and its roles' calls summed."""
    for role, plan in plans.items():
        g = groups[id(plan)]
        entry = summary.engines.setdefault(plan.model, {"kind": plan.kind, "engine_starts": g.starts - g.counted,
                                                        "replicas": g.replicas, "roles": [],
                                                        **_new_counts()})
        if g.counted:  # started by an earlier stream of this job (SharedEngines), counted there
            entry["engines_reused"] = True
        entry["roles"].append(role)
        for k, v in calls.get(role, {}).items():
            entry[k] += v


def retry_settings(options: dict) -> dict[str, Any]:
    """`run_stream`'s retry settings from a job's backend options: `backoff_s` (a row's
    first wait after a transport failure, doubled each time) and `transport_retries`
    (how many times a row asks again before it is left for a re-run)."""
    return {"backoff_s": float(options.get("backoff_s", 1.0)),
            "transport_retries": int(options.get("transport_retries", 3))}


def awaiting_line(summary: StreamSummary, what: str = "row(s)") -> str | None:
    """The summary line for rows left by transport failures (None when there are none)."""
    if not summary.awaiting:
        return None
    shards = summary.awaiting_shards
    shown = ", ".join(map(str, shards[:8])) + (" ..." if len(shards) > 8 else "")
    return (f"{summary.awaiting} {what} await a re-run: their calls failed in transport "
            f"(shard(s) {shown} not written); run the same command again to do them")


def json_safe(value: Any) -> Any:
    """Rows from Parquet may hold values JSON cannot (timestamps): their text."""
    return json.loads(json.dumps(value, default=str))


def input_error_table(shard_error: str) -> pa.Table:
    """What a source's `read(shard)` returns for a shard it cannot read."""
    return pa.table({INPUT_ERROR: pa.array([shard_error], pa.string())})
