"""Do the metrics agree? Kendall rank correlation (tau-b, scipy.stats.kendalltau) between
every pair of metrics, per dataset, at two levels (seed 000's question of how far the
metrics agree on which system is better):

- "systems": one value per system and metric (the mean the results tables show, or a
  corpus-level value); tau over the systems of the dataset. With fewer than
  `MIN_N` (3) systems a rank correlation says nothing: tau and p are NaN and `note`
  says why (tau over two systems is always +1 or -1).
- "examples": the per-example values of every (system, example) row of the dataset;
  rows where either metric is NaN (an example the metric could not score) are dropped
  for that pair, and `n` counts the rows kept. The same minimum of 3 rows applies.

Direction: values of a metric whose registry entry says lower is better are negated
before ranking (Kendall's tau only depends on ranks, so this flips its sign and nothing
else). A positive tau therefore always means the two metrics agree on which system (or
explanation) is better, a negative one that they disagree. Metrics the registry does
not know are taken as higher-is-better, as the results tables do.

A metric with no value at all in a dataset (at that level) is left out of that
dataset's pairs; a constant metric gives NaN (no ranking) with a note. These are
meta-metrics: nothing here is registered in metrics.registry.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from rexeval.metrics.registry import higher_is_better as registry_direction

LEVELS = ("systems", "examples")
ID_COLUMNS = ("dataset", "system", "example_id")
COLUMNS = ("dataset", "over", "metric_a", "metric_b", "tau", "p", "n", "note")
MIN_N = 3
NAN = float("nan")


def kendall_pair(x, y, min_n: int = MIN_N, unit: str = "rows") -> tuple[float, float, int, str | None]:
    """(tau-b, two-sided p, n, note) over the positions where neither x nor y is NaN;
    NaN with a note when fewer than `min_n` remain or one side is constant."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have equal length, got {x.size} and {y.size}")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    n = int(x.size)
    if n < min_n:
        return NAN, NAN, n, f"not meaningful: {n} {unit} with both values (fewer than {min_n})"
    if np.all(x == x[0]) or np.all(y == y[0]):
        return NAN, NAN, n, "no ranking: a metric is constant over these " + unit
    res = stats.kendalltau(x, y)  # tau-b (ties corrected), two-sided p
    return float(res.statistic), float(res.pvalue), n, None


def ordered_metrics(columns: Sequence[str], order: Sequence[str] | None = None) -> list[str]:
    """`columns` with those named in `order` first, in that order, then the rest as given."""
    cols = [c for c in columns if c not in ID_COLUMNS]
    first = [m for m in (order or ()) if m in cols]
    return list(dict.fromkeys([*first, *cols]))


def pairwise_kendall(values: pd.DataFrame, metrics: Sequence[str], higher_is_better: Callable[[str], bool],
                     min_n: int = MIN_N, unit: str = "rows") -> pd.DataFrame:
    """One row per unordered pair (metric_a before metric_b in `metrics`): tau, p, n,
    note; each row of `values` is one observation, lower-is-better metrics negated."""
    oriented = {m: values[m].to_numpy(dtype=np.float64) * (1.0 if higher_is_better(m) else -1.0) for m in metrics}
    rows = []
    for i, a in enumerate(metrics):
        for b in metrics[i + 1:]:
            tau, p, n, note = kendall_pair(oriented[a], oriented[b], min_n=min_n, unit=unit)
            rows.append({"metric_a": a, "metric_b": b, "tau": tau, "p": p, "n": n, "note": note})
    return pd.DataFrame(rows, columns=["metric_a", "metric_b", "tau", "p", "n", "note"])


def system_means(examples: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, system) mean of each metric column, NaN left out (the aggregates'
    mean), for callers without a table of system-level values."""
    metrics = ordered_metrics(examples.columns)
    return examples.groupby(["dataset", "system"], sort=True)[metrics].mean().reset_index()


def metric_correlations(examples: pd.DataFrame, systems: pd.DataFrame | None = None,
                        order: Sequence[str] | None = None,
                        higher_is_better: Callable[[str], bool] = registry_direction,
                        min_n: int = MIN_N) -> pd.DataFrame:
    """The long table (COLUMNS) for every dataset and level.

    `examples`: one row per (system, example) with columns dataset, system (and
    optionally example_id) and one column per per-example metric. `systems`: one row
    per (dataset, system) with one column per metric (means and corpus-level values);
    by default the means of `examples`. `order` puts metrics in a report's order.
    """
    for name, frame in (("examples", examples), ("systems", systems)):
        if frame is not None and {"dataset", "system"} - set(frame.columns):
            raise ValueError(f"{name} values need 'dataset' and 'system' columns, got {list(frame.columns)}")
    if systems is None:
        systems = system_means(examples)
    parts = []
    for over, frame, unit in (("systems", systems, "systems"), ("examples", examples, "(system, example) rows")):
        for dataset, part in frame.groupby("dataset", sort=True):
            metrics = [m for m in ordered_metrics(frame.columns, order) if part[m].notna().any()]
            pairs = pairwise_kendall(part, metrics, higher_is_better, min_n=min_n, unit=unit)
            pairs.insert(0, "over", over)
            pairs.insert(0, "dataset", str(dataset))
            parts.append(pairs)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(COLUMNS))
    out["n"] = out["n"].astype("int64")
    out["tau"] = out["tau"].astype("float64")
    out["p"] = out["p"].astype("float64")
    return out[list(COLUMNS)]


def correlation_matrix(long: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Square, symmetric tau matrix of one (dataset, over) slice of the long table, in
    the order of `metrics`; the diagonal is 1 for a metric with any defined tau."""
    m = pd.DataFrame(np.nan, index=list(metrics), columns=list(metrics))
    for r in long.itertuples(index=False):
        if r.metric_a in m.index and r.metric_b in m.index:
            m.loc[r.metric_a, r.metric_b] = m.loc[r.metric_b, r.metric_a] = r.tau
    for k in metrics:
        if m.loc[k].notna().any():
            m.loc[k, k] = 1.0
    return m
