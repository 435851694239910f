"""Shared by the recommender tests: a few full-batch BPR steps with seeded negatives."""
from __future__ import annotations

import torch

from models.recommenders.base import TrainGraph


def train_steps(model: torch.nn.Module, graph: TrainGraph, steps: int = 50,
                lr: float = 0.05) -> list[float]:
    gen = torch.Generator().manual_seed(0)
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
