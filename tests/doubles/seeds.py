"""The seed and the CPU threads of the tests that check learning (marker `learning`).

A learning test must pass with margin whatever they are, so the tests read them from
the environment and `benchmarks/learning_robustness.py` runs every learning test with
REXEVAL_TEST_SEED=0, 1, 2 and REXEVAL_TEST_THREADS=1, 2 (tests/conftest.py applies the
threads to torch for the session). Defaults: seed 0, torch's own thread count.
"""
from __future__ import annotations

import os

SEED = int(os.environ.get("REXEVAL_TEST_SEED", "0"))
THREADS = int(os.environ.get("REXEVAL_TEST_THREADS", "0")) or None


def seeded(base: int = 0) -> int:
    """`base` shifted by the session's seed: distinct seeds stay distinct."""
    return base + SEED
