"""Paired statistics: t-test, effect sizes and stars."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from rexeval.metrics.significance import (
    cliffs_delta,
    cohens_d,
    compare,
    paired_ttest,
    significance_stars,
)


def _brute_cliffs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sign(a[:, None] - b[None, :]).sum()) / (a.size * b.size)


def test_ttest_matches_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 0.1, 200)
    b = a + rng.normal(0.01, 0.05, 200)
    want = stats.ttest_rel(a, b)
    assert paired_ttest(a, b) == pytest.approx((want.statistic, want.pvalue))


def test_ttest_identical_systems():
    a = np.array([0.1, 0.5, 0.0, 1.0])
    assert paired_ttest(a, a.copy()) == (0.0, 1.0)


def test_cohens_d_hand_example():
    # a = [2, 4, 6]: mean 4, var (4 + 0 + 4) / 2 = 4; b = [1, 2, 3]: mean 2, var 1.
    # pooled SD = sqrt((4 + 1) / 2) = sqrt(2.5); d = (4 - 2) / sqrt(2.5).
    assert cohens_d([2, 4, 6], [1, 2, 3]) == pytest.approx(2 / math.sqrt(2.5))
    assert cohens_d([1, 2, 3], [2, 4, 6]) == pytest.approx(-2 / math.sqrt(2.5))


def test_cohens_d_constant_inputs():
    assert cohens_d([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]) == 0.0
    assert cohens_d([1.0, 1.0], [0.0, 0.0]) == math.inf


def test_cliffs_delta_hand_examples():
    # a=1 is below all three 2s (-3), a=2 ties all (0), a=3 above all (+3): 0 / 9.
    assert cliffs_delta([1, 2, 3], [2, 2, 2]) == 0.0
    # a=4 vs b=[1, 3, 5]: 2 above, 1 below -> +1; a=1: 0 above, 2 below -> -2;
    # a=5: 2 above, 0 below (tie with 5) -> +2; total 1 over 3 * 3 = 9 pairs.
    assert cliffs_delta([4, 1, 5], [1, 3, 5]) == pytest.approx(1 / 9)
    assert cliffs_delta([1, 1], [0, 0]) == 1.0


def test_cliffs_delta_matches_brute_force_with_ties():
    rng = np.random.default_rng(1)
    for n in (1, 5, 300, 1001):
        a = rng.integers(0, 6, n).astype(float) / 5
        b = rng.integers(0, 6, n).astype(float) / 5
        assert cliffs_delta(a, b) == pytest.approx(_brute_cliffs(a, b), abs=1e-12)


def test_cliffs_delta_large_input_is_fast():
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 10, 50_000), rng.integers(0, 10, 50_000)
    d = cliffs_delta(a, b)
    assert -1.0 <= d <= 1.0


def test_stars_thresholds():
    assert significance_stars(0.0009) == "***"
    assert significance_stars(0.001) == "**"
    assert significance_stars(0.0099) == "**"
    assert significance_stars(0.01) == "*"
    assert significance_stars(0.0499) == "*"
    assert significance_stars(0.05) == ""
    assert significance_stars(0.5) == ""
    assert significance_stars(float("nan")) == ""


def test_compare_drops_nan_pairs():
    a = np.array([1.0, np.nan, 3.0, 4.0, 2.0])
    b = np.array([1.0, 2.0, np.nan, 5.0, 0.0])
    out = compare(a, b)
    # Kept pairs: (1, 1), (4, 5), (2, 0).
    assert (out["n"], out["n_dropped"]) == (3, 2)
    assert out["mean_a"] == pytest.approx(7 / 3)
    assert out["mean_b"] == pytest.approx(2.0)
    assert out["diff"] == pytest.approx(1 / 3)
    want = stats.ttest_rel([1.0, 4.0, 2.0], [1.0, 5.0, 0.0])
    assert (out["t"], out["p"]) == pytest.approx((want.statistic, want.pvalue))
    assert out["stars"] == significance_stars(out["p"])
    assert out["cliffs_delta"] == pytest.approx(_brute_cliffs(np.array([1.0, 4, 2]), np.array([1.0, 5, 0])))
    assert set(out) == {
        "mean_a", "mean_b", "diff", "t", "p", "stars", "cohens_d", "cliffs_delta", "n", "n_dropped",
    }


def test_length_mismatch_rejected():
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0])
