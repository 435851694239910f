"""Paired comparison of two systems' per-interaction metric values.

Both inputs are 1-D arrays of equal length where position i is the same
interaction for both systems. Pairs where either side is NaN (e.g. an interaction
without positives) are dropped before any statistic; `compare` reports how many.
The stars follow seed 002's Table 1: a paired t-test against the reference system.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats


def _paired(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray, int]:
    """Float arrays with NaN pairs removed, and how many pairs were removed."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"paired inputs must have equal length, got {a.size} and {b.size}")
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep], int(a.size - keep.sum())


def paired_ttest(a: ArrayLike, b: ArrayLike) -> tuple[float, float]:
    """Two-sided paired t-test (scipy.stats.ttest_rel) on the non-NaN pairs.

    Identical systems give (0.0, 1.0) instead of scipy's NaN, so a table can still
    say "not significant". Fewer than two pairs with some difference gives NaNs.
    """
    a, b, _ = _paired(a, b)
    if a.size == 0:
        return float("nan"), float("nan")
    if np.all(a == b):
        return 0.0, 1.0
    if a.size < 2:
        return float("nan"), float("nan")
    with warnings.catch_warnings():
        # A constant non-zero difference gives t = +-inf, which is the right answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_rel(a, b)
    return float(res.statistic), float(res.pvalue)


def cohens_d(a: ArrayLike, b: ArrayLike) -> float:
    """(mean(a) - mean(b)) / sqrt((var(a) + var(b)) / 2), sample variances (ddof=1).

    This is the pooled-SD d that compares the two systems' score spreads, not d_z
    (mean difference over the SD of the differences), so it is comparable with
    effect sizes reported for unpaired designs. Two equal constant inputs give 0;
    two different constants give +-inf; fewer than two pairs give NaN.
    """
    a, b, _ = _paired(a, b)
    if a.size < 2:
        return float("nan")
    diff = float(a.mean() - b.mean())
    sd = math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2.0)
    if sd == 0.0:
        return 0.0 if diff == 0.0 else math.copysign(math.inf, diff)
    return diff / sd


def cliffs_delta(a: ArrayLike, b: ArrayLike) -> float:
    """(#{a_i > b_j} - #{a_i < b_j}) / (n_a * n_b) over all cross pairs.

    Counted in O(n log n): sort b once, then for each a_i binary-search how many b
    lie strictly below and strictly above it; ties count on neither side.
    """
    a, b, _ = _paired(a, b)
    if a.size == 0:
        return float("nan")
    b_sorted = np.sort(b)
    below = np.searchsorted(b_sorted, a, side="left").astype(np.int64)
    above = b_sorted.size - np.searchsorted(b_sorted, a, side="right").astype(np.int64)
    return float(int(below.sum()) - int(above.sum())) / float(a.size * b_sorted.size)


def significance_stars(p: float) -> str:
    """"***" p < 0.001, "**" p < 0.01, "*" p < 0.05, else "" (NaN -> "")."""
    if p is None or not p < 0.05:
        return ""
    if p < 0.001:
        return "***"
    if p < 0.01:
        return "**"
    return "*"


def compare(a: ArrayLike, b: ArrayLike) -> dict[str, float | int | str]:
    """Everything a results table needs to set system a against reference b."""
    a_kept, b_kept, dropped = _paired(a, b)
    t, p = paired_ttest(a_kept, b_kept)
    mean_a = float(a_kept.mean()) if a_kept.size else float("nan")
    mean_b = float(b_kept.mean()) if b_kept.size else float("nan")
    return {
        "mean_a": mean_a,
        "mean_b": mean_b,
        "diff": mean_a - mean_b,
        "t": t,
        "p": p,
        "stars": significance_stars(p),
        "cohens_d": cohens_d(a_kept, b_kept),
        "cliffs_delta": cliffs_delta(a_kept, b_kept),
        "n": int(a_kept.size),
        "n_dropped": dropped,
    }
