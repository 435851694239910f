"""Combining pairwise verdicts: swap, majority vote, the two orders, win rates, bias,
and win / tie / loss shares with bootstrap intervals."""
import math

import numpy as np
import pandas as pd
import pytest

from rexeval.metrics.preference import (
    combine_orders,
    majority_vote,
    position_bias,
    swap,
    win_rates,
    win_tie_loss,
)


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


def test_win_tie_loss_hand_worked_with_ties_and_unreadable():
    v = pd.DataFrame({"judge": ["g"] * 9,
                      "system": ["x"] * 6 + ["y"] * 3,
                      # x: 2 wins, 1 loss, 1 tie, 2 unreadable (None and NaN); y: 1 win, 2 ties
                      "verdict": ["A", "A", "B", "C", None, float("nan"), "C", "A", "C"]})
    w = win_tie_loss(v, n_resamples=500).set_index("system")
    assert list(w.columns[:2]) == ["judge", "n"]
    x, y = w.loc["x"], w.loc["y"]
    assert (x["n"], x["unreadable"], x["wins"], x["ties"], x["losses"]) == (4, 2, 2, 1, 1)
    assert (x["win_rate"], x["tie_rate"], x["loss_rate"]) == (0.5, 0.25, 0.25)
    assert (y["n"], y["unreadable"], y["wins"], y["ties"], y["losses"]) == (3, 0, 1, 2, 0)
    assert y["win_rate"] == pytest.approx(1 / 3) and y["tie_rate"] == pytest.approx(2 / 3)
    # no losses at all: the loss share's interval is the point [0, 0]
    assert (y["loss_rate"], y["loss_low"], y["loss_high"]) == (0.0, 0.0, 0.0)
    for r in (x, y):
        for name in ("win", "tie", "loss"):
            assert 0 <= r[f"{name}_low"] <= r[f"{name}_rate"] <= r[f"{name}_high"] <= 1


def test_win_tie_loss_interval_is_a_point_when_every_pair_is_won():
    v = pd.DataFrame({"system": ["x"] * 5, "verdict": ["A"] * 5})
    r = win_tie_loss(v, by=["system"]).iloc[0]
    assert (r["win_rate"], r["win_low"], r["win_high"]) == (1.0, 1.0, 1.0)
    assert (r["tie_low"], r["tie_high"], r["loss_low"], r["loss_high"]) == (0.0, 0.0, 0.0, 0.0)


def test_win_tie_loss_bootstrap_matches_the_normal_approximation_for_large_n():
    n, wins = 400, 100
    v = pd.DataFrame({"system": ["x"] * n, "verdict": ["A"] * wins + ["B"] * 250 + ["C"] * 50})
    r = win_tie_loss(v, by=["system"], confidence=0.95, n_resamples=2000, seed=0).iloc[0]
    p = wins / n
    half = 1.96 * math.sqrt(p * (1 - p) / n)
    assert r["win_rate"] == 0.25
    assert abs(r["win_low"] - (p - half)) < 0.01 and abs(r["win_high"] - (p + half)) < 0.01
    # deterministic for a seed
    again = win_tie_loss(v, by=["system"], seed=0).iloc[0]
    assert (again["win_low"], again["win_high"]) == (r["win_low"], r["win_high"])


def test_win_tie_loss_edges():
    v = pd.DataFrame({"system": ["x", "y", "y"], "verdict": ["A", None, None]})
    w = win_tie_loss(v, by=["system"]).set_index("system")
    assert w.loc["x", "n"] == 1 and np.isnan(w.loc["x", "win_low"])  # one pair: no interval
    assert w.loc["y", "n"] == 0 and w.loc["y", "unreadable"] == 2 and np.isnan(w.loc["y", "win_rate"])
    with pytest.raises(ValueError, match="unknown verdict"):
        win_tie_loss(pd.DataFrame({"system": ["x"], "verdict": ["D"]}), by=["system"])
    with pytest.raises(ValueError, match="judge"):
        win_tie_loss(pd.DataFrame({"system": ["x"], "verdict": ["A"]}))
