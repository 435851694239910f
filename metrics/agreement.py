"""Meta-evaluation: how well an evaluator (an LLM judge, a metric, an annotator) agrees
with the people the explanations were written for.

Two kinds of agreement:

- Ratings (seed 001, section 2.4): Pearson, Spearman or Kendall (tau-b) correlation
  between evaluator scores and human ratings at three levels. "dataset" is one
  correlation over every row; "user" correlates within each user's rows and averages
  over users; "pair" correlates within each (user, item) group and averages over the
  groups. A group whose correlation is undefined (fewer than two usable rows, or one
  side constant) is left out of the average and counted, so a reader can see how much
  of the data a level rests on.
- Pairwise verdicts (seed 004, Table 2): labels "A", "B" or "C" (a tie) from the judge
  and from a human; accuracy, Cohen's kappa and Krippendorff's alpha (nominal), with
  and without ties. The same statistics between repeated runs of one judge (seed 004,
  Table 6: `run_agreement`).

Intervals are percentile bootstraps from a simple seeded loop (numpy
`default_rng(seed)`), not scipy.stats.bootstrap: the user and pair levels resample
users (a cluster bootstrap, which scipy does not offer), and one loop for every level
keeps the resampling rule the same and easy to reproduce. Resamples whose statistic is
undefined are left out of the percentiles. These are meta-metrics, so nothing here is
registered in metrics.registry.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

METHODS = ("pearson", "spearman", "kendall")
LEVELS = ("dataset", "user", "pair")
LABELS = ("A", "B", "C")
TIE = "C"
RESULT_COLUMNS = ("evaluator", "aspect", "level", "method", "value", "n_rows", "n_groups_used",
                  "n_groups_total", "ci_low", "ci_high")
NAN = float("nan")
MAX_TABLE_VALUES = 64  # distinct values per side up to which Kendall uses contingency tables


# ------------------------------------------------------------------ correlation


def _finite_pairs(x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have equal length, got {x.size} and {y.size}")
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def correlation(x: ArrayLike, y: ArrayLike, method: str = "pearson") -> float:
    """Correlation of the pairs where both sides are finite (NaN and None are dropped).

    Kendall is tau-b (scipy's default), which corrects for tied ranks, common with
    Likert ratings. Returns NaN, silently, with fewer than two pairs or a constant side,
    where a correlation has no meaning.
    """
    if method not in METHODS:
        raise ValueError(f"unknown correlation method {method!r} (expected one of {', '.join(METHODS)})")
    x, y = _finite_pairs(x, y)
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return NAN
    from scipy import stats  # here and below: the CLI imports this module for its names

    fn = {"pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}[method]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-constant input warnings; the value is still right
        return float(fn(x, y).statistic)


@dataclass(frozen=True)
class LevelCorrelation:
    """One level's correlation and how much data it rests on."""

    value: float
    n_groups_used: int  # groups with a defined correlation (1 or 0 at the dataset level)
    n_groups_total: int  # groups in the input (1 at the dataset level)
    n_rows: int  # rows where both sides are finite


def _group_keys(level: str, user_col: str, item_col: str) -> list[str]:
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r} (expected one of {', '.join(LEVELS)})")
    return {"dataset": [], "user": [user_col], "pair": [user_col, item_col]}[level]


def group_correlations(df: pd.DataFrame, judge_col: str, human_col: str, by: list[str],
                       method: str) -> pd.Series:
    """The correlation within each group of `by` (NaN where undefined), by group key.

    All groups are computed at once rather than with one scipy call each (which costs
    milliseconds per group): Pearson from grouped sums of centred products, Spearman as
    Pearson of within-group average ranks, Kendall tau-b from one contingency table per
    group when the ratings take few distinct values (else scipy per group). The tests
    check every path against scipy.
    """
    if method not in METHODS:
        raise ValueError(f"unknown correlation method {method!r} (expected one of {', '.join(METHODS)})")
    grouper = by[0] if len(by) == 1 else by
    frame = df[by].assign(x=pd.to_numeric(df[judge_col], errors="coerce").astype(np.float64),
                          y=pd.to_numeric(df[human_col], errors="coerce").astype(np.float64))
    every_group = frame.groupby(grouper, sort=True, dropna=False).size().index
    frame = frame[np.isfinite(frame["x"]) & np.isfinite(frame["y"])]
    grouped = frame.groupby(grouper, sort=True, dropna=False)
    if method == "kendall":
        r = _grouped_kendall(frame, grouped)
    else:
        if method == "spearman":
            ranks = grouped[["x", "y"]].rank(method="average")
            frame = frame.assign(x=ranks["x"], y=ranks["y"])
            grouped = frame.groupby(grouper, sort=True, dropna=False)
        dx, dy = _unit_deviations(frame, "x", grouper), _unit_deviations(frame, "y", grouper)
        sums = frame[by].assign(xy=dx * dy, xx=dx * dx, yy=dy * dy).groupby(grouper, sort=True, dropna=False).sum()
        spread = grouped[["x", "y"]].max() - grouped[["x", "y"]].min()
        defined = (grouped.size() >= 2) & (spread["x"] > 0) & (spread["y"] > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = (sums["xy"] / (np.sqrt(sums["xx"]) * np.sqrt(sums["yy"]))).clip(-1.0, 1.0).where(defined)
    return r.reindex(every_group).astype(np.float64)


def _unit_deviations(frame: pd.DataFrame, column: str, grouper) -> pd.Series:
    """Each value's deviation from its group's mean, divided by the group's largest
    absolute deviation (so within [-1, 1]). Pearson's r does not change when a group is
    scaled, and the scaling keeps the products and sums of squares finite and above the
    subnormal range whatever the magnitude: raw deviations near 1e200 overflow when
    squared, near 1e-200 they underflow to 0. The values are first divided by the
    group's largest absolute value, so the mean itself cannot overflow."""
    keys = [frame[k] for k in grouper] if isinstance(grouper, list) else frame[grouper]

    def per_group(v: pd.Series, how: str) -> pd.Series:
        return v.groupby(keys, sort=False, dropna=False).transform(how)

    def largest(v: pd.Series) -> pd.Series:  # 1 for an all-zero group: nothing to scale
        m = per_group(v.abs(), "max")
        return m.where(m > 0, 1.0)

    scaled = frame[column] / largest(frame[column])
    dev = scaled - per_group(scaled, "mean")
    return dev / largest(dev)


def _grouped_kendall(frame: pd.DataFrame, grouped) -> pd.Series:
    """Tau-b per group of the finite rows in `frame` (columns x, y)."""
    ux, cx = np.unique(frame["x"].to_numpy(), return_inverse=True)
    uy, cy = np.unique(frame["y"].to_numpy(), return_inverse=True)
    n_groups = grouped.ngroups
    if max(ux.size, uy.size) <= MAX_TABLE_VALUES and n_groups * ux.size * uy.size <= 5_000_000:
        tables = np.zeros((n_groups, ux.size, uy.size))
        np.add.at(tables, (grouped.ngroup().to_numpy(), cx, cy), 1.0)
        return pd.Series(_tau_b_from_tables(tables), index=grouped.size().index)
    return pd.Series({key: correlation(part["x"], part["y"], "kendall") for key, part in grouped},
                     dtype=np.float64)


def _n_rows(df: pd.DataFrame, judge_col: str, human_col: str) -> int:
    return int(_finite_pairs(df[judge_col], df[human_col])[0].size)


def _level(df: pd.DataFrame, judge_col: str, human_col: str, level: str, method: str, user_col: str,
           item_col: str) -> tuple[LevelCorrelation, pd.Series | None]:
    """The level's result and its per-group correlations (None at the dataset level),
    so an interval can reuse them instead of computing every group again."""
    by = _group_keys(level, user_col, item_col)
    n_rows = _n_rows(df, judge_col, human_col)
    if not by:
        value = correlation(df[judge_col], df[human_col], method)
        return LevelCorrelation(value, int(not math.isnan(value)), 1, n_rows), None
    per_group = group_correlations(df, judge_col, human_col, by, method)
    used = per_group.dropna()
    value = float(used.mean()) if len(used) else NAN
    return LevelCorrelation(value, len(used), len(per_group), n_rows), per_group


def level_correlation(df: pd.DataFrame, judge_col: str, human_col: str, level: str,
                      method: str = "pearson", user_col: str = "user_id",
                      item_col: str = "item_id") -> LevelCorrelation:
    """Seed 001's correlation at one level: dataset (all rows at once), user (mean of the
    per-user correlations) or pair (mean of the per-(user, item) correlations)."""
    return _level(df, judge_col, human_col, level, method, user_col, item_col)[0]


# ------------------------------------------------------------------ bootstrap


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return NAN, NAN
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def _rowwise_pearson(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of two (B, n) matrices; NaN for a constant row. Rows
    are centred and scaled to unit largest deviation first (see `_unit_deviations`)."""
    constant = (np.ptp(xs, axis=1) == 0) | (np.ptp(ys, axis=1) == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        xm, ym = _unit_rows(xs), _unit_rows(ys)
        r = (xm * ym).sum(axis=1) / (np.sqrt((xm * xm).sum(axis=1)) * np.sqrt((ym * ym).sum(axis=1)))
    r[constant] = NAN
    return np.clip(r, -1.0, 1.0)


def _unit_rows(m: np.ndarray) -> np.ndarray:
    """Each row's deviations from its mean over its largest absolute deviation, after
    dividing the row by its largest absolute value (magnitude-safe, as `_unit_deviations`)."""
    top = np.abs(m).max(axis=1, keepdims=True)
    scaled = m / np.where(top > 0, top, 1.0)
    dev = scaled - scaled.mean(axis=1, keepdims=True)
    span = np.abs(dev).max(axis=1, keepdims=True)
    return dev / np.where(span > 0, span, 1.0)


def _count_tables(a: np.ndarray, b: np.ndarray, ka: int, kb: int) -> np.ndarray:
    """(B, ka, kb) contingency tables of code pairs given as (B, n) rows."""
    flat = a * kb + b + (np.arange(a.shape[0]) * ka * kb)[:, None]
    return np.bincount(flat.ravel(), minlength=a.shape[0] * ka * kb).reshape(-1, ka, kb).astype(np.float64)


def _tau_b_from_tables(t: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each (kx, ky) contingency table of ordered values: concordant
    pairs sit below-right of a cell, discordant ones below-left; ties come from the
    margins."""
    n = t.sum(axis=(1, 2))
    pad = np.zeros((t.shape[0], t.shape[1] + 2, t.shape[2] + 2))
    pad[:, 1:-1, 1:-1] = t
    below_right = pad[:, ::-1, ::-1].cumsum(1).cumsum(2)[:, ::-1, ::-1]  # rows >= i, cols >= j
    below_left = pad[:, ::-1, :].cumsum(1)[:, ::-1, :].cumsum(2)  # rows >= i, cols <= j
    concordant = (t * below_right[:, 2:, 2:]).sum(axis=(1, 2))
    discordant = (t * below_left[:, 2:, :-2]).sum(axis=(1, 2))
    pairs = n * (n - 1) / 2
    ties_x = (t.sum(axis=2) * (t.sum(axis=2) - 1) / 2).sum(axis=1)
    ties_y = (t.sum(axis=1) * (t.sum(axis=1) - 1) / 2).sum(axis=1)
    denom = (pairs - ties_x) * (pairs - ties_y)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (concordant - discordant) / np.sqrt(denom), NAN)


def _resampled_correlations(x: np.ndarray, y: np.ndarray, idx: np.ndarray, method: str) -> np.ndarray:
    """The correlation of every resample (rows of `idx`): vectorised for Pearson and
    Spearman (Pearson of average ranks); Kendall from contingency tables when both
    sides take few distinct values (ratings), else a loop over scipy."""
    xs, ys = x[idx], y[idx]
    if method == "pearson":
        return _rowwise_pearson(xs, ys)
    from scipy import stats

    if method == "spearman":
        return _rowwise_pearson(stats.rankdata(xs, axis=1), stats.rankdata(ys, axis=1))
    ux, cx = np.unique(x, return_inverse=True)
    uy, cy = np.unique(y, return_inverse=True)
    if max(ux.size, uy.size) <= MAX_TABLE_VALUES:
        return _tau_b_from_tables(_count_tables(cx[idx], cy[idx], ux.size, uy.size))
    return np.array([correlation(a, b, method) for a, b in zip(xs, ys)], dtype=np.float64)


def _bootstrap(df: pd.DataFrame, judge_col: str, human_col: str, level: str, method: str,
               per_group: pd.Series | None, n_resamples: int, confidence: float, seed: int
               ) -> tuple[float, float]:
    if n_resamples <= 0:
        return NAN, NAN
    rng = np.random.default_rng(seed)
    if per_group is None:
        x, y = _finite_pairs(df[judge_col], df[human_col])
        if x.size < 2:
            return NAN, NAN
        idx = rng.integers(0, x.size, size=(n_resamples, x.size))
        return _percentiles(_resampled_correlations(x, y, idx, method), confidence)
    users = per_group.index if level == "user" else per_group.index.get_level_values(0)
    frame = pd.DataFrame({"user": users, "value": per_group.to_numpy()})
    sums = frame.groupby("user", sort=True)["value"].sum(min_count=1).fillna(0.0).to_numpy()
    counts = frame.groupby("user", sort=True)["value"].count().to_numpy().astype(np.float64)
    if sums.size < 2:
        return NAN, NAN
    idx = rng.integers(0, sums.size, size=(n_resamples, sums.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        resampled = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    return _percentiles(resampled, confidence)


def level_bootstrap_ci(df: pd.DataFrame, judge_col: str, human_col: str, level: str,
                       method: str = "pearson", n_resamples: int = 1000, confidence: float = 0.95,
                       seed: int = 0, user_col: str = "user_id", item_col: str = "item_id"
                       ) -> tuple[float, float]:
    """Percentile bootstrap interval of `level_correlation`.

    Resampling units: rows (the finite pairs) at the dataset level; users at the user
    and pair levels, keeping each drawn user's rows together. One draw is
    `default_rng(seed).integers(0, n_units, size=(n_resamples, n_units))`. The per-group
    correlations are computed once: a user-level resample is the mean of the drawn
    users' defined correlations; a pair-level resample is the mean of the defined pair
    correlations of the drawn users (a user drawn twice counts twice). NaN with fewer
    than two units or `n_resamples` 0.
    """
    _, per_group = _level(df, judge_col, human_col, level, method, user_col, item_col)
    return _bootstrap(df, judge_col, human_col, level, method, per_group, n_resamples, confidence, seed)


# ------------------------------------------------------------------ all at once


class Target(NamedTuple):
    """One evaluator's scores for one aspect, and the human ratings they are compared with."""

    evaluator: str
    aspect: str
    judge_col: str
    human_col: str


def meta_evaluate(df: pd.DataFrame, targets: Sequence[Target], methods: Sequence[str] = METHODS,
                  levels: Sequence[str] = LEVELS, n_resamples: int = 1000, confidence: float = 0.95,
                  seed: int = 0, user_col: str = "user_id", item_col: str = "item_id") -> pd.DataFrame:
    """Every (target, level, method) as one tidy row with the columns of RESULT_COLUMNS.

    Each cell's interval uses a fresh `default_rng(seed)`, so a cell does not depend on
    which other cells were asked for, and all methods of a level share the same draws.
    """
    rows = []
    for t in targets:
        for level in levels:
            for method in methods:
                res, per_group = _level(df, t.judge_col, t.human_col, level, method, user_col, item_col)
                low, high = _bootstrap(df, t.judge_col, t.human_col, level, method, per_group, n_resamples,
                                       confidence, seed)
                rows.append({"evaluator": t.evaluator, "aspect": t.aspect, "level": level, "method": method,
                             "value": res.value, "n_rows": res.n_rows, "n_groups_used": res.n_groups_used,
                             "n_groups_total": res.n_groups_total, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


# ------------------------------------------------------------------ null policy


@dataclass(frozen=True)
class NullPolicyResult:
    """The ratings after the policy, which input rows were kept, and what was done."""

    human: np.ndarray
    judge: np.ndarray
    keep: np.ndarray  # bool mask over the input rows
    human_filled: int  # missing human ratings replaced (among kept rows)
    judge_filled: int  # missing judge scores replaced (among kept rows)
    dropped: int  # rows left out because a side was missing and its policy is None


def apply_null_policy(human: ArrayLike, judge: ArrayLike, human_null: float | None = 3.0,
                      judge_null: float | None = 0.0) -> NullPolicyResult:
    """Seed 001's treatment of missing values: a missing human rating becomes 3 (the
    middle of the scale: the user's attitude is unknown), a missing judge score becomes
    0 (usually a parsing failure, which should cost the judge). A policy of None drops
    the row instead. Missing means None or NaN."""
    h = np.asarray(human, dtype=np.float64).reshape(-1)
    j = np.asarray(judge, dtype=np.float64).reshape(-1)
    if h.shape != j.shape:
        raise ValueError(f"human and judge must have equal length, got {h.size} and {j.size}")
    h_missing, j_missing = np.isnan(h), np.isnan(j)
    keep = np.ones(h.size, dtype=bool)
    if human_null is None:
        keep &= ~h_missing
    if judge_null is None:
        keep &= ~j_missing
    h_out = np.where(h_missing, NAN if human_null is None else float(human_null), h)[keep]
    j_out = np.where(j_missing, NAN if judge_null is None else float(judge_null), j)[keep]
    return NullPolicyResult(h_out, j_out, keep, int((h_missing & keep).sum()),
                            int((j_missing & keep).sum()), int((~keep).sum()))


# ------------------------------------------------------------------ pairwise verdicts


@dataclass(frozen=True)
class PairwiseAgreement:
    """Agreement of judge and human verdicts over the items used."""

    ties: bool  # True: ties kept as a third label; False: the no-tie subset
    n_used: int
    n_total: int  # items given, including those left out
    n_missing: int  # items without a label on one side (left out)
    n_tie_dropped: int  # items left out as ties (0 when ties=True)
    accuracy: float
    kappa: float
    alpha: float
    accuracy_ci: tuple[float, float]
    kappa_ci: tuple[float, float]
    alpha_ci: tuple[float, float]


def _labels(values: Sequence, side: str) -> list[str | None]:
    out: list[str | None] = []
    for i, v in enumerate(values):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(None)
        elif v in LABELS:
            out.append(v)
        else:
            raise ValueError(f"{side} label at position {i} is {v!r}; expected one of {', '.join(LABELS)}")
    return out


def cohen_kappa(judge: Sequence[str], human: Sequence[str]) -> float:
    """sklearn's Cohen's kappa; NaN for no items or when both sides use one and the same
    label (chance agreement is then 1 and kappa is 0/0)."""
    if len(judge) == 0 or len(set(judge) | set(human)) < 2:
        return NAN
    from sklearn.metrics import cohen_kappa_score

    return float(cohen_kappa_score(list(human), list(judge), labels=sorted(set(judge) | set(human))))


def krippendorff_alpha(judge: Sequence[str], human: Sequence[str]) -> float:
    """Nominal Krippendorff's alpha (the `krippendorff` package) with the judge and the
    human as two coders; NaN for no items or a single label overall (no disagreement is
    possible, so expected disagreement is 0)."""
    present = sorted(set(judge) | set(human))
    if len(judge) == 0 or len(present) < 2:
        return NAN
    code = {label: i for i, label in enumerate(present)}
    data = np.array([[code[v] for v in judge], [code[v] for v in human]], dtype=np.float64)
    import krippendorff

    return float(krippendorff.alpha(reliability_data=data, level_of_measurement="nominal"))


def _confusions(jc: np.ndarray, hc: np.ndarray, k: int) -> np.ndarray:
    """(B, k, k) judge-by-human count matrices of label codes given as (B, n) rows."""
    flat = jc * k + hc + (np.arange(jc.shape[0]) * k * k)[:, None]
    return np.bincount(flat.ravel(), minlength=jc.shape[0] * k * k).reshape(-1, k, k).astype(np.float64)


def _kappa_alpha_from_confusions(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cohen's kappa and nominal Krippendorff's alpha of each (k, k) count matrix, in
    closed form (two coders, no missing values): the bootstrap's fast path, checked
    against sklearn and the krippendorff package in the tests."""
    n = m.sum(axis=(1, 2))
    agree = np.trace(m, axis1=1, axis2=2)
    rows, cols = m.sum(axis=2), m.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        po, pe = agree / n, (rows * cols).sum(axis=1) / (n * n)
        kappa = np.where(pe < 1.0, (po - pe) / (1.0 - pe), NAN)
        # Coincidences: every item gives the pair (judge, human) both ways round.
        marg = rows + cols
        expected = (marg.sum(axis=1) ** 2 - (marg ** 2).sum(axis=1))  # sum over c != k of n_c n_k
        observed = 2.0 * (n - agree)  # sum over c != k of o_ck
        alpha = np.where(expected > 0, 1.0 - (2.0 * n - 1.0) * observed / expected, NAN)
    return kappa, alpha


def pairwise_agreement(judge: Sequence, human: Sequence, ties: bool = True, n_resamples: int = 1000,
                       confidence: float = 0.95, seed: int = 0) -> PairwiseAgreement:
    """Accuracy, Cohen's kappa and Krippendorff's alpha of judge verdicts against human
    verdicts (labels "A", "B", "C" = tie; None or NaN = missing, left out and counted).

    Without ties (`ties=False`) an item is kept only when neither side says "C": the
    convention of the MT-Bench agreement study that seed 004's A/B/C verdict format comes
    from, and the one that leaves a clean two-label problem for kappa and alpha. The
    price is that a judge which answers "tie" on hard items escapes them; `n_tie_dropped`
    shows how many items went.

    Intervals: percentile bootstrap over items, `default_rng(seed).integers(0, n,
    size=(n_resamples, n))`; resamples where a statistic is undefined are left out.
    Each resample's kappa and alpha come from its count matrix in closed form (equal to
    sklearn and the krippendorff package, much faster than calling them 1,000 times).
    """
    j_all, h_all = _labels(list(judge), "judge"), _labels(list(human), "human")
    if len(j_all) != len(h_all):
        raise ValueError(f"judge and human must have equal length, got {len(j_all)} and {len(h_all)}")
    pairs = [(a, b) for a, b in zip(j_all, h_all) if a is not None and b is not None]
    n_missing = len(j_all) - len(pairs)
    kept = pairs if ties else [(a, b) for a, b in pairs if a != TIE and b != TIE]
    j = np.array([a for a, _ in kept], dtype=object)
    h = np.array([b for _, b in kept], dtype=object)
    n = len(kept)
    acc = float(np.mean(j == h)) if n else NAN
    cis = [(NAN, NAN)] * 3
    if n >= 2 and n_resamples > 0:
        idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
        code = {label: i for i, label in enumerate(LABELS)}
        jc = np.array([code[v] for v in j], dtype=np.int64)
        hc = np.array([code[v] for v in h], dtype=np.int64)
        kappas, alphas = _kappa_alpha_from_confusions(_confusions(jc[idx], hc[idx], len(LABELS)))
        accs = (jc[idx] == hc[idx]).mean(axis=1)
        cis = [_percentiles(v, confidence) for v in (accs, kappas, alphas)]
    return PairwiseAgreement(ties=ties, n_used=n, n_total=len(j_all), n_missing=n_missing,
                             n_tie_dropped=len(pairs) - n, accuracy=acc, kappa=cohen_kappa(j, h),
                             alpha=krippendorff_alpha(j, h), accuracy_ci=cis[0], kappa_ci=cis[1],
                             alpha_ci=cis[2])


# ------------------------------------------------------------------ a judge against itself


@dataclass(frozen=True)
class RunAgreement:
    """How one judge agrees with itself over repeated runs of the same items (seed 004,
    appendix B.2, Table 6)."""

    n_runs: int
    n_items: int  # items given (a run without a label for one counts it missing there)
    n_complete: int  # items every run labelled
    kappa: float  # Cohen's kappa averaged over every pair of runs
    kappas: tuple[float, ...]  # per pair of runs: (1, 2), (1, 3), ..., (2, 3), ...
    alpha: float  # Krippendorff's alpha (nominal), every run a coder


def run_agreement(runs: Sequence[Sequence]) -> RunAgreement:
    """Cohen's kappa and Krippendorff's alpha of two or more runs of a judge over the same
    items (labels "A", "B", "C"; None or NaN: no verdict).

    Seed 004 reports one kappa and one alpha over three runs without saying how kappa,
    a two-rater statistic, meets three runs; we average Cohen's kappa over the pairs of
    runs (each pair on the items both labelled, `cohen_kappa`), and take alpha with the
    runs as its coders, where a missing verdict is a missing value, as alpha allows.
    NaN where a statistic is undefined (one label throughout)."""
    labelled = [_labels(list(r), f"run {k + 1}") for k, r in enumerate(runs)]
    if len(labelled) < 2:
        raise ValueError(f"agreement of a judge with itself needs two or more runs, got {len(labelled)}")
    n = len(labelled[0])
    if any(len(r) != n for r in labelled):
        raise ValueError(f"every run must label the same items, got lengths {[len(r) for r in labelled]}")
    kappas = []
    for a in range(len(labelled)):
        for b in range(a + 1, len(labelled)):
            both = [(x, y) for x, y in zip(labelled[a], labelled[b]) if x is not None and y is not None]
            kappas.append(cohen_kappa([x for x, _ in both], [y for _, y in both]))
    present = sorted({v for r in labelled for v in r if v is not None})
    code = {label: float(i) for i, label in enumerate(present)}
    data = np.array([[NAN if v is None else code[v] for v in r] for r in labelled], dtype=np.float64)
    pairable = (~np.isnan(data)).sum(axis=0) >= 2
    alpha = NAN
    if len(present) >= 2 and pairable.any():
        import krippendorff

        alpha = float(krippendorff.alpha(reliability_data=data, level_of_measurement="nominal"))
    defined = [k for k in kappas if not math.isnan(k)]
    return RunAgreement(n_runs=len(labelled), n_items=n,
                        n_complete=int((~np.isnan(data)).all(axis=0).sum()) if n else 0,
                        kappa=float(np.mean(defined)) if defined else NAN, kappas=tuple(kappas), alpha=alpha)
