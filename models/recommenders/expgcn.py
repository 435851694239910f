"""ExpGCN (Wei et al. 2023): rank statements with LightGCN-style propagation over three
bipartite subgraphs of the training split (seed 002 sections 5.1.1-5.1.2).

Our reading, written from the paper's description:

* one ego embedding table each for users, items and statements (dim d).
* three bipartite subgraphs from `TrainGraph`: user-statement, item-statement and
  user-item. Each becomes an undirected homogeneous graph over n_a + n_b nodes (b side
  offset by n_a), symmetric-normalised once (D^-1/2 A D^-1/2, no self loops, like
  LightGCN) and propagated L times without weights or non-linearity; the subgraph's output
  is the mean of layers 0..L (LightGCN layer combination). L=0 returns the ego rows.
* user-statement gives h_u^US, h_s^US; item-statement gives h_i^IS, h_s^IS; user-item
  gives h_u^UI, h_i^UI. Scoring vectors: h_u = h_u^US + h_u^UI, h_i = h_i^IS + h_i^UI.
* relevance r_uis = h_u . h_s^US + h_i . h_s^IS (user score + item score).
* loss: BPR on r_uis with a sampled negative statement, + rec_weight * BPR on the
  user-item score h_u^UI . h_i^UI with a sampled negative item (ExpGCN's multi-task item
  recommendation), + reg * squared L2 of the batch's ego rows (user, item, positive and
  negative statement, negative item) / batch size.

Paper settings (seed 002): d=128, reg (gamma)=1e-3, L=4 for the user-statement and
item-statement subgraphs, L=2 for user-item.

Each subgraph's propagation is the one LightGCN of rexeval
(`models/recommenders/lightgcn.py`, `BipartitePropagation`: cached sparse adjacency by
default, torch_geometric's LGConv with `sparse=False`, the same numbers); its
normalised edges are non-persistent buffers, so a checkpoint is loaded into a model built
from the same training graph.

Eval-mode `score_all` caches the propagated embeddings; the cache is dropped on `train()`,
on `invalidate()`, and whenever a parameter is changed in place (optimizer step,
`load_state_dict`) or moved.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from rexeval.models.recommenders.base import (
    TrainableRanker,
    TrainGraph,
    register_ranker,
)
from rexeval.models.recommenders.lightgcn import INIT_STD, BipartitePropagation


SUBGRAPHS = ("us", "is", "ui")


class Propagated(NamedTuple):
    """Layer-combined outputs of the three subgraphs."""

    user_us: torch.Tensor
    stmt_us: torch.Tensor
    item_is: torch.Tensor
    stmt_is: torch.Tensor
    user_ui: torch.Tensor
    item_ui: torch.Tensor

    def user_vec(self) -> torch.Tensor:
        return self.user_us + self.user_ui

    def item_vec(self) -> torch.Tensor:
        return self.item_is + self.item_ui


@register_ranker("expgcn")
class ExpGCN(TrainableRanker):
    """ExpGCN statement ranker: LightGCN propagation on user-statement, item-statement
    and user-item subgraphs; relevance = user score + item score."""

    def __init__(self, n_users: int, n_items: int, n_statements: int, graph: TrainGraph,
                 dim: int = 128, layers_us: int = 4, layers_is: int = 4,
                 layers_ui: int = 2, reg: float = 1e-3, rec_weight: float = 1.0,
                 seed: int = 0, statement_features: object | None = None,
                 sparse: bool = True) -> None:
        super().__init__()
        del statement_features  # accepted so every trainable ranker shares a call shape
        _check_args(n_users, n_items, n_statements, graph, dim,
                    (layers_us, layers_is, layers_ui), reg, rec_weight)
        self.n_users, self.n_items, self.n_statements = n_users, n_items, n_statements
        self.dim, self.reg, self.rec_weight = dim, float(reg), float(rec_weight)
        self.layers = {"us": int(layers_us), "is": int(layers_is), "ui": int(layers_ui)}
        self.sizes = {"us": (n_users, n_statements), "is": (n_items, n_statements),
                      "ui": (n_users, n_items)}
        self.sparse = bool(sparse)

        gen = torch.Generator().manual_seed(int(seed))
        self.user_emb = torch.nn.Parameter(torch.randn(n_users, dim, generator=gen) * INIT_STD)
        self.item_emb = torch.nn.Parameter(torch.randn(n_items, dim, generator=gen) * INIT_STD)
        self.stmt_emb = torch.nn.Parameter(
            torch.randn(n_statements, dim, generator=gen) * INIT_STD)

        edges = {"us": graph.user_statement, "is": graph.item_statement,
                 "ui": graph.user_item}
        self.props = torch.nn.ModuleDict({
            key: BipartitePropagation(edges[key], *self.sizes[key], self.layers[key], self.sparse)
            for key in SUBGRAPHS})

    # -- propagation ----------------------------------------------------------------

    def propagate(self, key: str, x_a: torch.Tensor, x_b: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean of layers 0..L of LightGCN on subgraph `key`, split back into sides."""
        return self.props[key](x_a, x_b)

    def forward_all(self) -> Propagated:
        """Propagate all three subgraphs from the current ego embeddings."""
        u_us, s_us = self.propagate("us", self.user_emb, self.stmt_emb)
        i_is, s_is = self.propagate("is", self.item_emb, self.stmt_emb)
        u_ui, i_ui = self.propagate("ui", self.user_emb, self.item_emb)
        return Propagated(u_us, s_us, i_is, s_is, u_ui, i_ui)

    def embeddings(self) -> Propagated:
        """Propagated embeddings; cached (no grad) in eval mode, fresh in train mode."""
        return self.eval_cached(self.forward_all)

    def _apply(self, fn, *args, **kwargs):
        """Device/dtype moves drop the cached propagation (the subgraphs drop their adjacency)."""
        self.invalidate()
        return super()._apply(fn, *args, **kwargs)

    # -- scoring --------------------------------------------------------------------

    def score_all(self, users: torch.Tensor, items: torch.Tensor,
                  rows: torch.Tensor) -> torch.Tensor:
        """[B, n_statements] r_uis = h_u . h_s^US + h_i . h_s^IS as one GEMM; `rows`
        unused (deterministic model). No autograd graph in eval mode."""
        with torch.set_grad_enabled(self.training and torch.is_grad_enabled()):
            return self._score_all(self._index(users), self._index(items))

    def _score_all(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        h = self.embeddings()
        left = torch.cat([h.user_vec()[users], h.item_vec()[items]], dim=1)
        right = torch.cat([h.stmt_us, h.stmt_is], dim=1)
        return (left @ right.T).float()

    @staticmethod
    def _pair(h: Propagated, users: torch.Tensor, items: torch.Tensor,
              stmts: torch.Tensor) -> torch.Tensor:
        return ((h.user_vec()[users] * h.stmt_us[stmts]).sum(-1)
                + (h.item_vec()[items] * h.stmt_is[stmts]).sum(-1))

    def pair_scores(self, users: torch.Tensor, items: torch.Tensor,
                    stmts: torch.Tensor) -> torch.Tensor:
        """r_uis for aligned [B] users, items and statements."""
        h = self.embeddings()
        return self._pair(h, self._index(users), self._index(items), self._index(stmts))

    # -- training -------------------------------------------------------------------

    def loss(self, users: torch.Tensor, items: torch.Tensor, pos: torch.Tensor,
             neg: torch.Tensor, neg_items: torch.Tensor) -> torch.Tensor:
        """Statement BPR + rec_weight * user-item BPR + reg * ego L2 / B."""
        users, items = self._index(users), self._index(items)
        pos, neg, neg_items = self._index(pos), self._index(neg), self._index(neg_items)
        h = self.forward_all()
        diff = self._pair(h, users, items, pos) - self._pair(h, users, items, neg)
        total = -F.logsigmoid(diff).mean()
        if self.rec_weight > 0:
            hu = h.user_ui[users]
            rec = (hu * h.item_ui[items]).sum(-1) - (hu * h.item_ui[neg_items]).sum(-1)
            total = total + self.rec_weight * -F.logsigmoid(rec).mean()
        ego = (self.user_emb[users].pow(2).sum() + self.item_emb[items].pow(2).sum()
               + self.item_emb[neg_items].pow(2).sum()
               + self.stmt_emb[torch.cat([pos, neg])].pow(2).sum())
        return total + self.reg * ego / users.shape[0]

    def _index(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices as int64 on the model's device (callers may pass CPU or numpy)."""
        return torch.as_tensor(idx, dtype=torch.long, device=self.user_emb.device)


def _check_args(n_users: int, n_items: int, n_statements: int, graph: TrainGraph,
                dim: int, layers: tuple[int, int, int], reg: float,
                rec_weight: float) -> None:
    for name, v in (("n_users", n_users), ("n_items", n_items),
                    ("n_statements", n_statements), ("dim", dim)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if graph is None:
        raise ValueError("ExpGCN needs the training graph (graph=TrainGraph(...))")
    if (graph.n_users, graph.n_items, graph.n_statements) != (n_users, n_items, n_statements):
        raise ValueError(
            f"graph sizes (users={graph.n_users}, items={graph.n_items}, statements="
            f"{graph.n_statements}) do not match the model ({n_users}, {n_items}, "
            f"{n_statements})")
    for name, v in zip(("layers_us", "layers_is", "layers_ui"), layers):
        if int(v) < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if reg < 0:
        raise ValueError(f"reg must be >= 0, got {reg}")
    if rec_weight < 0:
        raise ValueError(f"rec_weight must be >= 0, got {rec_weight}")
