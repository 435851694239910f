"""LLM work streamed through Ray Data: rows -> requests -> a processor -> answers, in
passes, with shards written by the workers and transport failures left for a re-run.

A job gives three things:
- `source`: a Dataset of its input rows, each with a `shard` column;
- `steps`: picklable per-row logic (`StreamSteps`): `start(row)` -> work, `request(work)`
  -> the `ChatRequest` it sends next or None once settled, `role(work)` -> which model
  answers it, `advance(work, result)` -> the next work. Work is a plain JSON dict.
- `write(shard, works)`: commits one shard from its settled works (on a worker).

Pass 1 streams every row: start -> request -> the role's processor (`llm_calls_plan.call`)
-> advance. A row that needs another call (an unreadable answer asked again with
feedback, STAR's verification after its candidates) goes into the next pass, over those
rows only; the data between passes is materialized in the object store, and the driver
holds only references and counts, so its memory does not grow with the input.

Errors that heal: a result marked `transient` (connection, 5xx, timeout, a dead
replica, or rows of a block Ray Data gave up on) is never given to `advance`. It is
sent again in the next pass, after a backoff, `transport_retries` times; a row still
failing is left unsettled, and its shard is not written, so a plain re-run of the same
command does it (the cache answers what was done). `StreamSummary.awaiting` counts them.
"""
from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.models.llm.base import LLMResult
from rexeval.pipelines.core.llm_calls_plan import CallPlan, call_cached, transient_result
from rexeval.pipelines.core.stage import Resources

STATE = pa.schema([("shard", pa.int64()), ("key", pa.string()), ("work", pa.string()),
                   ("role", pa.string()), ("request", pa.string()), ("tries", pa.int64()),
                   ("left", pa.bool_())])


INPUT_ERROR = "__input_error__"
"""A source row holding only this column (text) stands for a shard whose input could
not be read (a schema error): the shard is not written and the job reports it."""
WRITTEN = pa.schema([("shard", pa.int64()), ("written", pa.bool_()), ("left", pa.int64()),
                     ("counts", pa.string()), (INPUT_ERROR, pa.string())])


class StreamSteps(Protocol):
    def start(self, row: dict) -> dict: ...
    def request(self, work: dict): ...
    def role(self, work: dict) -> str: ...
    def advance(self, work: dict, result: LLMResult) -> dict: ...


@dataclass
class StreamSummary:
    """What a streamed job did: calls per pass, shards written, rows left for a re-run."""

    passes: list[dict] = field(default_factory=list)
    shards: list[dict] = field(default_factory=list)
    awaiting: int = 0  # rows whose calls failed in transport: a re-run does them
    awaiting_shards: list[int] = field(default_factory=list)
    input_errors: list[str] = field(default_factory=list)  # one per shard that could not be read


# -- the per-row UDFs (actors: the steps load prompts, maybe an embedder, once) ----------


_BUILT: dict[str, StreamSteps] = {}  # a worker process's steps, per job run (`token`)
_KEPT: dict[Any, Any] = {}  # a worker process's job input (`kept`)


def kept(key: Any, load: Callable[[], Any]) -> Any:
    """`load()` once per worker process for `key` (the last key only): a job's readers
    and writers run as Ray tasks on reused worker processes, so a table every shard
    slices (a payload, the examples) is read once per process, not once per shard. The
    key must change when the content may (a hash of it, the job's settings)."""
    if key not in _KEPT:
        _KEPT.clear()
        _KEPT[key] = load()
    return _KEPT[key]


def _steps_task(batch: pa.Table, factory: Callable[[], StreamSteps], token: str, mode: str) -> pa.Table:
    """start / advance as Ray tasks: Ray reuses its worker processes, so each builds the
    job's steps (prompts, maybe an embedder) once per run, not once per batch, and no
    actor pool (a new process, its imports) starts for each pass."""
    if token not in _BUILT:
        _BUILT.clear()
        _BUILT[token] = factory()
    return _Steps(_BUILT[token], mode)(batch)


class _Steps:
    def __init__(self, steps: StreamSteps, mode: str):
        self.steps, self.mode = steps, mode

    def _row(self, shard: int, key: str, work: dict, tries: int = 0, left: bool = False) -> dict:
        req = None if left or INPUT_ERROR in work else self.steps.request(work)
        return {"shard": shard, "key": key, "work": json.dumps(work), "role": self.steps.role(work) if req else None,
                "request": req.model_dump_json() if req is not None else None, "tries": tries, "left": left}

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = []
        if self.mode == "start":
            shards = batch.column("shard").to_pylist()
            keys = batch.column("key").to_pylist()
            for shard, key, row in zip(shards, keys, batch.drop_columns(["shard", "key"]).to_pylist()):
                error = row.pop(INPUT_ERROR, None)
                work = {INPUT_ERROR: error} if error else self.steps.start(json_safe(row))
                rows.append(self._row(shard, key, work))
        else:
            for row in batch.to_pylist():
                res = LLMResult.model_validate_json(row["result"])
                rows.append(self._row(row["shard"], row["key"], self.steps.advance(json.loads(row["work"]), res)))
        return pa.Table.from_pylist(rows, schema=STATE)


def _keyed(batch: pa.Table) -> pa.Table:
    """A row key unique in the job: shard and position in it (`__pos__`, from the source)."""
    keys = [f"{s}:{p}" for s, p in zip(batch.column("shard").to_pylist(), batch.column("__pos__").to_pylist())]
    return batch.drop_columns(["__pos__"]).append_column("key", pa.array(keys, pa.string()))


def _where(batch: pa.Table, what: str) -> pa.Table:
    if what == "settled":
        return batch.filter(pc.is_null(batch.column("request")))
    if what == "open":
        return batch.filter(pc.is_valid(batch.column("request")))
    role = what.split(":", 1)[1]
    return batch.filter(pc.equal(batch.column("role"), role))


def _sort_transient(batch: pa.Table, transport_retries: int) -> pa.Table:
    """Rows whose call failed in transport: counted, and left once out of tries."""
    out = []
    for row in batch.to_pylist():
        res = LLMResult.model_validate_json(row["result"])
        if not res.transient:
            continue
        tries = int(row["tries"]) + 1
        left = tries > transport_retries
        out.append({**{k: row[k] for k in STATE.names}, "tries": tries, "left": left,
                    "request": None if left else row["request"]})
    return pa.Table.from_pylist(out, schema=STATE)


def _answered(batch: pa.Table) -> pa.Table:
    keep = [not LLMResult.model_validate_json(r).transient for r in batch.column("result").to_pylist()]
    return batch.filter(pa.array(keep, pa.bool_()))


def _shards_in(block: pa.Table) -> list[int]:
    return sorted(set(block.column("shard").to_pylist())) if block.num_rows else []


def _write_one(shard: int, write: Callable[[int, list[dict]], dict], *blocks: pa.Table) -> dict:
    rows = pa.concat_tables([b.filter(pc.equal(b.column("shard"), shard)) for b in blocks])
    return _Writer(write)(rows).to_pylist()[0]


def _write_shards(settled, write: Callable[[int, list[dict]], dict]):
    """Each shard's settled rows to one Ray task that writes it, yielding its result row
    as it finishes. The rows are found by block reference (which blocks hold which
    shards), not by a shuffle: Ray Data's groupby needs CPUs for its aggregators that a
    local job's model actors hold, and a shard's rows sit in few blocks anyway."""
    import ray

    refs = settled.to_arrow_refs()
    shards_in = ray.remote(num_cpus=0)(_shards_in)
    index: dict[int, list] = {}
    for ref, shards in zip(refs, ray.get([shards_in.remote(r) for r in refs])):
        for s in shards:
            index.setdefault(s, []).append(ref)
    write_one = ray.remote(num_cpus=0)(_write_one)
    waiting = [write_one.remote(s, write, *index[s]) for s in sorted(index)]
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        yield ray.get(done[0])


def _state_only(batch: pa.Table) -> pa.Table:
    return batch.select(STATE.names)


class _Writer:
    """One shard's settled rows -> `write(shard, works)`; a shard with a row left for a
    re-run is not written (its counts row says how many)."""

    def __init__(self, write: Callable[[int, list[dict]], dict]):
        self.write = write

    def __call__(self, group: pa.Table) -> pa.Table:
        shard = int(group.column("shard")[0].as_py())
        left = sum(bool(x) for x in group.column("left").to_pylist())
        order = sorted(range(group.num_rows), key=lambda i: int(group.column("key")[i].as_py().split(":")[1]))
        works = [json.loads(group.column("work")[i].as_py()) for i in order]
        failed = next((w[INPUT_ERROR] for w in works if INPUT_ERROR in w), None)
        if left or failed:
            return pa.Table.from_pylist([{"shard": shard, "written": False, "left": left, "counts": "{}",
                                          INPUT_ERROR: failed}], schema=WRITTEN)
        counts = self.write(shard, works)
        return pa.Table.from_pylist([{"shard": shard, "written": True, "left": 0, "counts": json.dumps(counts),
                                      INPUT_ERROR: None}], schema=WRITTEN)


# -- the driver -------------------------------------------------------------------------


def source_rows(read: Callable[[int], pa.Table], shards: list[int], resources: Resources = Resources(cpus=0)):
    """A Dataset of every row of `shards`, each read by a Ray task with `read(shard)`, with
    its `shard` and position (the job's key)."""
    import ray

    def read_one(batch: pa.Table) -> pa.Table:
        parts = []
        for shard in batch.column("shard").to_pylist():
            t = read(shard)
            parts.append(t.append_column("shard", pa.array([shard] * t.num_rows, pa.int64()))
                         .append_column("__pos__", pa.array(range(t.num_rows), pa.int64())))
        return _keyed(pa.concat_tables(parts, promote_options="permissive"))

    ds = ray.data.from_items([{"shard": s} for s in shards], override_num_blocks=max(1, len(shards)))
    return ds.map_batches(read_one, batch_size=1, batch_format="pyarrow", num_cpus=resources.cpus)


def run_stream(source, factory: Callable[[], StreamSteps], plans: dict[str, CallPlan],
               write: Callable[[int, list[dict]], dict], *, label: str = "llm",
               progress: Callable[[str], None] = print, transport_retries: int = 3, backoff_s: float = 1.0,
               max_passes: int = 32, on_shard: Callable[[dict], None] | None = None,
               steps_resources: Resources = Resources(cpus=0)) -> StreamSummary:
    """Run the job (see the module docstring); returns its summary. The steps and the
    writer take no CPU of their own by default: the model's actors hold the CPUs a local
    job has, and light per-row work beside them must not wait for them to finish."""
    import uuid

    from rexeval.pipelines.core.llm_calls_plan import start_hosts, stop_hosts

    summary = StreamSummary()
    token = uuid.uuid4().hex
    steps = dict(batch_format="pyarrow", batch_size=64, num_cpus=steps_resources.cpus)
    # One set of model actors per plan object: extract gives the same plan to llm and verify
    # when they are one model, and that model loads once.
    unique = {id(p): p for p in plans.values() if p.kind == "local"}
    hosts = {key: start_hosts(p) for key, p in unique.items()}
    try:
        _say_placements(plans, hosts, label, progress)
        return _run(source, factory, plans, write, hosts, token, steps, summary, label, progress,
                    transport_retries, backoff_s, max_passes, on_shard)
    finally:
        for h in hosts.values():
            stop_hosts(h)


def _say_placements(plans: dict[str, CallPlan], hosts: dict[int, list], label: str,
                    progress: Callable[[str], None]) -> None:
    """One line per model: where its calls go (`llm_placement.place_llm` decided)."""
    roles: dict[int, tuple[CallPlan, list[str]]] = {}
    for role, plan in plans.items():
        roles.setdefault(id(plan), (plan, []))[1].append(role)
    for plan, names in roles.values():
        actors = len(hosts[id(plan)]) if id(plan) in hosts else None
        progress(f"    {label} {'/'.join(names)}: {plan.describe(actors)}")


def _run(source, factory, plans, write, hosts, token, steps, summary, label, progress, transport_retries,
         backoff_s, max_passes, on_shard) -> StreamSummary:
    start = dict(fn_kwargs={"factory": factory, "token": token, "mode": "start"}, **steps)
    advance = dict(fn_kwargs={"factory": factory, "token": token, "mode": "advance"}, **steps)
    states = source.map_batches(_steps_task, **start).materialize()
    settled = [states.map_batches(_where, fn_kwargs={"what": "settled"}, batch_format="pyarrow", num_cpus=0)]
    pending = states.map_batches(_where, fn_kwargs={"what": "open"}, batch_format="pyarrow", num_cpus=0).materialize()
    for n in range(1, max_passes + 1):
        asked = pending.count()
        if not asked:
            break
        t0 = time.time()
        answered = []
        for role, plan in plans.items():
            part = pending.map_batches(_where, fn_kwargs={"what": f"role:{role}"}, batch_format="pyarrow", num_cpus=0)
            answered.append(_call_keeping_rows(part.materialize(), plan, hosts.get(id(plan))))
        got = answered[0].union(*answered[1:]) if len(answered) > 1 else answered[0]
        got = got.materialize()
        failed = got.map_batches(_sort_transient, fn_kwargs={"transport_retries": transport_retries},
                                 batch_format="pyarrow", num_cpus=0).materialize()
        advanced = got.map_batches(_answered, batch_format="pyarrow", num_cpus=0).map_batches(
            _steps_task, **advance).materialize()
        retry = failed.map_batches(lambda b: b.filter(pc.invert(b.column("left"))), batch_format="pyarrow", num_cpus=0)
        settled += [advanced.map_batches(_where, fn_kwargs={"what": "settled"}, batch_format="pyarrow", num_cpus=0),
                    failed.map_batches(lambda b: b.filter(b.column("left")), batch_format="pyarrow", num_cpus=0)]
        pending = advanced.map_batches(_where, fn_kwargs={"what": "open"}, batch_format="pyarrow", num_cpus=0).union(
            retry).materialize()
        n_failed, n_next = failed.count(), pending.count()
        info = {"pass": n, "calls": asked, "transport_failed": n_failed, "next": n_next,
                "seconds": round(time.time() - t0, 2)}
        summary.passes.append(info)
        progress(f"    {label} pass {n}: {asked} call(s) in {info['seconds']:.0f}s"
                 + (f", {n_failed} failed in transport" if n_failed else "")
                 + (f"; {n_next} to ask again" if n_next else ""))
        if n_failed and n_next:
            time.sleep(min(30.0, backoff_s * 2 ** (n - 1)) * random.uniform(0.5, 1.0))
    else:
        # Never expected (each row has a bounded number of calls): leave the rest.
        settled.append(pending.map_batches(lambda b: b.set_column(
            STATE.names.index("left"), "left", pa.array([True] * b.num_rows, pa.bool_())), batch_format="pyarrow", num_cpus=0))
    everything = settled[0].union(*settled[1:]) if len(settled) > 1 else settled[0]
    for row in _write_shards(everything.map_batches(_state_only, batch_format="pyarrow", num_cpus=0), write):
        row = {**row, "counts": json.loads(row["counts"])}
        summary.shards.append(row)
        if row[INPUT_ERROR]:
            summary.input_errors.append(row[INPUT_ERROR])
        if row["left"]:
            summary.awaiting += row["left"]
            summary.awaiting_shards.append(row["shard"])
        if on_shard is not None:
            on_shard(row)
    summary.awaiting_shards.sort()
    return summary


def _call_keeping_rows(part, plan: CallPlan, hosts: list | None):
    """The plan's answers for every row of `part` (materialized): rows a failed block
    lost (Ray Data drops them when `max_errored_blocks` lets a pass go on) come back with a
    transient result, so none is lost silently."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    before = ctx.max_errored_blocks
    ctx.max_errored_blocks = -1  # a block whose calls failed is counted below, not fatal
    try:
        got = call_cached(part, plan, hosts).materialize()
    except Exception as exc:  # noqa: BLE001  (the pass itself failed: a dead replica, a bad answer body)
        from rexeval.failures import reason_of

        # Nothing of this pass is taken as answered; every row is tried again in the
        # next pass (what was answered is in the call cache) or left for a re-run.
        why = transient_result(f"the {plan.kind} pass failed: {reason_of(exc)}")
        return part.map_batches(lambda b: b.append_column("result", pa.array([why] * b.num_rows, pa.string())),
                                batch_format="pyarrow", num_cpus=0).materialize()
    finally:
        ctx.max_errored_blocks = before
    n_in, n_out = part.count(), got.count()
    if n_out >= n_in:
        return got
    # Rare (a replica or an HTTP endpoint down past the processor's retries): find the
    # lost keys on the driver, bounded by this pass's size.
    have = {r["key"] for r in got.select_columns(["key"]).iter_rows()}

    def lost(batch: pa.Table) -> pa.Table:
        keep = pa.array([k not in have for k in batch.column("key").to_pylist()], pa.bool_())
        b = batch.filter(keep)
        why = transient_result(f"the {plan.kind} call's block failed (the rows were not answered)")
        return b.append_column("result", pa.array([why] * b.num_rows, pa.string()))

    return got.union(part.map_batches(lost, batch_format="pyarrow", num_cpus=0)).materialize()


def retry_settings(options: dict) -> dict[str, Any]:
    """`run_stream`'s retry settings from a job's backend options: `backoff_s` (the first
    wait between passes, doubled each pass) and `transport_retries` (passes that retry a
    transport failure before its row is left for a re-run)."""
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
