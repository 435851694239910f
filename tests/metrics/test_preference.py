"""Combining pairwise verdicts: swap, majority vote, the two orders, win rates, bias."""
import math

import pandas as pd
import pytest

from rexeval.metrics.preference import combine_orders, majority_vote, position_bias, swap, win_rates


def test_swap_maps_back_and_keeps_ties_and_none():
    assert [swap(v) for v in ("A", "B", "C", None)] == ["B", "A", "C", None]


@pytest.mark.parametrize("votes, expected", [
    (["A", "A", "B", "C"], "A"),
    (["B", "B", "A", "A"], "C"),  # two criteria each: no side won more
    (["A", "C", "C", "B"], "C"),  # plurality of ties
    (["A", None, None, None], "A"),  # unreadable votes are left out
    ([None, None], None),
    (["B"], "B"),
])
def test_majority_vote(votes, expected):
    assert majority_vote(votes) == expected


def test_majority_vote_refuses_unknown_labels():
    with pytest.raises(ValueError, match="unknown verdict"):
        majority_vote(["A", "D"])


@pytest.mark.parametrize("first, second, rule, expected", [
    ("A", "A", "tie", "A"),
    ("A", "B", "tie", "C"),
    ("A", "B", "first", "A"),
    ("C", "A", "tie", "C"),
    ("B", None, "tie", "B"),
    (None, "A", "tie", "A"),
    (None, None, "tie", None),
])
def test_combine_orders(first, second, rule, expected):
    assert combine_orders(first, second, rule) == expected


def test_position_bias_hand_worked():
    # Pair 1: consistent A. Pair 2: the judge always picks the first shown (A, then the
    # swapped order's first slot = the pair's B). Pair 3: B, then unreadable.
    first = ["A", "A", "B"]
    second = ["A", "B", None]
    b = position_bias(first, second)
    assert b["pairs_both_orders"] == 2 and b["flips"] == 1 and b["flip_rate"] == 0.5
    # decisive verdicts: first order A, A, B -> first-slot picks 2 of 3; second order
    # (mapped back) A, B -> first slot chosen when "B": 1 of 2. Total 3 of 5.
    assert b["decisive_verdicts"] == 5 and b["first_slot_rate"] == pytest.approx(3 / 5)


def test_position_bias_without_pairs_is_nan():
    b = position_bias([None], ["A"])
    assert b["pairs_both_orders"] == 0 and math.isnan(b["flip_rate"])


def test_win_rates_with_ties_and_unreadable():
    v = pd.DataFrame({"system": ["x"] * 5 + ["y"] * 2, "verdict": ["A", "A", "B", "C", None, "B", "B"]})
    w = win_rates(v).set_index("system")
    assert w.loc["x", "n"] == 4 and w.loc["x", "unreadable"] == 1
    assert w.loc["x", "win_rate"] == 0.5 and w.loc["x", "loss_rate"] == 0.25 and w.loc["x", "tie_rate"] == 0.25
    assert w.loc["x", "win_rate_half_ties"] == pytest.approx(0.625)
    assert w.loc["y", "win_rate"] == 0 and w.loc["y", "loss_rate"] == 1
