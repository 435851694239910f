"""Scoring a batch's targets word by word through a generator's begin/step, the decoding
path, so tests can compare it with the training loss (`losses()["text"]`)."""
from __future__ import annotations

import torch

from rexeval.models.generators.base import PAD, Batch


@torch.no_grad()
def stepwise_nll(model, batch: Batch) -> float:
    """Mean negative log-likelihood of the batch's target tokens (PAD left out)."""
    state = model.begin(batch.user, batch.item, batch.rating)
    nll, count = 0.0, 0
    for t in range(batch.tokens.size(1) - 1):
        logp, state = model.step(state, batch.tokens[:, :t + 1])
        target = batch.tokens[:, t + 1]
        real = target != PAD
        nll -= float(logp.gather(1, target[:, None])[:, 0][real].sum())
        count += int(real.sum())
    return nll / count
