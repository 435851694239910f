"""Kendall tau-b between metrics (metrics.correlation), checked against counts of
concordant and discordant pairs worked out by hand."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rexeval.metrics.correlation import (COLUMNS, correlation_matrix, kendall_pair, metric_correlations,
                                         registry_direction)

NAN = float("nan")


def systems_frame(**metrics) -> pd.DataFrame:
    n = len(next(iter(metrics.values())))
    return pd.DataFrame({"dataset": "d", "system": [f"s{i}" for i in range(n)], **metrics})


def row(long: pd.DataFrame, over: str, a: str, b: str) -> pd.Series:
    hit = long[(long["over"] == over) & (long["metric_a"] == a) & (long["metric_b"] == b)]
    assert len(hit) == 1, (over, a, b)
    return hit.iloc[0]


def test_four_systems_by_hand():
    # a = [1, 2, 3, 4], b = [1, 3, 2, 4]. The 6 pairs of systems (i, j):
    #   (1,2) a up, b up: C   (1,3) C   (1,4) C   (2,3) a up, b down (3 -> 2): D   (2,4) C   (3,4) C
    # 5 concordant, 1 discordant, no ties: tau = (5 - 1) / 6 = 2/3.
    # Exact two-sided p: S = C - D = 6 - 2 * inversions; permutations of 4 by inversions
    # 0..6 number 1, 3, 5, 6, 5, 3, 1 (24 in all); |S| >= 4 for 0, 1, 5, 6 inversions:
    # (1 + 3 + 3 + 1) / 24 = 1/3.
    sys = systems_frame(a=[1.0, 2.0, 3.0, 4.0], b=[1.0, 3.0, 2.0, 4.0])
    long = metric_correlations(sys.iloc[:0][["dataset", "system"]], sys)
    assert list(long.columns) == list(COLUMNS)
    r = row(long, "systems", "a", "b")
    assert r["tau"] == pytest.approx(2 / 3) and r["p"] == pytest.approx(1 / 3)
    assert r["n"] == 4 and r["dataset"] == "d" and r["note"] is None
    assert (long["over"] == "examples").sum() == 0  # no per-example values given


def test_ties_tau_b_by_hand():
    # x = [1, 2, 2, 3], y = [1, 2, 3, 3]. Pairs: (1,2) C, (1,3) C, (1,4) C, (2,4) C;
    # (2,3) tied in x only; (3,4) tied in y only. C = 4, D = 0, tx = 1, ty = 1:
    # tau-b = (C - D) / sqrt((C + D + tx) * (C + D + ty)) = 4 / sqrt(5 * 5) = 0.8
    # (tau-a would be 4 / 6).
    tau, p, n, note = kendall_pair([1, 2, 2, 3], [1, 2, 3, 3])
    assert tau == pytest.approx(0.8) and n == 4 and note is None and 0 < p < 1


def test_over_examples_drops_pairs_with_a_nan():
    # Six (system, example) rows; x is NaN in row 3, y in row 6: for (x, y) the rows
    # kept are (1,1), (2,3), (3,2), (4,4): the case above, tau = 2/3 over n = 4.
    ex = pd.DataFrame({"dataset": "d", "system": ["s1", "s1", "s1", "s2", "s2", "s2"],
                       "example_id": ["e1", "e2", "e3", "e1", "e2", "e3"],
                       "x": [1.0, 2.0, NAN, 3.0, 4.0, 7.0], "y": [1.0, 3.0, 5.0, 2.0, 4.0, NAN],
                       "z": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    long = metric_correlations(ex)
    r = row(long, "examples", "x", "y")
    assert r["tau"] == pytest.approx(2 / 3) and r["n"] == 4
    # x with z (z has no NaN): rows 1, 2, 4, 5, 6 kept; x = 1, 2, 3, 4, 7 rises with z: tau = 1.
    assert row(long, "examples", "x", "z")["tau"] == pytest.approx(1.0)
    assert row(long, "examples", "x", "z")["n"] == 5
    # Over systems (means of the rows, NaN left out): only 2 systems, so no tau.
    s = row(long, "systems", "x", "y")
    assert math.isnan(s["tau"]) and math.isnan(s["p"]) and s["n"] == 2


@pytest.mark.parametrize("n_systems", [1, 2])
def test_fewer_than_three_systems_is_nan_with_a_note(n_systems):
    sys = systems_frame(a=[1.0, 2.0][:n_systems], b=[2.0, 1.0][:n_systems])
    long = metric_correlations(sys[["dataset", "system"]], sys)
    r = row(long, "systems", "a", "b")
    assert math.isnan(r["tau"]) and math.isnan(r["p"]) and r["n"] == n_systems
    assert "not meaningful" in r["note"] and f"{n_systems} systems" in r["note"]


def test_lower_is_better_metrics_are_negated():
    # DIV is registered lower-is-better. Systems ordered best to worst by BLEU-1 (higher
    # better) and by DIV (lower better) alike: raw values run opposite (tau = -1), but
    # after negating DIV all 6 pairs are concordant: tau = +1 (the metrics agree).
    assert registry_direction("div") is False and registry_direction("bleu-1") is True
    assert registry_direction("not-a-registered-metric") is True
    sys = systems_frame(**{"bleu-1": [0.4, 0.3, 0.2, 0.1], "div": [1.0, 2.0, 3.0, 4.0]})
    empty = sys[["dataset", "system"]]
    assert row(metric_correlations(empty, sys), "systems", "bleu-1", "div")["tau"] == pytest.approx(1.0)
    raw = metric_correlations(empty, sys, higher_is_better=lambda m: True)
    assert row(raw, "systems", "bleu-1", "div")["tau"] == pytest.approx(-1.0)


def test_constant_metric_has_no_ranking():
    sys = systems_frame(a=[1.0, 2.0, 3.0], b=[0.5, 0.5, 0.5])
    r = row(metric_correlations(sys[["dataset", "system"]], sys), "systems", "a", "b")
    assert math.isnan(r["tau"]) and r["n"] == 3 and "constant" in r["note"]


def test_system_means_by_default_order_and_datasets():
    # Dataset d1: 3 systems with 2 examples each; means of m1 = 1.5, 3.5, 5.5 and of
    # m2 = 2, 1, 3: pairs (s1,s2) D, (s1,s3) C, (s2,s3) C: tau = (2 - 1) / 3 = 1/3.
    ex = pd.DataFrame({"dataset": ["d1"] * 6 + ["d2"] * 2, "system": ["s1", "s1", "s2", "s2", "s3", "s3", "s1", "s2"],
                       "m2": [1.0, 3.0, 0.0, 2.0, 2.0, 4.0, 1.0, 2.0],
                       "m1": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, NAN, NAN]})
    long = metric_correlations(ex, order=["m1", "m2"])
    d1 = long[long["dataset"] == "d1"]
    assert row(d1, "systems", "m1", "m2")["tau"] == pytest.approx(1 / 3)  # m1 first: the given order
    # d2 has no m1 value at all: m1 is left out there, so d2 has no pair.
    assert set(long["dataset"]) == {"d1"}
    m = correlation_matrix(d1[d1["over"] == "systems"], ["m1", "m2"])
    assert m.loc["m1", "m2"] == m.loc["m2", "m1"] == pytest.approx(1 / 3) and m.loc["m1", "m1"] == 1.0


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="'dataset' and 'system'"):
        metric_correlations(pd.DataFrame({"system": ["a"], "x": [1.0]}))
    assert np.isnan(kendall_pair([NAN, 1.0], [1.0, 2.0])[0])
