"""A planted metric (tests/extension): the number of words of each explanation."""
from __future__ import annotations

import numpy as np

from rexeval.metrics.registry import TEXTS_GROUP, register_metric


@register_metric("scratch-words", higher_is_better=False, group=TEXTS_GROUP, inputs=("explanation",),
                 table="Scratch: explanation length", label="Words",
                 description="words per explanation (a planted metric)")
def scratch_words(explanations: list[str], references: list[str]) -> np.ndarray:
    return np.array([len(str(e or "").split()) for e in explanations], dtype=np.float64)
