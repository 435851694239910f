"""The unit of work of every pipeline: a stage with declared resources and batch size.

Modelled on NeMo Curator's ProcessingStage: a stage names itself, says what it needs
(CPUs, GPUs) and how many rows it wants per call, loads its model once in `setup()`,
and maps a batch (a pyarrow Table) to a batch. The same object runs in a unit test on
a plain table, and on Ray Data inside an actor pool (`pipelines.core.runtime.map_stage`).
"""
from __future__ import annotations

import abc
import os
from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class Resources:
    """What one actor of a stage needs from the cluster."""

    cpus: float = 1.0
    gpus: float = 0.0


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


def _cpus(free: bool) -> float:
    """The cluster's CPUs, or (free=True) those not held now (a Serve replica, another
    job's actors); the machine's cores when Ray is not running (unit tests)."""
    import ray

    if not ray.is_initialized():
        return float(os.cpu_count() or 1)
    pool = ray.available_resources() if free else ray.cluster_resources()
    return float(pool.get("CPU", 1))


def worker_resources(cfg, *, free: bool = False) -> Resources:
    """Each of `cfg.workers` model actors' share of the CPUs (a CPU model uses every core
    it is given, as torch threads), unless `cfg.cpus_per_worker` says; GPUs as given.

    `cfg` is any settings object with `workers`, `cpus_per_worker` and `gpus_per_worker`
    (LLM jobs, embedding and pair-scoring stages, metric families). `free` shares the CPUs
    free now instead of the cluster's: for jobs that run beside a Serve replica.
    """
    if cfg.cpus_per_worker:
        return Resources(cpus=cfg.cpus_per_worker, gpus=cfg.gpus_per_worker)
    return Resources(cpus=cpu_share(cfg.workers, free=free), gpus=cfg.gpus_per_worker)


def _largest_node_cpus() -> float:
    """The CPUs of the cluster's largest alive node (the machine's cores without Ray): an
    actor lives on one node, so it can never hold more, whatever the cluster's total."""
    import ray

    if not ray.is_initialized():
        return float(os.cpu_count() or 1)
    sizes = [n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    return float(max(sizes, default=1.0))


def cpu_share(workers: int, *, free: bool = False) -> float:
    """Whole CPUs each of `workers` actors gets of the cluster's (or the free) CPUs, at
    least one, and never more than one node has (on a cluster of several nodes the total
    would ask for an actor no node can hold, and it would wait forever)."""
    return max(1.0, float(int(min(_cpus(free) // workers, _largest_node_cpus()))))


def pool_size(workers: int | None, tasks: int | None = None) -> tuple[int, int | None]:
    """(min, max) actors of a stage's pool, as Ray Data's autoscaling actor pool takes them.

    `workers` given (model stages: each actor loads the model): exactly that many, never
    more than `tasks`. Otherwise from one actor up to one per task (no bound when the
    task count is unknown): Ray Data adds actors while work is queued and the cluster has
    room, and on an autoscaling cluster its resource requests make the autoscaler bring
    nodes. Nothing here counts the cluster's resources at start, which on a cluster that
    is still growing (a GPU worker group at 0) would size the pool for the nodes that
    happen to be up."""
    if workers is not None:
        n = max(1, min(workers, tasks) if tasks is not None else workers)
        return n, n
    return 1, (max(1, tasks) if tasks is not None else None)


def actor_count(workers: int | None, tasks: int | None = None, resources: Resources = Resources()) -> int:
    """A fixed number of actors, for the few stages that size per-actor shares from it:
    `workers` when given, else as many as the cluster's CPUs hold at `resources.cpus`
    each (one for a GPU stage); never more than `tasks`, at least one. Sharded jobs use
    `pool_size`, which lets the pool grow instead."""
    n = workers if workers is not None else fits_now(resources)
    if tasks is not None:
        n = min(n, tasks)
    return max(1, n)


def fits_now(resources: Resources) -> int:
    """How many actors of `resources` the cluster's CPUs hold at once now (at least one)."""
    if resources.gpus:
        return 1
    return max(1, int(_cpus(free=False) // max(resources.cpus, 0.001)))


def use_cpus(resources: Resources) -> None:
    """Let torch use the cores Ray gave this actor (Ray sets OMP threads to 1 otherwise)."""
    if resources.cpus >= 1:
        import torch

        torch.set_num_threads(int(resources.cpus))
