"""The unit of work of every pipeline: a stage with declared resources and batch size.

Modelled on NeMo Curator's ProcessingStage: a stage names itself, says what it needs
(CPUs, GPUs) and how many rows it wants per call, loads its model once in `setup()`,
and maps a batch (a pyarrow Table) to a batch. The same object runs in a unit test on
a plain table, and on Ray Data inside an actor pool (`pipelines.ray_runtime.map_stage`).
"""
from __future__ import annotations

import abc
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
