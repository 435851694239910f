"""Shared by the recommender tests: a planted training graph, a few full-batch BPR steps
with seeded negatives, and the eval-cache checks every trainable ranker must pass."""
from __future__ import annotations

import numpy as np
import torch

from rexeval.models.recommenders.base import TrainGraph


def train_steps(model: torch.nn.Module, graph: TrainGraph, steps: int = 50,
                lr: float = 0.05, seed: int = 0) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    t = torch.as_tensor(graph.triplets)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        neg = torch.randint(0, graph.n_statements, (len(t),), generator=gen)
        neg_items = torch.randint(0, graph.n_items, (len(t),), generator=gen)
        loss = model.loss(t[:, 0], t[:, 1], t[:, 2], neg, neg_items)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def planted_graph(seed: int = 0, n_users: int = 8, n_items: int = 6, n_groups: int = 4,
                  per_group: int = 5) -> TrainGraph:
    """Users of group g only ever explain with statements of group g."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        group = np.arange(per_group) + (u % n_groups) * per_group
        for i in rng.choice(n_items, size=3, replace=False):
            for s in rng.choice(group, size=2, replace=False):
                rows.append((u, i, s))
    return TrainGraph.from_triplets(n_users, n_items, n_groups * per_group, np.array(rows))


def check_eval_cache(model, graph: TrainGraph) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode scores are cached, reused, dropped by a training step and recomputed;
    returns the (users, items) used, for model-specific in-place edit checks."""
    model.eval()
    u, i = torch.tensor([0, 3]), torch.tensor([1, 2])
    first = model.score_all(u, i, torch.arange(2))
    cached = model._cache[1]
    second = model.score_all(u, i, torch.arange(2))
    assert model._cache[1] is cached
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    train_steps(model, graph, steps=1)
    assert model._cache is None  # train() dropped it
    model.eval()
    assert not torch.allclose(first, model.score_all(u, i, torch.arange(2)))
    return u, i
