"""The unit of work of every pipeline: a stage with declared resources and batch size.

Modelled on NeMo Curator's ProcessingStage: a stage names itself, says what it needs
(CPUs, GPUs) and how many rows it wants per call, loads its model once in `setup()`,
and maps a batch (a pyarrow Table) to a batch. The same object runs in a unit test on
a plain table, and on Ray Data inside an actor pool (`pipelines.core.runtime.map_stage`).
"""
from __future__ import annotations

import abc
import os
import sys
from dataclasses import dataclass

import pyarrow as pa

from rexeval.threads import cpu_threads


@dataclass(frozen=True)
class Resources:
    """What one actor of a stage needs from the cluster."""

    cpus: float = 1.0
    gpus: float = 0.0
    # Custom resources (name, amount), e.g. (("accel", 1.0),): what puts the actor on a
    # node type of the cluster's own (an accelerator pool, a spot group), and what an
    # autoscaler reads to start that type. A tuple, so Resources stays hashable.
    custom: tuple[tuple[str, float], ...] = ()
    # Bytes of memory the actor reserves (Ray's `memory` resource); 0: none reserved. An
    # autoscaler reads it, as it reads the CPUs, to pick a node type with room.
    memory: float = 0.0

    @property
    def ray_resources(self) -> dict[str, float] | None:
        """The custom resources as Ray's `resources=` option takes them (None when none)."""
        return dict(self.custom) or None


class Stage(abc.ABC):
    """A named, resourced batch transformation."""

    name: str = "stage"
    resources: Resources = Resources()
    batch_size: int | None = None

    def setup(self) -> None:
        """Load models or other per-actor state; called once per actor."""

    @abc.abstractmethod
    def process(self, batch: pa.Table) -> pa.Table:
        """Transform one batch of rows."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.process(batch)


# -- actor sizing: how many actors a stage gets, and what each one holds ----------------
#
# Sizes come from the job's settings (`workers`, `min_workers`, `cpus_per_worker`,
# `gpus_per_worker`, `memory_per_worker`), never from the nodes a cluster has up when the
# job starts: on an autoscaling cluster those are whatever happens to be running (a cold
# one: a head with no CPUs), and the settings' requests are what makes it add nodes.
# The one exception is a Ray that the job started on its own machine (`runtime.init_ray`
# with no address: a laptop run, a local study): nothing can join it, so an actor's
# default share is of that machine's CPUs, as it always was.

CLUSTER_CPUS_PER_WORKER = 1.0
"""An actor's CPUs on a cluster when its settings name none: one, which every node type
holds (a larger default could ask for an actor no node type fits, which waits forever).
Model stages on a cluster should say `cpus_per_worker`; its threads follow it."""

ONE_MACHINE_ENV = "REXEVAL_ONE_MACHINE"
"""Set by `runtime.init_ray` when it starts Ray in-process: "<GCS address> <CPUs>". A
process (or a child of it: a local study's step) joined to that Ray sizes by the machine."""

GIB = 1024 ** 3

# What the sizing fields of every job settings class with workers say.
CPUS_PER_WORKER = ("CPUs each worker actor asks for, and uses as threads (default: on a Ray "
                   "started on this machine, its CPUs shared by `workers`; on a cluster, 1)")
MEMORY_PER_WORKER = ("GiB of memory each worker actor reserves (Ray's `memory` resource, which "
                     "an autoscaler reads to choose a node type); default: none reserved")


def machine_cpus(*, free: bool = False) -> float | None:
    """The CPUs of the one machine this job's Ray runs on, or (free=True) those not held
    now (a Serve replica, another stage's actors): when Ray is not running (unit tests,
    the machine's cores) or was started in-process by `runtime.init_ray` here or in a
    parent process. None on a cluster joined by address, whose size is its autoscaler's
    to change: nothing is read from the nodes that are up."""
    import ray

    if not ray.is_initialized():
        return float(os.cpu_count() or 1)
    address, _, cpus = os.environ.get(ONE_MACHINE_ENV, "").rpartition(" ")
    if not cpus or address != ray.get_runtime_context().gcs_address:
        return None
    if free:
        return float(ray.available_resources().get("CPU", 0))
    return float(cpus)


def worker_resources(cfg, *, free: bool = False) -> Resources:
    """What each model actor of `cfg` asks for: `cfg.cpus_per_worker` CPUs (its torch
    threads), else `cpu_share(cfg.workers)`; its GPUs, memory and custom resources as
    the settings say.

    `cfg` is any settings object with `workers`, `cpus_per_worker` and `gpus_per_worker`
    (LLM jobs, embedding and pair-scoring stages, metric families). `free`: on one
    machine, share the CPUs free now: for jobs that run beside a Serve replica.
    """
    cpus = cfg.cpus_per_worker or cpu_share(getattr(cfg, "workers", None) or 1, free=free)
    return Resources(cpus=cpus, gpus=cfg.gpus_per_worker, custom=custom_resources(cfg),
                     memory=memory_bytes(cfg))


def custom_resources(cfg) -> tuple[tuple[str, float], ...]:
    """`cfg.resources_per_worker` (custom Ray resources each actor asks for) as
    `Resources.custom`; empty for settings without it."""
    return tuple(sorted((getattr(cfg, "resources_per_worker", None) or {}).items()))


def memory_bytes(cfg) -> float:
    """`cfg.memory_per_worker` (GiB) in bytes, as `Resources.memory`; 0 when not set."""
    return float((getattr(cfg, "memory_per_worker", None) or 0) * GIB)


def cpu_share(workers: int, *, free: bool = False) -> float:
    """An actor's CPUs when its settings name none: on one machine (`machine_cpus`), its
    CPUs (or the free ones) shared by `workers` actors, whole and at least one; on a
    cluster, `CLUSTER_CPUS_PER_WORKER`."""
    cpus = machine_cpus(free=free)
    if cpus is None:
        return CLUSTER_CPUS_PER_WORKER
    return max(1.0, float(int(cpus // max(1, workers))))


def pool_size(workers: int | None, tasks: int | None = None, least: int = 1) -> tuple[int, int | None]:
    """(min, max) actors of a stage's pool, as Ray Data's autoscaling actor pool takes them.

    The most is `workers` when given (model stages: each actor loads the model), else
    one per task (no bound when the task count is unknown), and never more than `tasks`;
    the least is `least` (a job's `min_workers`), at most the most. Ray Data adds actors
    while work is queued, and on an autoscaling cluster its resource requests make the
    autoscaler bring nodes for them; `least == workers` asks for a fixed pool."""
    most = workers if workers is not None else tasks
    if most is not None:
        most = max(1, min(most, tasks) if tasks is not None else most)
    return (max(1, least) if most is None else max(1, min(least, most))), most


def actor_count(workers: int | None, tasks: int | None = None, resources: Resources = Resources()) -> int:
    """A number of actors, for the few stages that size per-actor shares from it:
    `workers` when given; else as many as one machine's CPUs hold at `resources` each
    (`fits_machine`), or on a cluster one per task (the most its pool may grow to);
    never more than `tasks`, at least one."""
    n = workers if workers is not None else (fits_machine(resources) or tasks or 1)
    if tasks is not None:
        n = min(n, tasks)
    return max(1, n)


def fits_machine(resources: Resources) -> int | None:
    """How many actors of `resources` the job's one machine holds at once (at least one;
    one for a GPU stage), or None on a cluster, whose size is not read."""
    cpus = machine_cpus()
    if cpus is None:
        return None
    if resources.gpus:
        return 1
    return max(1, int(cpus // max(resources.cpus, 0.001)))


def at_once(concurrency: tuple[int, int | None], resources: Resources) -> int:
    """Actors of a (min, max) pool worth starting at once: on one machine, as many as it
    holds (within the range); on a cluster, the least, and the pool grows from there."""
    lo, hi = concurrency
    fits = fits_machine(resources)
    if fits is None:
        return lo
    return max(lo, fits if hi is None else min(hi, fits))


def use_cpus(resources: Resources) -> None:
    """Let torch use the cores Ray gave this actor (Ray sets OMP threads to 1 otherwise),
    no more than REXEVAL_MAX_THREADS where that is set (`rexeval.threads`).
    Where torch is not loaded yet, the count goes to OMP_NUM_THREADS, which torch reads
    when it loads: an actor whose backend never loads torch (a server's client, a backend
    of your own) is spared its import, ~1 s of CPU per actor."""
    if resources.cpus >= 1:
        torch = sys.modules.get("torch")
        if torch is None:
            os.environ["OMP_NUM_THREADS"] = str(cpu_threads(resources.cpus))
        else:
            torch.set_num_threads(cpu_threads(resources.cpus))
