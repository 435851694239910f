"""One place that starts or joins Ray and wires stages onto Ray Data actor pools.

Joins the cluster named by `address` or `RAY_ADDRESS` when set; otherwise starts a
local Ray with token auth disabled (Ray 2.60 enables it by default, which a laptop
run does not need) and without the dashboard, which takes seconds to start.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterable

import pyarrow as pa

from rexeval.pipelines.core.stage import Stage, fits_now, pool_size


FORWARDED_ENV = ("REXEVAL_CACHE", "REXEVAL_PROMPTS_DIR", "HF_HUB_OFFLINE", "HF_HOME")


def init_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool = True,
             runtime_env: dict | None = None):
    """Start a local Ray or join a cluster; a no-op when Ray is already up. A driver that
    joins with `runtime_env` (a study's stage joining the study's cluster) uses that
    environment as its own: the same code and variables on the workers as its parent's."""
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    # On a cluster (joined by address) the workers' output reaches the driver, so that
    # `ray job logs` and a study stage's log show a worker's errors; a laptop run keeps
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
            # own (a study's stage) carries the job's runtime env in its environment, and
            # Ray refuses a ray.init env that repeats any of its keys; this env is that
            # job's own plus the forwarded variables, so it may override it.
            os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        if forwarded:
            env["env_vars"] = {**forwarded, **(env.get("env_vars") or {})}
        if env:
            kwargs["runtime_env"] = env
        ray.init(address=address, **kwargs)
    else:
        # Local Ray: no token auth (a laptop run does not need it) and workers import
        # the project's packages from this checkout.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs["runtime_env"] = {"env_vars": {**forwarded, "RAY_AUTH_MODE": "disabled",
                                               "PYTHONPATH": _project_root()}}
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
    if quiet:
        # Jobs print their own per-shard progress; Ray Data's bars would interleave.
        for name in ("ray.data", "ray.data._internal.progress",
                     "ray.data._internal.execution.streaming_executor"):
            logging.getLogger(name).setLevel(logging.ERROR)
        # Serve's INFO lines ("Started Serve in namespace ...") say what our jobs say.
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
    return ray


def _project_root() -> str:
    """PYTHONPATH for local workers: the source checkout first (so workers import the
    driver's code, and plug-ins named "module:Class" beside it), then the caller's."""
    import rexeval

    extra = os.environ.get("PYTHONPATH")
    parts = [p for p in (rexeval.SOURCE_ROOT, extra) if p]
    return os.pathsep.join(parts)


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
    that has the file: `pipelines/core/inputs.reads_here`). A node pin is passed as
    Ray's node-id label selector, which Ray Data takes for actors and tasks alike."""
    args = {"batch_format": "pyarrow", "batch_size": stage.batch_size,
            "num_cpus": stage.resources.cpus, "num_gpus": stage.resources.gpus or None}
    remote = dict(getattr(stage, "ray_remote_args", None) or {})
    strategy = remote.pop("scheduling_strategy", None)
    node = getattr(strategy, "node_id", None)
    if node is not None:
        args["label_selector"] = {"ray.io/node-id": node}
    return {**args, **remote}


def map_stage(ds, stage: Stage, concurrency: int | tuple[int, int | None] | None = None):
    """Append `stage` to a Ray Dataset as an actor pool: `concurrency` actors, or a
    (min, max) range the pool grows within (default: one actor up, `stage.pool_size`)."""
    import ray

    if concurrency is None:
        concurrency = pool_size(None)
    if isinstance(concurrency, int) or concurrency[0] == concurrency[1]:
        size = concurrency if isinstance(concurrency, int) else concurrency[0]
        strategy = ray.data.ActorPoolStrategy(size=size)
    else:
        strategy = ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
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
    # Tasks when every shard has an actor's worth of room at once: a fixed pool at least
    # as large as the shards, or a growing pool whose shards the cluster holds now.
    fixed = concurrency[0] == concurrency[1]
    ds = ray.data.from_items(tasks, override_num_blocks=len(tasks))
    if len(tasks) <= (concurrency[0] if fixed else fits_now(stage.resources)):
        ds = map_stage_tasks(ds, stage, len(tasks))
    else:
        ds = map_stage(ds, stage, concurrency)
    with worker_failures(stage):
        yield from ds.iter_rows()
