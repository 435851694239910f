"""Distinct-2 of one explanation: how much of it repeats itself.

Trained generators fail by looping ("great quality great quality great ..."); seed 000's
USR and DIV see repetition only across a system's explanations, never inside one. This
metric is the share of an explanation's word bigrams that are distinct: 1.0 for no
repeated bigram, lower the more it loops. Words are lower-cased runs of letters and
digits; an explanation of fewer than two words has no bigram and no value (NaN, counted
as missing, never as perfect).

It is also the extension guide's worked example (docs/extending.md): a metric that needs
no model is this one file. The registry's scan finds it; `rexeval evaluate --metrics
distinct-2` (or `--metrics texts`, every such metric) computes it; `table` and `label`
put it in the results tables.
"""
from __future__ import annotations

import re

import numpy as np

from rexeval.metrics.registry import TEXTS_GROUP, register_metric

_WORD = re.compile(r"[^\W_]+")


def distinct_bigram_ratio(text: str) -> float:
    """Distinct word bigrams / all word bigrams of `text`; NaN under two words."""
    words = _WORD.findall(str(text or "").lower())
    bigrams = list(zip(words, words[1:]))
    return len(set(bigrams)) / len(bigrams) if bigrams else float("nan")


@register_metric("distinct-2", higher_is_better=True, group=TEXTS_GROUP, inputs=("explanation",),
                 table="Repetition inside an explanation", label="Distinct-2",
                 description="share of an explanation's word bigrams that are distinct (1 = no repeats)")
def distinct_2(explanations: list[str], references: list[str]) -> np.ndarray:
    """One Distinct-2 per explanation (the references are not read)."""
    return np.array([distinct_bigram_ratio(e) for e in explanations], dtype=np.float64)
