"""Ensembles of evaluators: how the agreement with human ratings changes with the
number of evaluators whose scores are averaged (seed 001, section 5 and Figure 4).

For N = 1..K evaluators of one aspect, every subset of N (or, past a cap, a seeded
sample of distinct subsets) is averaged per explanation and correlated with the human
ratings by `agreement.meta_evaluate`, at the same levels and with the same methods as
a single evaluator. The spread over the subsets of one size is the point: its mean is
what an ensemble of N evaluators picked blindly gives on average, its minimum and
maximum the worst and the best luck.

Missing scores follow the meta-evaluation's judge null policy, member by member: with
a number (seed 001: 0, a parse failure costs the judge) the gap is filled before
averaging, so a failing member pulls the ensemble down; with None ("drop") the member
is left out of that explanation's mean, and the explanation is left out only when no
member scored it. A row marked unusable (an unreadable value) for any member is left
out of that subset, as it is left out of each member's own correlation. With N = 1
the results are exactly the single evaluators' ones.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from rexeval.metrics.agreement import LEVELS, METHODS, Target, meta_evaluate

SUBSET_COLUMNS = ("aspect", "n", "subset", "method", "level", "value", "n_rows", "n_groups_used",
                  "n_groups_total")
SWEEP_COLUMNS = ("aspect", "method", "level", "n", "n_judges", "n_subsets", "n_possible", "sampled", "n_defined",
                 "mean", "min", "max", "best", "worst")
SEPARATOR = " + "  # between the members' names in a subset's label
ENUMERATE_LIMIT = 200_000  # up to this many subsets, a sample is drawn from the full list


def ensemble_subsets(k: int, n: int, cap: int = 200, seed: int = 0) -> list[tuple[int, ...]]:
    """The n-subsets of range(k), each a sorted tuple, in lexicographic order: all of
    them when there are at most `cap`, else `cap` distinct ones drawn with
    `default_rng([seed, k, n])`, so a size's sample does not depend on the other sizes
    and is the same for every aspect with k evaluators."""
    if not 1 <= n <= k:
        raise ValueError(f"ensemble size must be between 1 and {k}, got {n}")
    if cap < 1:
        raise ValueError(f"the subset cap must be at least 1, got {cap}")
    total = math.comb(k, n)
    if total <= cap:
        return list(combinations(range(k), n))
    rng = np.random.default_rng([seed, k, n])
    if total <= ENUMERATE_LIMIT:
        every = list(combinations(range(k), n))
        return [every[i] for i in sorted(rng.choice(total, size=cap, replace=False))]
    drawn: set[tuple[int, ...]] = set()
    while len(drawn) < cap:  # too many to list; redraw the (rare) repeats
        drawn.add(tuple(sorted(int(i) for i in rng.choice(k, size=n, replace=False))))
    return sorted(drawn)


def subset_mean(scores: np.ndarray, members: Sequence[int], judge_null: float | None = 0.0,
                unusable: np.ndarray | None = None) -> np.ndarray:
    """Per row, the mean of the `members` columns of `scores` (rows x evaluators; NaN =
    missing). A missing score becomes `judge_null` before averaging, or with None is
    left out of the mean (NaN when every member is missing). NaN where `unusable`
    (same shape, bool) marks any member."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"scores must be a rows x evaluators matrix, got shape {s.shape}")
    cols = list(members)
    if not cols:
        raise ValueError("an ensemble needs at least one member")
    part = s[:, cols]
    if judge_null is None:
        counts = np.isfinite(part).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(counts > 0, np.nansum(part, axis=1) / counts, np.nan)
    else:
        out = np.where(np.isnan(part), float(judge_null), part).mean(axis=1)
    if unusable is not None:
        out[np.asarray(unusable, dtype=bool)[:, cols].any(axis=1)] = np.nan
    return out


def subset_correlations(frame: pd.DataFrame, scores: np.ndarray, names: Sequence[str], human_col: str,
                        aspect: str = "", methods: Sequence[str] = METHODS, levels: Sequence[str] = LEVELS,
                        cap: int = 200, seed: int = 0, judge_null: float | None = 0.0,
                        unusable: np.ndarray | None = None, user_col: str = "user_id",
                        item_col: str = "item_id") -> pd.DataFrame:
    """One row (SUBSET_COLUMNS) per (N, subset, method, level): the correlation of the
    subset's mean score with `frame[human_col]` (rows of `frame` = rows of `scores`,
    columns in the order of `names`). Rows without a finite mean or human rating are
    left out before the levels group them, as the null policy's dropped rows are."""
    k = len(names)
    s = np.asarray(scores, dtype=np.float64)
    if s.shape != (len(frame), k):
        raise ValueError(f"scores must be {len(frame)} rows x {k} evaluators, got shape {s.shape}")
    human = pd.to_numeric(frame[human_col], errors="coerce").to_numpy(dtype=np.float64)
    base = frame[[user_col, item_col]].assign(human=human)
    out = []
    for n in range(1, k + 1):
        for members in ensemble_subsets(k, n, cap, seed):
            x = subset_mean(s, members, judge_null, unusable)
            keep = np.isfinite(x) & np.isfinite(human)
            label = SEPARATOR.join(names[i] for i in members)
            res = meta_evaluate(base[keep].assign(judge=x[keep]), [Target(label, aspect, "judge", "human")],
                                methods, levels, n_resamples=0, user_col=user_col, item_col=item_col)
            out.append(res.rename(columns={"evaluator": "subset"}).assign(n=n))
    if not out:
        return pd.DataFrame(columns=list(SUBSET_COLUMNS))
    return pd.concat(out, ignore_index=True)[list(SUBSET_COLUMNS)]


def summarise_sweep(per_subset: pd.DataFrame, n_judges: dict[str, int], cap: int) -> pd.DataFrame:
    """One row (SWEEP_COLUMNS) per (aspect, method, level, N): how many subsets, how
    many had a defined correlation, their mean, minimum and maximum, and the subsets
    that gave the maximum (best) and minimum (worst), the first in subset order on a
    tie. `n_judges` is K per aspect; `sampled` says the subsets were a sample of
    C(K, N) (more than `cap`)."""
    rows = []
    keys = ["aspect", "method", "level", "n"]
    for (aspect, method, level, n), g in per_subset.groupby(keys, sort=False):
        values = g["value"].astype(np.float64)
        defined = values.notna()
        k = n_judges[aspect]
        rows.append({"aspect": aspect, "method": method, "level": level, "n": int(n), "n_judges": k,
                     "n_subsets": len(g), "n_possible": math.comb(k, int(n)), "sampled": math.comb(k, int(n)) > cap,
                     "n_defined": int(defined.sum()),
                     "mean": float(values.mean()) if defined.any() else math.nan,
                     "min": float(values.min()) if defined.any() else math.nan,
                     "max": float(values.max()) if defined.any() else math.nan,
                     "best": g.loc[values.idxmax(), "subset"] if defined.any() else None,
                     "worst": g.loc[values.idxmin(), "subset"] if defined.any() else None})
    out = pd.DataFrame(rows, columns=list(SWEEP_COLUMNS))
    order = [{v: i for i, v in enumerate(dict.fromkeys(per_subset[c]))} for c in keys[:3]]
    rank = [out[c].map(o) for c, o in zip(keys[:3], order)]
    out = out.assign(_a=rank[0], _m=rank[1], _l=rank[2]).sort_values(["_a", "_m", "_l", "n"], kind="stable")
    return out.drop(columns=["_a", "_m", "_l"]).reset_index(drop=True)


def ensemble_sweep(frame: pd.DataFrame, scores: np.ndarray, names: Sequence[str], human_col: str,
                   aspect: str = "", methods: Sequence[str] = METHODS, levels: Sequence[str] = LEVELS,
                   cap: int = 200, seed: int = 0, judge_null: float | None = 0.0,
                   unusable: np.ndarray | None = None, user_col: str = "user_id",
                   item_col: str = "item_id") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every subset's correlations, their summary per N) for one aspect; see
    `subset_correlations` and `summarise_sweep`."""
    if len(names) < 2:
        raise ValueError(f"an ensemble sweep needs at least two evaluators, got {len(names)} "
                         f"({', '.join(names) or 'none'}) for aspect {aspect!r}")
    per_subset = subset_correlations(frame, scores, names, human_col, aspect, methods, levels, cap, seed,
                                     judge_null, unusable, user_col, item_col)
    return per_subset, summarise_sweep(per_subset, {aspect: len(names)}, cap)
