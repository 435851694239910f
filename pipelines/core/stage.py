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


def worker_resources(cfg) -> Resources:
    """Each actor's share: a CPU model uses every core it is given (torch threads).

    `cfg` is any job settings object with `workers`, `cpus_per_worker` and
    `gpus_per_worker` (LLM jobs, embedding and pair-scoring stages).
    """
    if cfg.cpus_per_worker:
        return Resources(cpus=cfg.cpus_per_worker, gpus=cfg.gpus_per_worker)
    import ray

    total = ray.cluster_resources().get("CPU", 1) if ray.is_initialized() else (os.cpu_count() or 1)
    return Resources(cpus=max(1.0, float(int(total // cfg.workers))), gpus=cfg.gpus_per_worker)


def use_cpus(resources: Resources) -> None:
    """Let torch use the cores Ray gave this actor (Ray sets OMP threads to 1 otherwise)."""
    if resources.cpus >= 1:
        import torch

        torch.set_num_threads(int(resources.cpus))
