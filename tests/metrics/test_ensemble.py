"""Ensembles of evaluators (seed 001, Figure 4): subsets, averaging and the sweep,
checked against hand-averaged scores and scipy on the arrays written out here."""
from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rexeval.metrics.agreement import Target, meta_evaluate
from rexeval.metrics.ensemble import (
    SUBSET_COLUMNS,
    SWEEP_COLUMNS,
    ensemble_subsets,
    ensemble_sweep,
    subset_mean,
)

# Five explanations of two users; three judges A, B, C and the human ratings.
USERS = ["u1", "u1", "u1", "u2", "u2"]
ITEMS = ["i1", "i1", "i2", "i1", "i1"]
HUMAN = [1, 2, 3, 4, 5]
A = [1, 3, 2, 5, 4]
B = [1, 2, 5, 3, 4]
C = [3, 3, 1, 5, 3]
# Every subset's mean per explanation, averaged by hand:
AVERAGED = {
    1: {"A": A, "B": B, "C": C},
    2: {"A + B": [1, 2.5, 3.5, 4, 4], "A + C": [2, 3, 1.5, 5, 3.5], "B + C": [2, 2.5, 3, 4, 3.5]},
    3: {"A + B + C": [5 / 3, 8 / 3, 8 / 3, 13 / 3, 11 / 3]},
}
# Dataset-level Pearson by hand (human deviations -2 -1 0 1 2, their sum of squares 10):
#   A: deviations -2 0 -1 2 1, cross 8, squares 10 -> 0.8
#   B: deviations -2 -1 2 0 1, cross 7, squares 10 -> 0.7
#   C: deviations 0 0 -2 2 0, cross 2, squares 8 -> 2 / sqrt(80)
#   A + B (sums 2 5 7 8 8): deviations -4 -1 1 2 2, cross 15, squares 26 -> 15 / sqrt(260)
#   A + C (sums 4 6 3 10 7): deviations -2 0 -3 4 1, cross 10, squares 30 -> 10 / sqrt(300)
#   B + C (sums 4 5 6 8 7): deviations -2 -1 0 2 1, cross 9, squares 10 -> 0.9
#   A + B + C (sums 5 8 8 13 11): deviations -4 -1 -1 4 2, cross 17, squares 38 -> 17 / sqrt(380)
PEARSON = {1: {"A": 0.8, "B": 0.7, "C": 2 / math.sqrt(80)},
           2: {"A + B": 15 / math.sqrt(260), "A + C": 10 / math.sqrt(300), "B + C": 0.9},
           3: {"A + B + C": 17 / math.sqrt(380)}}
SCIPY = {"pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}


def frame() -> pd.DataFrame:
    return pd.DataFrame({"user_id": USERS, "item_id": ITEMS, "human": HUMAN})


def scores() -> np.ndarray:
    return np.column_stack([A, B, C]).astype(float)


def sweep_row(summary, n, method="pearson", level="dataset"):
    r = summary[(summary.n == n) & (summary.method == method) & (summary.level == level)]
    assert len(r) == 1
    return r.iloc[0]


def test_hand_averaged_subsets_give_the_hand_pearson():
    for n, subsets in AVERAGED.items():
        for label, avg in subsets.items():
            assert stats.pearsonr(avg, HUMAN).statistic == pytest.approx(PEARSON[n][label])
    for members, label in (((0, 1), "A + B"), ((0, 2), "A + C"), ((1, 2), "B + C"), ((0, 1, 2), "A + B + C")):
        assert subset_mean(scores(), members) == pytest.approx(AVERAGED[len(members)][label])


def test_sweep_mean_min_max_per_n_at_the_dataset_level():
    per_subset, summary = ensemble_sweep(frame(), scores(), ["A", "B", "C"], "human", "persuasiveness",
                                         levels=["dataset"])
    assert list(per_subset.columns) == list(SUBSET_COLUMNS) and list(summary.columns) == list(SWEEP_COLUMNS)
    assert list(summary["n"]) == [1, 2, 3] * 3  # pearson, spearman, kendall
    for n, subsets in AVERAGED.items():
        for method, fn in SCIPY.items():
            want = {label: fn(avg, HUMAN).statistic for label, avg in subsets.items()}
            row = sweep_row(summary, n, method)
            assert row["n_subsets"] == row["n_possible"] == len(subsets) == math.comb(3, n)
            assert not row["sampled"] and row["n_defined"] == len(subsets) and row["n_judges"] == 3
            assert row["mean"] == pytest.approx(np.mean(list(want.values())))
            assert row["min"] == pytest.approx(min(want.values()))
            assert row["max"] == pytest.approx(max(want.values()))
    p1, p2, p3 = (sweep_row(summary, n) for n in (1, 2, 3))
    assert (p1["best"], p1["worst"]) == ("A", "C")
    assert p1["mean"] == pytest.approx((0.8 + 0.7 + 2 / math.sqrt(80)) / 3)
    assert (p2["best"], p2["worst"]) == ("A + B", "A + C")
    assert (p2["min"], p2["max"]) == (pytest.approx(10 / math.sqrt(300)), pytest.approx(15 / math.sqrt(260)))
    # N = K: exactly one subset, so mean = min = max.
    assert p3["n_subsets"] == 1 and p3["best"] == p3["worst"] == "A + B + C"
    assert p3["mean"] == p3["min"] == p3["max"] == pytest.approx(17 / math.sqrt(380))


def test_sweep_user_level_averages_the_users_of_each_subset():
    """u1 holds the first three explanations, u2 the last two. A + B gives u2 4 and 4,
    a constant, so its user level rests on u1 alone (an undefined group is left out)."""
    _, summary = ensemble_sweep(frame(), scores(), ["A", "B", "C"], "human", methods=["pearson"], levels=["user"])

    def r(x, y):
        return math.nan if len(set(x)) == 1 else stats.pearsonr(x, y).statistic

    for n, subsets in AVERAGED.items():
        per = [np.nanmean([r(avg[:3], HUMAN[:3]), r(avg[3:], HUMAN[3:])]) for avg in subsets.values()]
        row = sweep_row(summary, n, level="user")
        assert (row["mean"], row["min"], row["max"]) == (pytest.approx(np.mean(per)), pytest.approx(min(per)),
                                                         pytest.approx(max(per)))


def test_n_of_one_is_each_evaluator_alone():
    df = frame().assign(A=A, B=B, C=C)
    per_subset, _ = ensemble_sweep(frame(), scores(), ["A", "B", "C"], "human")
    alone = meta_evaluate(df, [Target(j, "", j, "human") for j in "ABC"], n_resamples=0)
    got = per_subset[per_subset.n == 1].rename(columns={"subset": "evaluator"}).drop(columns=["aspect", "n"])
    pd.testing.assert_frame_equal(got.reset_index(drop=True), alone[got.columns])


def test_missing_scores_follow_the_judge_null_policy():
    s = np.array([[4.0, np.nan], [2.0, 3.0], [np.nan, np.nan]])
    # 0 (seed 001): the gap counts as 0 in the mean -> (4 + 0) / 2, (2 + 3) / 2, 0.
    assert subset_mean(s, (0, 1), 0.0) == pytest.approx([2.0, 2.5, 0.0])
    # drop: the gap is left out of the mean; no score at all -> no mean.
    np.testing.assert_allclose(subset_mean(s, (0, 1), None), [4.0, 2.5, np.nan])
    unusable = np.array([[False, False], [False, True], [False, False]])
    np.testing.assert_allclose(subset_mean(s, (0, 1), 0.0, unusable), [2.0, np.nan, 0.0])
    np.testing.assert_allclose(subset_mean(s, (0,), 0.0, unusable), [4.0, 2.0, 0.0])  # B's mark: not A's


def test_rows_without_a_mean_are_left_out_like_dropped_rows():
    s = scores()
    s[4, 1] = np.nan  # B has no score for the last explanation
    per_subset, _ = ensemble_sweep(frame(), s, ["A", "B", "C"], "human", methods=["pearson"], levels=["dataset"],
                                   judge_null=None)
    got = per_subset.set_index("subset")
    assert got.loc["B", "n_rows"] == 4 and got.loc["B", "value"] == pytest.approx(
        stats.pearsonr(B[:4], HUMAN[:4]).statistic)
    # B + C in the last row is C's 3 alone: 2 2.5 3 4 3.
    assert got.loc["B + C", "n_rows"] == 5 and got.loc["B + C", "value"] == pytest.approx(
        stats.pearsonr([2, 2.5, 3, 4, 3], HUMAN).statistic)


def test_subsets_all_when_under_the_cap():
    assert ensemble_subsets(3, 3) == [(0, 1, 2)]
    assert ensemble_subsets(3, 1) == [(0,), (1,), (2,)]
    assert ensemble_subsets(5, 2, cap=10) == list(combinations(range(5), 2))
    with pytest.raises(ValueError, match="between 1 and 3"):
        ensemble_subsets(3, 4)


@pytest.mark.parametrize("k,n,cap", [(10, 5, 20), (40, 20, 50)])  # a sample from the list; drawn one by one
def test_subsets_past_the_cap_are_a_seeded_sample_of_distinct_subsets(k, n, cap):
    got = ensemble_subsets(k, n, cap=cap, seed=7)
    assert len(got) == cap == len(set(got)) and got == sorted(got)
    assert all(len(s) == n == len(set(s)) and list(s) == sorted(s) and 0 <= s[0] and s[-1] < k for s in got)
    assert ensemble_subsets(k, n, cap=cap, seed=7) == got
    assert ensemble_subsets(k, n, cap=cap, seed=8) != got


def test_the_cap_shows_in_the_summary():
    s = np.column_stack([A, B, C, [2, 2, 3, 4, 4]]).astype(float)
    per_subset, summary = ensemble_sweep(frame(), s, ["A", "B", "C", "D"], "human", methods=["pearson"],
                                         levels=["dataset"], cap=3, seed=1)
    by_n = summary.set_index("n")
    assert list(by_n["n_subsets"]) == [3, 3, 3, 1] and list(by_n["n_possible"]) == [4, 6, 4, 1]
    assert list(by_n["sampled"]) == [True, True, True, False]
    drawn = per_subset[per_subset.n == 2]["subset"].tolist()
    names = "ABCD"
    assert drawn == [" + ".join(names[i] for i in m) for m in ensemble_subsets(4, 2, cap=3, seed=1)]
    again, _ = ensemble_sweep(frame(), s, ["A", "B", "C", "D"], "human", methods=["pearson"], levels=["dataset"],
                              cap=3, seed=1)
    pd.testing.assert_frame_equal(again, per_subset)


def test_one_evaluator_is_refused():
    with pytest.raises(ValueError, match="at least two evaluators, got 1 \\(A\\) for aspect 'x'"):
        ensemble_sweep(frame(), scores()[:, :1], ["A"], "human", "x")
