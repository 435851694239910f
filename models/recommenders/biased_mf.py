"""BiasedMF (Koren, Bell & Volinsky, IEEE Computer 2009): the rating model behind seed
004's user-based and item-based explanations.

ALERT (seed 004, section 5.1) explains a recommendation with the users or items most
similar to the ones at hand ("users with tastes like yours liked this", "this is like an
item you bought"), and finds them with a BiasedMF trained on the ratings. The model
predicts r_ui = mu + b_u + b_i + p_u . q_i: a fixed global mean, a bias per user and per
item, and the dot product of a user and an item factor vector. It is fitted to the
observed ratings by squared error plus L2 on the parameters the rating touches. Similar
users (items) are then the rows of the user (item) factor matrix with the highest cosine
to the query's row (`nearest`).

Where we differ from the paper: it fits by stochastic gradient descent one rating at a
time; we use Adam on shuffled mini-batches (the trainer in
`pipelines/generate/prompted/mf.py`), and the L2 term is averaged over the batch's
ratings rather than added per rating. mu is the training mean, kept fixed (a buffer, not
a parameter), and predictions are not clipped to the rating scale.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class BiasedMF(torch.nn.Module):
    """mu + b_u + b_i + p_u . q_i with `dim` factors (see the module docstring). Factors
    start normal with std `init_std` drawn from a generator seeded with `seed`; biases
    start at zero; `global_mean` is mu, saved in the state dict but never trained."""

    def __init__(self, n_users: int, n_items: int, dim: int = 32, global_mean: float = 0.0,
                 init_std: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        for name, v in (("n_users", n_users), ("n_items", n_items), ("dim", dim)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if init_std < 0:
            raise ValueError(f"init_std must be >= 0, got {init_std}")
        self.n_users, self.n_items, self.dim = int(n_users), int(n_items), int(dim)
        gen = torch.Generator().manual_seed(int(seed))
        self.user_factors = torch.nn.Embedding(self.n_users, self.dim)
        self.item_factors = torch.nn.Embedding(self.n_items, self.dim)
        self.user_bias = torch.nn.Embedding(self.n_users, 1)
        self.item_bias = torch.nn.Embedding(self.n_items, 1)
        with torch.no_grad():
            self.user_factors.weight.copy_(torch.randn(self.n_users, self.dim, generator=gen) * init_std)
            self.item_factors.weight.copy_(torch.randn(self.n_items, self.dim, generator=gen) * init_std)
            self.user_bias.weight.zero_()
            self.item_bias.weight.zero_()
        self.register_buffer("global_mean", torch.tensor(float(global_mean)))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Predicted ratings of aligned [B] user and item indices, [B]."""
        p, q = self.user_factors(users), self.item_factors(items)
        return (self.global_mean + self.user_bias(users).squeeze(-1) + self.item_bias(items).squeeze(-1)
                + (p * q).sum(-1))

    def loss(self, users: torch.Tensor, items: torch.Tensor, ratings: torch.Tensor, reg: float) -> torch.Tensor:
        """Mean squared error on the batch + `reg` times the batch mean of
        ||p_u||^2 + ||q_i||^2 + b_u^2 + b_i^2 (the parameters each rating uses)."""
        p, q = self.user_factors(users), self.item_factors(items)
        bu, bi = self.user_bias(users).squeeze(-1), self.item_bias(items).squeeze(-1)
        pred = self.global_mean + bu + bi + (p * q).sum(-1)
        mse = (pred - ratings.to(pred.dtype)).pow(2).mean()
        l2 = (p.pow(2).sum(-1) + q.pow(2).sum(-1) + bu.pow(2) + bi.pow(2)).mean()
        return mse + float(reg) * l2


def _as_matrix(factors: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(factors, torch.Tensor):
        factors = factors.detach().cpu().numpy()
    x = np.asarray(factors)
    if x.ndim != 2:
        raise ValueError(f"factors must be a 2-d matrix, got shape {x.shape}")
    return x


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows in float64 scaled to unit length; a zero row stays zero, so its cosine with
    anything is 0. Non-finite values are refused."""
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("factors hold NaN or infinite values")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def nearest_batch(factors: torch.Tensor | np.ndarray, queries: Sequence[int] | np.ndarray,
                  candidates: Sequence[int] | np.ndarray | None, k: int) -> list[list[tuple[int, float]]]:
    """`nearest` for several query rows at once (one list per query, same rules): the
    candidate set is shared, each query is left out of its own list. Only the rows in
    use are normalised, so a small candidate set is cheap on a large matrix."""
    x = _as_matrix(factors)
    n = x.shape[0]
    qs = np.asarray(queries, dtype=np.int64).reshape(-1)
    if qs.size and (qs.min() < 0 or qs.max() >= n):
        raise IndexError(f"query index out of range [0, {n})")
    if candidates is None:
        cands = np.arange(n, dtype=np.int64)
    else:
        cands = np.unique(np.asarray(candidates, dtype=np.int64).reshape(-1))
        if cands.size and (cands.min() < 0 or cands.max() >= n):
            raise IndexError(f"candidate index out of range [0, {n})")
    k = int(k)
    out: list[list[tuple[int, float]]] = []
    if k <= 0 or cands.size == 0:
        return [[] for _ in qs]
    xc, xq = _unit_rows(x[cands]), _unit_rows(x[qs])
    for r, q in enumerate(qs.tolist()):
        # One matrix-vector product per query, so a query's similarities (and so its
        # ties) do not depend on which other queries share the call.
        sims = xc @ xq[r]
        keep = cands != q
        idx, sim = cands[keep], sims[keep]
        if k < len(idx):  # the k best and everything tied with the k-th, then sorted
            kth = np.partition(-sim, k - 1)[k - 1]
            top = -sim <= kth
            idx, sim = idx[top], sim[top]
        order = np.lexsort((idx, -sim))[:k]  # similarity desc, then index asc
        out.append([(int(idx[j]), float(sim[j])) for j in order])
    return out


def nearest(factors: torch.Tensor | np.ndarray, query: int, candidates: Sequence[int] | np.ndarray | None,
            k: int) -> list[tuple[int, float]]:
    """The `k` rows of `factors` most cosine-similar to row `query`, as (index, similarity)
    pairs sorted by similarity (highest first), then by index. `candidates` restricts the
    rows considered (None: every row); the query itself is never returned. A zero row has
    similarity 0 with every row (no NaN). Fewer than `k` pairs when there are fewer
    candidates."""
    return nearest_batch(factors, [int(query)], candidates, k)[0]
