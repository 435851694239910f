"""What every statement ranker is, and the registry that builds one by name.

A ranker scores every statement of the benchmark for a batch of interactions at once:
`score_all(users, items, rows)` returns a dense [B, n_statements] float tensor. The
evaluator (pipelines/star/evaluate.py) turns that into top-k lists with one batched top-k,
so a ranker never loops over interactions. Candidate restriction (item or user level)
is the evaluator's job: it masks the dense scores, so a ranker is level-agnostic.

Trainable rankers (BPER+, ExpGCN) are torch modules with `loss(batch)`; the training
loop (pipelines/star/train.py) samples batches, steps the optimizer, and saves
`state_dict()` checkpoints. Popularity baselines have no parameters: they `fit` counts.
"""
from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rexeval.models.recommenders import SCAN
from rexeval.registry import Registry

RANKERS: Registry[type] = Registry("ranker", normalize=str.lower, scan=SCAN)
"""Rankers by name (case-insensitive); the built-in modules load on the first look-up
of a name not registered yet."""

register_ranker = RANKERS.register
ranker_class = RANKERS.lookup


@dataclass
class TrainGraph:
    """The training split in index space, as models need it.

    `triplets` are the (user, item, statement) rows of training interactions, one per
    distinct statement of an interaction (deduplicated: a statement counts once per
    interaction, seed 002 eq. 2-4). The edge arrays are the distinct pairs of the three
    bipartite subgraphs, each [2, E] int64 (row 0: user or item, row 1: statement or item).
    """

    n_users: int
    n_items: int
    n_statements: int
    triplets: np.ndarray  # [T, 3] int64: user, item, statement
    user_statement: np.ndarray  # [2, E_us] int64
    item_statement: np.ndarray  # [2, E_is] int64
    user_item: np.ndarray  # [2, E_ui] int64

    @classmethod
    def from_triplets(cls, n_users: int, n_items: int, n_statements: int,
                      triplets: np.ndarray) -> TrainGraph:
        t = np.asarray(triplets, dtype=np.int64).reshape(-1, 3)

        def pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            if len(a) == 0:
                return np.zeros((2, 0), dtype=np.int64)
            return np.unique(np.stack([a, b]), axis=1)

        return cls(n_users, n_items, n_statements, t,
                   pairs(t[:, 0], t[:, 2]), pairs(t[:, 1], t[:, 2]), pairs(t[:, 0], t[:, 1]))


class Ranker(abc.ABC):
    """Scores all statements for a batch of interactions."""

    name: str = "ranker"
    trainable: bool = False

    @abc.abstractmethod
    def score_all(self, users: torch.Tensor, items: torch.Tensor,
                  rows: torch.Tensor) -> torch.Tensor:
        """[B] user, item and interaction indices -> [B, n_statements] float32 scores
        (higher ranks first). `rows` lets seeded rankers be independent of batching."""


class TrainableRanker(torch.nn.Module, Ranker):
    """A torch model trained with sampled negatives (BPR). Subclasses implement `loss`
    and `score_all`; `score_all` must be pure in eval mode (no dropout, cached
    propagation is fine)."""

    trainable = True

    _cache: tuple | None = None

    def eval_cached(self, compute: Callable[[], object]):
        """`compute()` in train mode; in eval mode its result, computed once (no grad) and
        reused until a parameter changes (`param_stamp`) or `invalidate()` is called."""
        if self.training:
            return compute()
        stamp = param_stamp(self)
        if self._cache is None or self._cache[0] != stamp:
            with torch.no_grad():
                self._cache = (stamp, compute())
        return self._cache[1]

    def invalidate(self) -> None:
        """Drop the eval cache (also done on `train()` and on parameter changes)."""
        self._cache = None

    def train(self, mode: bool = True):
        self.invalidate()
        return super().train(mode)

    @abc.abstractmethod
    def loss(self, users: torch.Tensor, items: torch.Tensor, pos: torch.Tensor,
             neg: torch.Tensor, neg_items: torch.Tensor) -> torch.Tensor:
        """Scalar training loss of a batch: [B] users, items, positive statements,
        [B] sampled negative statements and [B] sampled negative items (used by
        models with an item-recommendation term; others ignore it)."""


def param_stamp(module: torch.nn.Module) -> tuple:
    """Identity + in-place version of every parameter: it changes after an optimizer step,
    `load_state_dict` or `.to(device)`, so an eval cache keyed on it cannot go stale."""
    return tuple((p.data_ptr(), p._version, p.device) for p in module.parameters())
