"""BPER+ (Li, Zhang & Chen 2023): rank statements by splitting user-item-statement
relevance into a user-statement and an item-statement score (seed 002 sections 5.1.1-5.1.2).

Our reading, written from the paper's description:

* user-statement score  r_us = p_u . q^U_s + b^U_s
* item-statement score  r_is = o_i . q^I_s + b^I_s
* statement vectors enriched with frozen sentence-encoder features f_s (BERT in the paper,
  any encoder here): q^U_s = e^U_s + W_U f_s and q^I_s = e^I_s + W_I f_s, with W_U, W_I
  bias-free linear maps from the feature size to d. Without features (`statement_features
  =None`) it is plain BPER: q^U_s = e^U_s, q^I_s = e^I_s.
* relevance r_uis = mu * r_us + (1 - mu) * r_is; mu weights the user side (mu=1: only the
  user matters, mu=0: only the item).
* loss: BPR on r_uis against one sampled negative statement, -log sigmoid(r_pos - r_neg)
  averaged over the batch, plus reg * (squared L2 norm of the batch's embedding rows:
  p_u, o_i, e^U/e^I and biases of the positive and negative statements) / batch size.
  The projections W are not regularised (they are shared, not per-row parameters).

Paper settings (seed 002): d=20, reg (gamma)=1e-5, mu=0.7.

The sentence features are a non-persistent buffer: they are not trained and they are not
written into `state_dict()` (they can be large); a checkpoint is loaded into a model built
with the same features.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rexeval.models.recommenders.base import (
    TrainableRanker,
    TrainGraph,
    register_ranker,
)

INIT_STD = 0.01


def _normal_table(rows: int, dim: int, gen: torch.Generator) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(rows, dim, generator=gen) * INIT_STD)


def _as_features(features: np.ndarray | torch.Tensor, n_statements: int) -> torch.Tensor:
    """Validated float32 [n_statements, F] copy of the encoder features."""
    f = torch.as_tensor(np.asarray(features) if not torch.is_tensor(features) else features)
    f = f.detach().to(torch.float32).cpu().clone()
    if f.dim() != 2:
        raise ValueError(f"statement_features must be 2-D [n_statements, F], got shape "
                         f"{tuple(f.shape)}")
    if f.shape[0] != n_statements:
        raise ValueError(f"statement_features has {f.shape[0]} rows but n_statements is "
                         f"{n_statements}")
    if f.shape[1] < 1:
        raise ValueError("statement_features needs at least one column")
    return f


@register_ranker("bper+")
class BPERPlus(TrainableRanker):
    """BPER+ statement ranker: mu-weighted user and item factorisation scores."""

    def __init__(self, n_users: int, n_items: int, n_statements: int, dim: int = 20,
                 mu: float = 0.7, reg: float = 1e-5,
                 statement_features: np.ndarray | torch.Tensor | None = None,
                 seed: int = 0, graph: TrainGraph | None = None) -> None:
        super().__init__()
        _check_sizes(n_users, n_items, n_statements, dim)
        if not 0.0 <= float(mu) <= 1.0:
            raise ValueError(f"mu must be in [0, 1], got {mu}")
        if reg < 0:
            raise ValueError(f"reg must be >= 0, got {reg}")
        del graph  # accepted so every trainable ranker is built with the same call shape
        self.n_users, self.n_items, self.n_statements = n_users, n_items, n_statements
        self.dim, self.mu, self.reg = dim, float(mu), float(reg)

        gen = torch.Generator().manual_seed(int(seed))
        self.user_emb = _normal_table(n_users, dim, gen)
        self.item_emb = _normal_table(n_items, dim, gen)
        self.stmt_user_emb = _normal_table(n_statements, dim, gen)
        self.stmt_item_emb = _normal_table(n_statements, dim, gen)
        self.stmt_user_bias = torch.nn.Parameter(torch.zeros(n_statements))
        self.stmt_item_bias = torch.nn.Parameter(torch.zeros(n_statements))

        self.proj_user: torch.nn.Linear | None = None
        self.proj_item: torch.nn.Linear | None = None
        if statement_features is not None:
            feats = _as_features(statement_features, n_statements)
            self.register_buffer("features", feats, persistent=False)
            self.proj_user = _projection(feats.shape[1], dim, gen)
            self.proj_item = _projection(feats.shape[1], dim, gen)
        else:
            self.features = None

    # -- statement side -------------------------------------------------------------

    def statement_vectors(self, idx: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """(q^U, q^I) for the statements `idx` (all when None)."""
        eu, ei = self.stmt_user_emb, self.stmt_item_emb
        if idx is not None:
            eu, ei = eu[idx], ei[idx]
        if self.features is None:
            return eu, ei
        f = self.features if idx is None else self.features[idx]
        return eu + self.proj_user(f), ei + self.proj_item(f)

    def _statement_matrix(self) -> torch.Tensor:
        """[N, 2d+2] right-hand side of the scoring GEMM: [q^U, q^I, b^U, b^I]."""
        qu, qi = self.statement_vectors()
        return torch.cat([qu, qi, self.stmt_user_bias[:, None],
                          self.stmt_item_bias[:, None]], dim=1)

    def _eval_statement_matrix(self) -> torch.Tensor:
        """Statement matrix, cached in eval mode (the feature projection is the costly
        part and does not depend on the batch)."""
        return self.eval_cached(self._statement_matrix)

    # -- scoring --------------------------------------------------------------------

    def pair_scores(self, users: torch.Tensor, items: torch.Tensor,
                    stmts: torch.Tensor) -> torch.Tensor:
        """r_uis for aligned [B] users, items and statements."""
        qu, qi = self.statement_vectors(stmts)
        r_us = (self.user_emb[users] * qu).sum(-1) + self.stmt_user_bias[stmts]
        r_is = (self.item_emb[items] * qi).sum(-1) + self.stmt_item_bias[stmts]
        return self.mu * r_us + (1.0 - self.mu) * r_is

    def score_all(self, users: torch.Tensor, items: torch.Tensor,
                  rows: torch.Tensor) -> torch.Tensor:
        """[B, n_statements] r_uis as one GEMM; `rows` is unused (the model is
        deterministic). No autograd graph in eval mode."""
        with torch.set_grad_enabled(self.training and torch.is_grad_enabled()):
            return self._score_all(self._index(users), self._index(items))

    def _score_all(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        b = users.shape[0]
        ones = torch.ones(b, 1, device=self.user_emb.device)
        left = torch.cat([self.mu * self.user_emb[users],
                          (1.0 - self.mu) * self.item_emb[items],
                          self.mu * ones, (1.0 - self.mu) * ones], dim=1)
        return (left @ self._eval_statement_matrix().T).float()

    # -- training -------------------------------------------------------------------

    def loss(self, users: torch.Tensor, items: torch.Tensor, pos: torch.Tensor,
             neg: torch.Tensor, neg_items: torch.Tensor) -> torch.Tensor:
        """BPR on r_uis + reg * squared L2 of the batch's rows / B; `neg_items` unused."""
        users, items = self._index(users), self._index(items)
        pos, neg = self._index(pos), self._index(neg)
        diff = self.pair_scores(users, items, pos) - self.pair_scores(users, items, neg)
        bpr = -F.logsigmoid(diff).mean()
        return bpr + self.reg * self._batch_l2(users, items, pos, neg) / users.shape[0]

    def _batch_l2(self, users: torch.Tensor, items: torch.Tensor, pos: torch.Tensor,
                  neg: torch.Tensor) -> torch.Tensor:
        stmts = torch.cat([pos, neg])
        return (self.user_emb[users].pow(2).sum() + self.item_emb[items].pow(2).sum()
                + self.stmt_user_emb[stmts].pow(2).sum()
                + self.stmt_item_emb[stmts].pow(2).sum()
                + self.stmt_user_bias[stmts].pow(2).sum()
                + self.stmt_item_bias[stmts].pow(2).sum())

    def _index(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices as int64 on the model's device (callers may pass CPU or numpy)."""
        return torch.as_tensor(idx, dtype=torch.long, device=self.user_emb.device)


def _projection(in_dim: int, dim: int, gen: torch.Generator) -> torch.nn.Linear:
    lin = torch.nn.Linear(in_dim, dim, bias=False)
    with torch.no_grad():
        torch.nn.init.xavier_uniform_(lin.weight, generator=gen)
    return lin


def _check_sizes(n_users: int, n_items: int, n_statements: int, dim: int) -> None:
    for name, v in (("n_users", n_users), ("n_items", n_items),
                    ("n_statements", n_statements)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if int(dim) < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
