"""A planted pairwise evaluator (tests/extension): the shorter explanation wins."""
from __future__ import annotations

import pandas as pd

from rexeval.pipelines.judge.evaluators import Evaluator, Judged, register_evaluator


@register_evaluator("scratch_shorter")
class ShorterWins(Evaluator):
    """Prefers the shorter explanation, by words (a planted evaluator)."""

    description = "the shorter explanation wins (a planted evaluator)"

    def judge(self, pairs: pd.DataFrame, run) -> Judged:
        a = pairs["explanation_a"].fillna("").str.split().str.len()
        b = pairs["explanation_b"].fillna("").str.split().str.len()
        verdict = ["A" if x < y else "B" if x > y else "C" for x, y in zip(a, b)]
        return Judged(pd.DataFrame({"pair_id": pairs["pair_id"], "verdict": verdict}), usage={"pairs": len(pairs)})
