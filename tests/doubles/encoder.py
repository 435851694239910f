"""A stand-in sentence encoder for the ExpScore tests: deterministic and model-free, so
relevance (REL) can be computed without downloading MiniLM."""
from __future__ import annotations

import zlib

import numpy as np


class HashingEncoder:
    """Deterministic fake sentence encoder: hashed word counts in 64 dimensions."""

    def encode(self, texts):
        out = np.zeros((len(texts), 64))
        for i, t in enumerate(texts):
            for w in str(t).lower().split():
                out[i, zlib.crc32(w.encode()) % 64] += 1.0
        out[:, 0] += 1e-3  # no all-zero rows
        return out
