"""A scripted paraphrase pair scorer for tests: no weights, rules on the words.

Plugged in as `cross_kind="tests.doubles.pair_scorer:NoIntensifierScorer"` (the pair-scorer
registry accepts package.module:Class), so the cluster job's cross-encoder path runs on
Ray actors exactly as with a real checkpoint, through PairScorer's own batching.
"""
from __future__ import annotations

import numpy as np

from rexeval.models.encoders.pair_scorer import PairScorer

INTENSIFIERS = {"really", "very"}


class NoIntensifierScorer(PairScorer):
    """P(paraphrase) = 0.95, except 0.2 when exactly one side has an intensifier word."""

    def __init__(self, location: str, **options):
        self.location = self.model_ref = str(location)
        self.device, self.batch_size = "cpu", 32

    def _encode(self, pairs):
        def has(t):
            return bool(INTENSIFIERS & set(t.lower().split()))

        # "input_ids" only sets the length PairScorer sorts batches by.
        return [{"input_ids": (a + " " + b).split(), "prob": 0.2 if has(a) != has(b) else 0.95}
                for a, b in pairs]

    def _forward(self, batch):
        return np.array([row["prob"] for row in batch], dtype=np.float32)
