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


def cpu_share(workers: int, *, free: bool = False) -> float:
    """Whole CPUs each of `workers` actors gets of the cluster's (or the free) CPUs, at least one."""
    return max(1.0, float(int(_cpus(free) // workers)))


def actor_count(workers: int | None, tasks: int | None = None, resources: Resources = Resources()) -> int:
    """Actors for a stage: `workers` when given (model stages: each actor loads the
    model), else as many as the CPUs free now allow at `resources.cpus` each (one for a
    GPU stage); never more than `tasks` (an idle actor still costs its start-up), at
    least one."""
    if workers is None:
        workers = 1 if resources.gpus else int(_cpus(free=True) // max(resources.cpus, 0.001))
    if tasks is not None:
        workers = min(workers, tasks)
    return max(1, workers)


def use_cpus(resources: Resources) -> None:
    """Let torch use the cores Ray gave this actor (Ray sets OMP threads to 1 otherwise)."""
    if resources.cpus >= 1:
        import torch

        torch.set_num_threads(int(resources.cpus))
