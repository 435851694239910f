"""One place that starts or joins Ray and wires stages onto Ray Data actor pools.

Joins the cluster named by `address` or `RAY_ADDRESS` when set; otherwise starts a
local Ray with token auth disabled (Ray 2.60 enables it by default, which a laptop
run does not need) and without the dashboard, which takes seconds to start.
"""
from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from typing import Iterable

import pyarrow as pa

from rexeval.pipelines.core.stage import ONE_MACHINE_ENV, Stage, at_once, pool_size
from rexeval.threads import MAX_THREADS_ENV


FORWARDED_ENV = ("REXEVAL_CACHE", "REXEVAL_PROMPTS_DIR", MAX_THREADS_ENV, "HF_HUB_OFFLINE", "HF_HOME")


# A local Ray is one machine's CPUs shared by every actor of every job on it (a study's
# stages at once, a model actor beside a Ray Data pool): OpenMP threads (torch's) that
# spin while they wait take the cores the other processes' threads need
# (benchmarks/bench_omp_wait.py: two prompted jobs at once on 2 cores took 64-67 s each
# with sleeping threads, 66 s alone; with spinning ones, ACTIVE, neither had ended after
# 6 min). A value the user exported wins.
OMP_WAIT = "PASSIVE"

SOFT_LIMIT_ENV = "RAY_num_workers_soft_limit"
IDLE_WORKERS_KEPT = 8  # at least, on a local Ray: `idle_workers_kept`

# The raylet's notice that a node runs many worker processes (`WorkerPool::WarnAboutSize`,
# published to every driver of the node, printed by each driver's error listener).
POOL_SIZE_NOTICE = "worker processes have been started on node"
# What the raylet publishes when a job stops its own Serve (the judge or NLI app a command
# started): the controller's pending calls fail because it was killed, on purpose.
SERVE_STOPPED_NOTICE = ("Task ServeController.", "killed by `ray.kill`")

LOCAL_RAY_ENV = "REXEVAL_LOCAL_RAY"
"""Set by a local start in the starting process (and so in every process it starts): the
GCS address and the variables that Ray's workers there inherit, so that a driver joining
that cluster (a study's step, a command run beside it) passes only those that differ."""


def init_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool = True,
             runtime_env: dict | None = None):
    """Start a local Ray or join a cluster; a no-op when Ray is already up. A driver that
    joins with `runtime_env` (a study's step joining the study's cluster) uses that
    environment as its own: the same code and variables on the workers as its parent's."""
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    # On a cluster (joined by address) the workers' output reaches the driver, so that
    # `ray job logs` and a study step's log show a worker's errors; a laptop run keeps
    # its terminal to the job's own progress lines.
    kwargs: dict = {"ignore_reinit_error": True,
                    "logging_level": logging.WARNING if quiet else logging.INFO,
                    "log_to_driver": not quiet or bool(address)}
    # Settings that change what a worker computes travel with the job.
    forwarded = {k: v for k, v in os.environ.items() if k in FORWARDED_ENV}
    if address:
        env = dict(runtime_env or {})
        if runtime_env:
            # A process of a submitted job (`ray job submit`) that joins as a driver of its
            # own (a study's step) carries the job's runtime env in its environment, and
            # Ray refuses a ray.init env that repeats any of its keys; this env is that
            # job's own plus the forwarded variables, so it may override it.
            os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        if forwarded:
            env["env_vars"] = {**forwarded, **(env.get("env_vars") or {})}
        env = beyond_local(address, env)
        if env:
            kwargs["runtime_env"] = env
        ray.init(address=address, **kwargs)
    else:
        # Local Ray: no token auth (a laptop run does not need it) and workers import
        # the project's packages from this checkout. The variables go into this process's
        # environment, which the raylet it starts, and so every worker, inherits: passed
        # as a runtime env instead, each worker would start through Ray's setup process
        # (another interpreter importing Ray): 0.88 s of CPU per worker start, not 0.67
        # (benchmarks/bench_worker_start.py).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        env = {**forwarded, "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"], "PYTHONPATH": _project_root(),
               "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", OMP_WAIT)}
        env = {k: v for k, v in env.items() if v}
        os.environ.update(env)
        if SOFT_LIMIT_ENV not in os.environ:
            kwargs["_system_config"] = {"num_workers_soft_limit": idle_workers_kept(num_cpus)}
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
        _mark_one_machine(ray, num_cpus)
        os.environ[LOCAL_RAY_ENV] = json.dumps({"address": ray.get_runtime_context().gcs_address, "env": env})
    # Ray Data's shuffles (groupby, sort: `map_key_groups`, the split's order) as tasks on
    # the pooled workers: Ray 2.60's default shuffle starts a pool of aggregator actors for
    # each one, seconds before a row moves (a keyed step over 360 rows: 0.2 s against 7 s).
    from ray.data.context import ShuffleStrategy

    ray.data.DataContext.get_current().shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    if quiet:
        # Jobs print their own per-shard progress; Ray Data's bars would interleave.
        for name in ("ray.data", "ray.data._internal.progress",
                     "ray.data._internal.execution.streaming_executor"):
            logging.getLogger(name).setLevel(logging.ERROR)
        quiet_serve_logger()
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        routine_raylet_lines_to_log()
    return ray


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def quiet_serve_logger() -> None:
    """Serve's INFO lines on a quiet driver ("Started Serve in namespace ...", "Application
    ... is ready") say what our jobs say, so only its warnings and errors print. A filter
    on the logger, not its level: importing `ray.serve` (later, when a job starts an app)
    resets that logger's level and handlers, but not its filters."""
    logger = logging.getLogger("ray.serve")
    logger.setLevel(logging.WARNING)
    if not any(isinstance(f, _BelowWarning) for f in logger.filters):
        logger.addFilter(_BelowWarning())


def _routine(line: str) -> bool:
    """A raylet line a quiet driver sends to the log: the worker-count notice, and the
    failed calls of a Serve controller this job stopped."""
    return POOL_SIZE_NOTICE in line or all(part in line for part in SERVE_STOPPED_NOTICE)


def routine_raylet_lines_to_log() -> None:
    """Send the raylet's "N worker processes have been started on node" notice, and the
    "Task ServeController.... failed ... killed by `ray.kill`" lines that follow a job's
    stop of its own Serve, to the `ray` logger (INFO) instead of the terminal, leaving
    every other error line as Ray prints it.

    Why: the raylet warns every driver of a node once its worker processes pass four
    times its start-up concurrency plus Ray's IO workers (16 on 2 CPUs). A study keeps
    its finished steps' drivers, and with them their jobs' idle workers, for the next
    steps (`study/step_process.py`), so a 2-CPU laptop reaches that on purpose, and
    the notice lands in the middle of the study's progress lines. Ray has no setting for
    it; its error listener looks `print_to_stdstream` up at each message, so wrapping
    that one function is enough."""
    from ray._private import worker as ray_worker

    show = ray_worker.print_to_stdstream
    if getattr(show, "_rexeval_quiet", False):
        return

    def print_to_stdstream(data, ignore_prefix: bool):
        lines = data.get("lines") or []
        if data.get("pid") == "raylet" and any(_routine(str(line)) for line in lines):
            logging.getLogger("ray").info("(raylet) %s", " ".join(str(x) for x in lines if _routine(str(x))))
            rest = [x for x in lines if not _routine(str(x))]
            return show({**data, "lines": rest}, ignore_prefix) if rest else None
        return show(data, ignore_prefix)

    print_to_stdstream._rexeval_quiet = True
    ray_worker.print_to_stdstream = print_to_stdstream


def idle_workers_kept(num_cpus: int | None) -> int:
    """Idle workers a local Ray keeps for the next task rather than stopping them (Ray's
    `num_workers_soft_limit`; its default is the CPU count). A job's Ray Data operators
    run more tasks at once than a small machine has CPUs (reads, 0-CPU steps), so at 2
    CPUs Ray stopped workers between a job's operators, and between one job and the next,
    and started new ones a moment later, 0.7 s of CPU each (benchmarks/bench_worker_start.py:
    14-15 workers started for a chain of small jobs where 10-12 do). A value the user
    exported wins."""
    return max(IDLE_WORKERS_KEPT, int(num_cpus or os.cpu_count() or 1))


def beyond_local(address: str, runtime_env: dict) -> dict:
    """`runtime_env` less the variables that the workers of the cluster at `address`
    already inherit, when this process (or the one that started it) started that cluster
    locally (`LOCAL_RAY_ENV`); without any left, and nothing else in it, {}: the joining
    driver's workers then start as directly as the starting driver's."""
    try:
        mark = json.loads(os.environ.get(LOCAL_RAY_ENV) or "{}")
    except ValueError:
        return runtime_env
    if not runtime_env or mark.get("address") != address:
        return runtime_env
    have = mark.get("env") or {}
    env = {k: v for k, v in runtime_env.items() if k != "env_vars"}
    extra = {k: v for k, v in (runtime_env.get("env_vars") or {}).items() if have.get(k) != v}
    if extra:
        env["env_vars"] = extra
    return env


def _mark_one_machine(ray, num_cpus: int | None) -> None:
    """Say (in this process's environment, which a local study's steps inherit) that
    the Ray at this address is this machine alone, started here with these CPUs: jobs
    on it share the machine's CPUs by default (`stage.machine_cpus`). Without
    `num_cpus`, what Ray found on the node it just started; a cluster joined by address
    is never measured so."""
    cpus = num_cpus or ray.cluster_resources().get("CPU", 1)
    os.environ[ONE_MACHINE_ENV] = f"{ray.get_runtime_context().gcs_address} {cpus:g}"


def _project_root() -> str:
    """PYTHONPATH for local workers: the source checkout first (so workers import the
    driver's code, and plug-ins named "module:Class" beside it), then the caller's."""
    import rexeval

    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != rexeval.SOURCE_ROOT]
    return os.pathsep.join([p for p in [rexeval.SOURCE_ROOT] if p] + extra)


class _StageActor:
    """Holds one stage per actor so `setup()` (model loading) runs once."""

    def __init__(self, stage: Stage):
        self.stage = stage
        stage.setup()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.stage.process(batch)


def _batch_args(stage: Stage) -> dict:
    """What `map_batches` needs from a stage, whether it runs on actors or tasks: its
    batch size and resources, and where it may run when it says (`ray_remote_args`, e.g.
    a stage that reads a local input file is pinned to the driver's node, the one node
    that has the file: `reads_here`). A node pin is passed as
    Ray's node-id label selector, which Ray Data takes for actors and tasks alike."""
    args = {"batch_format": "pyarrow", "batch_size": stage.batch_size,
            "num_cpus": stage.resources.cpus, "num_gpus": stage.resources.gpus or None}
    if stage.resources.custom:
        args["resources"] = stage.resources.ray_resources
    if stage.resources.memory:
        args["memory"] = stage.resources.memory
    remote = dict(getattr(stage, "ray_remote_args", None) or {})
    strategy = remote.pop("scheduling_strategy", None)
    node = getattr(strategy, "node_id", None)
    if node is not None:
        args["label_selector"] = {"ray.io/node-id": node}
    return {**args, **remote}


def map_stage(ds, stage: Stage, concurrency: int | tuple[int, int | None] | None = None):
    """Append `stage` to a Ray Dataset as an actor pool: `concurrency` actors, or a
    (min, max) range the pool grows within (default: one actor up, `stage.pool_size`).
    A growing pool starts `stage.at_once` actors: on one machine as many as it holds,
    on a cluster its least (Ray Data, and through it the autoscaler, adds the rest)."""
    import ray

    if concurrency is None:
        concurrency = pool_size(None)
    if isinstance(concurrency, int) or concurrency[0] == concurrency[1]:
        size = concurrency if isinstance(concurrency, int) else concurrency[0]
        strategy = ray.data.ActorPoolStrategy(size=size)
    else:
        strategy = ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1],
                                              initial_size=at_once(concurrency, stage.resources))
    return ds.map_batches(_StageActor, fn_constructor_args=(stage,), **_batch_args(stage), compute=strategy)


class SetupFailed(RuntimeError):
    """A stage's `setup()` raised in a Ray task: "Type: message" of what it raised."""


def _stage_task(batch: pa.Table, stage: Stage) -> pa.Table:
    """One Ray task's share of a stage: set up (once per task), then process."""
    if not getattr(stage, "_set_up_here", False):
        try:
            stage.setup()
        except Exception as exc:  # noqa: BLE001  (named in one line by worker_failures)
            raise SetupFailed(f"{type(exc).__name__}: {exc}") from exc
        stage._set_up_here = True
    return stage.process(batch)


def map_stage_tasks(ds, stage: Stage, concurrency: int):
    """Append `stage` to a Ray Dataset as Ray tasks, each setting the stage up for itself
    (see `run_tasks` for when that is cheaper than an actor pool)."""
    import ray

    return ds.map_batches(
        _stage_task,
        fn_kwargs={"stage": stage},
        **_batch_args(stage),
        compute=ray.data.TaskPoolStrategy(size=concurrency),
    )


@contextmanager
def worker_failures(stage: Stage):
    """A worker of `stage` that could not set it up (a model that cannot load, a missing
    package) becomes WorkerFailed with that worker's own error in one line; Ray gives it
    as the whole remote traceback inside an ActorDiedError (an actor's) or a task error."""
    import ray

    try:
        yield
    except ray.exceptions.RayActorError as exc:
        from rexeval.failures import WorkerFailed, reason_of

        raise WorkerFailed(f"{stage.name}: an actor failed: {reason_of(exc)}") from exc
    except Exception as exc:  # a task error: only a failed set-up is reworded
        from rexeval.failures import WorkerFailed, reason_of

        reason = reason_of(exc)
        if not reason.startswith(f"{SetupFailed.__name__}: "):
            raise
        raise WorkerFailed(f"{stage.name}: a worker could not set it up: "
                           f"{reason.removeprefix(SetupFailed.__name__ + ': ')}") from exc


def run_tasks(tasks: Iterable[dict], stage: Stage, concurrency: int | tuple[int, int | None] | None = None):
    """Run `stage` over task descriptors (one per batch), yielding its result rows.

    Used by sharded jobs: each task is one shard, the stage writes that shard and
    returns a small row of counts, so the driver can report progress as shards finish.

    An actor pool sets the stage up (loads its model) once per actor and pays for a new
    worker process per actor, whose imports (torch, transformers) take seconds; that pays
    off only when an actor gets more than one shard. With no more shards than actors,
    every shard runs as a Ray task instead, on the session's pooled worker processes,
    which keep their imports from earlier jobs (the same set-ups, none of the start-ups).
    benchmarks/bench_small_jobs.py: a 2-shard job in a row of such jobs took 0.05 s as
    tasks against 3.8 s as actors; right after other actors started (Ray ends idle
    workers beyond the CPU count) the two were even.
    """
    import ray

    tasks = list(tasks)
    if not tasks:
        return
    if concurrency is None:
        concurrency = pool_size(None, len(tasks))
    if isinstance(concurrency, int):
        concurrency = (concurrency, concurrency)
    # Tasks when every shard has an actor's worth of room at once: no more shards than
    # the pool starts with (`stage.at_once`: on one machine what it holds, on a cluster
    # the pool's least, since what the cluster holds is not read).
    ds = ray.data.from_items(tasks, override_num_blocks=len(tasks))
    if len(tasks) <= at_once(concurrency, stage.resources):
        ds = map_stage_tasks(ds, stage, len(tasks))
    else:
        ds = map_stage(ds, stage, concurrency)
    with worker_failures(stage):
        yield from ds.iter_rows()


# -- tables as Ray Datasets -------------------------------------------------------------

class _ReadParts(Stage):
    """Reads the parts its rows name ({"part": path, "index": n}), each validated."""

    name = "read"
    batch_size = 1

    def __init__(self, schema: str | pa.Schema, columns: list[str] | None, order: str | None, where: dict,
                 rename: dict[str, str] | None = None):
        self.schema, self.columns, self.order, self.ray_remote_args = schema, columns, order, where
        self.rename = rename

    def process(self, batch: pa.Table) -> pa.Table:
        import numpy as np

        from rexeval.pipelines.core.io import read_part

        tables = []
        for part, index in zip(batch.column("part").to_pylist(), batch.column("index").to_pylist()):
            t = read_part(part, self.schema, self.columns, self.rename)
            if self.order is not None:  # (part, row), as read_table concatenates them
                first = index << 40
                t = t.append_column(self.order, pa.array(np.arange(first, first + t.num_rows, dtype=np.int64)))
            tables.append(t)
        return pa.concat_tables(tables)


def reads_here(paths: Iterable) -> dict:
    """Ray options for a task that reads the input files `paths`: pinned to the driver's
    node when any of them is a local path; none when all are URIs.

    On a cluster the nodes share no disk: a user's local file exists only on the machine
    that started the job (the driver's node; the head for `ray job submit`), and a task
    placed on another node would not find it. A URI reaches the same object from every
    node, so a task reading only URIs may run anywhere. The pin is hard (soft=False):
    elsewhere the task could only fail. A driver's node that runs no tasks (a head
    started with 0 CPUs) could never run it, so that is said at once. (A local output
    folder is another matter: on a cluster it must be one every node mounts, which
    `pipelines/core/reach.py` checks, so its readers and writers are not pinned.)
    """
    from rexeval.storage import is_uri

    local = [str(p) for p in paths if not is_uri(p)]
    if not local:
        return {}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    cpus = next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node), 0)
    if not cpus:
        raise ValueError(f"{local[0]} is a local path, so the tasks that read it must run on this "
                         "node, which gives Ray no CPUs; put the data where every node reaches it "
                         "(s3://..., gs://...) or give this node CPUs")
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}


def read_dataset(path, schema: str | pa.Schema, columns: list[str] | None = None,
                 *, order: str | None = None, rename: dict[str, str] | None = None):
    """A table (a file, a folder of parts, or a list of part files) as a Ray Dataset whose
    blocks are its parts, each read and validated by a Ray task, so that a job's driver
    never holds the table. A file may be in any format `io.read_raw` reads (Parquet, CSV,
    TSV, JSON lines, gzipped or not); `rename` maps our column names to the file's (ours
    -> theirs). The driver reads only the footers (of CSV or JSON lines, the first block
    of rows): a part in no format we read, or one lacking a required column, is refused
    before any work, naming the file, the format and the columns found. Local files are
    read on this node (`reads_here`). `order`: a column to add that orders the rows as
    `read_table` concatenates them, for jobs where input order settles ties."""
    from rexeval.pipelines.core.io import read_raw, table_files, told_format, validated
    from rexeval.pipelines.core.schema import TABLES
    from rexeval.storage import location

    files = [location(p) for p in path] if isinstance(path, list) else table_files(path)
    sch = TABLES[schema] if isinstance(schema, str) else schema
    name = schema if isinstance(schema, str) else None
    for f in files:
        fmt = told_format(f, name or "table", head=True)
        validated(read_raw(f, schema, rename, name or "table", head=True, fmt=fmt), schema, str(f), name, fmt,
                  rename)
    ray = init_ray()
    if not files:
        empty = sch.empty_table() if columns is None else sch.empty_table().select(columns)
        return ray.data.from_arrow(empty if order is None else empty.append_column(order, pa.array([], pa.int64())))
    rows = ray.data.from_items([{"part": str(f), "index": i} for i, f in enumerate(files)],
                               override_num_blocks=len(files))
    return map_stage_tasks(rows, _ReadParts(schema, columns, order, reads_here(files), rename), len(files))


# -- whole groups of rows by key, on Ray Data ---------------------------------------------

ROWS_PER_GROUP = 200_000
"""Rows one call of `map_key_groups` gets on average: one worker's share of a keyed step."""

_GROUP = "__rexeval_group"


def key_groups(rows: int | None) -> int:
    """How many groups `map_key_groups` spreads `rows` rows over (ROWS_PER_GROUP each)."""
    return max(1, -(-int(rows or 0) // ROWS_PER_GROUP))


def _stable_groups(batch: pa.Table, keys: list[str], groups: int) -> pa.Table:
    """`batch` with each row's group: CRC-32 of its keys' text modulo `groups`. Why CRC-32:
    Python's hash() of a string differs between processes, and every worker must agree."""
    import zlib

    import numpy as np
    import pyarrow.compute as pc

    cols = [pc.cast(batch.column(k), pa.string()) for k in keys]
    text = cols[0] if len(cols) == 1 else pc.binary_join_element_wise(*cols, "\x1f")
    enc = pc.fill_null(text, "").combine_chunks().dictionary_encode()  # hash each distinct key once
    per_key = np.array([zlib.crc32(v.encode()) % groups for v in enc.dictionary.to_pylist()], dtype=np.int32)
    group = per_key[enc.indices.to_numpy(zero_copy_only=False)] if len(per_key) else np.zeros(0, np.int32)
    return batch.append_column(_GROUP, pa.array(group, pa.int32()))


def _call_on_group(group: pa.Table, fn, kwargs: dict) -> pa.Table:
    return fn(group.drop_columns([_GROUP]), **kwargs)


def map_key_groups(ds, keys: str | list[str], fn, groups: int, **fn_kwargs):
    """`fn(table, **fn_kwargs)` on Ray workers, each call given every row of some values of
    `keys` (all of a user's reviews, say), and their results as a Dataset.

    The rows are spread over `groups` groups by a stable hash of their keys (Ray Data's
    `groupby(...).map_groups` on it), so one call sees many keys at once and `fn` can
    work on them with vectorised Arrow/NumPy code; grouping by the key itself would make
    one Python call per user on tables of millions."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    tagged = ds.map_batches(_stable_groups, fn_kwargs={"keys": keys, "groups": groups}, batch_format="pyarrow")
    return tagged.groupby(_GROUP, num_partitions=groups).map_groups(
        _call_on_group, fn_kwargs={"fn": fn, "kwargs": fn_kwargs}, batch_format="pyarrow")


def block_partials(ds, fn, **fn_kwargs) -> list[dict]:
    """`fn(block, **fn_kwargs)` (a few rows of partial counts) on every block of `ds`, in
    Ray workers; their rows, for the driver to combine. No shuffle: one pass over `ds`."""
    return ds.map_batches(fn, fn_kwargs=fn_kwargs, batch_size=None, batch_format="pyarrow").take_all()


# -- numbering rows across a sorted Dataset -----------------------------------------------

def _block_summary(block: pa.Table, key: str | None) -> tuple:
    """(rows, first and last value of `key`, runs of equal `key` values) of one block."""
    n = block.num_rows
    if not n or key is None:
        return n, None, None, 0
    values = block.column(key).to_numpy(zero_copy_only=False)
    return n, values[0], values[-1], 1 + int((values[1:] != values[:-1]).sum())


def block_refs(ds, key: str | None = None) -> tuple[list, list[tuple]]:
    """`ds`'s blocks (object references, in order) and, worked out where each block is, its
    rows and (with `key`) its first and last value of that column and the runs of equal
    values in it: what a driver needs to number or cut rows across blocks, a few values per
    block."""
    import ray

    refs = ds.to_arrow_refs()
    summary = ray.remote(_block_summary).options(num_cpus=0.1)
    return refs, ray.get([summary.remote(r, key) for r in refs])


def _numbered(block: pa.Table, columns: dict[str, tuple[str | None, int]]) -> pa.Table:
    """`block` with each of `columns` (name -> (key, start)): the row's place from `start`
    (key None), or the rank of its `key` value among the distinct values from `start`."""
    import numpy as np

    n = block.num_rows
    for name, (key, start) in columns.items():
        if key is None:
            values = np.arange(start, start + n, dtype=np.int64)
        else:
            v = block.column(key).to_numpy(zero_copy_only=False)
            values = start + np.concatenate([[0], np.cumsum(v[1:] != v[:-1])]).astype(np.int64)[:n]
        if name in block.column_names:
            block = block.drop_columns([name])
        block = block.append_column(name, pa.array(values, pa.int64()))
    return block


def ranked(ds, keys: list[str], *, position: str | None = None, dense: str | None = None):
    """`ds` sorted by `keys` (Ray Data's sort) with each row's place in that order in the
    column `position` and the rank of its `keys[0]` value among that column's distinct
    values in `dense` (both from 0), numbered by Ray tasks from a few values per block.
    Returns (the dataset, how many distinct `keys[0]` values there are). How a job indexes
    users, items or interactions in sorted order without the driver holding the ids."""
    import ray

    refs, ends = block_refs(ds.sort(list(keys)), keys[0] if dense else None)
    row, rank, last, plans = 0, 0, _UNSEEN, []
    for n, first, end, runs in ends:
        start = rank - 1 if n and first == last else rank
        plans.append({**({position: (None, row)} if position else {}), **({dense: (keys[0], start)} if dense else {})})
        row += n
        if n:
            rank, last = start + runs, end
    if not refs:
        return ds, 0
    number = ray.remote(_numbered).options(num_cpus=0.25)
    return ray.data.from_arrow_refs([number.remote(r, p) for r, p in zip(refs, plans)]), rank


_UNSEEN = object()


def even_cuts(sizes: list[int], shards: int, total: int | None = None) -> list[list[tuple[int, int, int]]]:
    """Per shard, the (block, start, stop) slices of blocks of `sizes` rows that make it:
    the rows in order (`total`, default all of them), in `shards` runs of equal size (the
    last ones smaller). Ray's sort
    cuts its blocks at sampled keys, differently on every run; these cuts depend on the
    rows only, so a re-run, on one node or many, writes the same shards."""
    import numpy as np

    total = int(sum(sizes) if total is None else total)
    per = max(1, -(-total // max(1, shards)))
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    cuts = []
    for k in range(shards):
        lo, hi = k * per, min((k + 1) * per, total)
        cuts.append([(b, int(max(lo, starts[b]) - starts[b]), int(min(hi, starts[b + 1]) - starts[b]))
                     for b in range(len(sizes)) if max(lo, starts[b]) < min(hi, starts[b + 1])])
    return cuts

