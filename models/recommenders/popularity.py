"""RANDOM and the popularity baselines of seed 002 (section 5.1.1, eq. 2-4).

Counts come from the training interactions only, and a statement counts once per
interaction (delta(s in S_ui)): USERPOP counts the user's training interactions that
contain s, ITEMPOP the item's, GLOBALPOP all of them. Candidates the counts do not
cover score 0, and ties are left to the evaluator's rule (lower statement index first,
statement indices being hash-ordered by the builder).

RANDOM scores each (interaction, statement) with a seeded 64-bit hash, so its ranking
does not depend on batch size, device or evaluation order.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from rexeval.models.recommenders.base import Ranker, register_ranker

_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9 as a signed int64
_M2 = -7723592293110705685  # 0x94D049BB133111EB
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def hash_uniform(rows: torch.Tensor, n_cols: int, seed: int) -> torch.Tensor:
    """[B] rows -> [B, n_cols] float32 in [0, 1): splitmix64 of (seed, row, column).

    int64 multiplication wraps modulo 2^64 on every torch backend, which is what the
    mixer needs; the top 24 bits become the float.
    """
    salt = (int(seed) * 0xBF58476D1CE4E5B9 + 1) % (1 << 64)
    salt = salt - (1 << 64) if salt >= 1 << 63 else salt
    cols = torch.arange(n_cols, device=rows.device, dtype=torch.int64)
    x = (rows.to(torch.int64)[:, None] * _GOLDEN) ^ (cols[None, :] + salt)
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    x = x ^ _shr(x, 31)
    return _shr(x, 40).to(torch.float32) * (1.0 / (1 << 24))


@register_ranker("random")
class RandomRanker(Ranker):
    """RANDOM: a uniformly random ranking, reproducible from `seed`."""

    def __init__(self, n_statements: int, seed: int = 0):
        self.n_statements = n_statements
        self.seed = int(seed)

    @classmethod
    def fit(cls, data, seed: int = 0, **_) -> RandomRanker:
        return cls(data.n_statements, seed)

    def score_all(self, users, items, rows):
        return hash_uniform(rows, self.n_statements, self.seed)


def count_matrix(keys: np.ndarray, statements: np.ndarray, n_keys: int, n_statements: int) -> sp.csr_matrix:
    """key x statement counts of the given (deduplicated) training pairs."""
    m = sp.csr_matrix((np.ones(len(keys), dtype=np.float32), (keys, statements)),
                      shape=(n_keys, n_statements))
    m.sum_duplicates()
    return m


class _CountRanker(Ranker):
    """Scores = a row of a count matrix (user's, item's, or the global row)."""

    key = "user"

    def __init__(self, counts: sp.csr_matrix):
        self.counts = counts.tocsr()

    @classmethod
    def fit(cls, data, **_) -> _CountRanker:
        t = data.triplet_arrays()  # train (user, item, statement), one per interaction
        if cls.key == "user":
            return cls(count_matrix(t[:, 0], t[:, 2], data.n_users, data.n_statements))
        if cls.key == "item":
            return cls(count_matrix(t[:, 1], t[:, 2], data.n_items, data.n_statements))
        return cls(count_matrix(np.zeros(len(t), dtype=np.int64), t[:, 2], 1, data.n_statements))

    def _keys(self, users: torch.Tensor, items: torch.Tensor) -> np.ndarray:
        src = users if self.key == "user" else items if self.key == "item" else torch.zeros_like(users)
        return src.cpu().numpy()

    def score_all(self, users, items, rows):
        keys = self._keys(users, items)
        if self.key == "global":
            row = torch.from_numpy(self.counts.toarray()[0]).to(users.device)
            return row.unsqueeze(0).expand(len(keys), -1).clone()
        return torch.from_numpy(self.counts[keys].toarray()).to(users.device)


@register_ranker("userpop")
class UserPop(_CountRanker):
    """USERPOP (eq. 2): a statement scores how many of the user's training interactions
    contain it."""

    key = "user"


@register_ranker("itempop")
class ItemPop(_CountRanker):
    """ITEMPOP (eq. 3): a statement scores how many of the item's training interactions
    contain it."""

    key = "item"


@register_ranker("globalpop")
class GlobalPop(_CountRanker):
    """GLOBALPOP (eq. 4): a statement scores how many training interactions contain it."""

    key = "global"


BASELINES = ("random", "userpop", "itempop", "globalpop")
