"""Per-example scores (long format) -> mean ± std, n and a bootstrap interval per
(system, metric), and the results tables of seed 000 (Tables III–VI).

The std is the population std (ddof=0), as the seed reports it. NaN values (an example
a metric could not score, e.g. an empty statement set under the "skip" policy) are left
out and counted in `n_missing`. The 95% interval is a percentile bootstrap of the mean
(scipy.stats.bootstrap, seeded, 1,000 resamples by default); with fewer than two values
it is NaN.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

AGG_COLUMNS = ("system", "metric", "mean", "std", "n", "n_missing", "ci_low", "ci_high")


def bootstrap_ci(values: np.ndarray, confidence: float = 0.95, n_resamples: int = 1000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (NaN for fewer than two values, or when
    `n_resamples` is 0: no interval asked for)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2 or n_resamples < 1:
        return float("nan"), float("nan")
    if np.all(values == values[0]):
        return float(values[0]), float(values[0])
    from scipy import stats  # here: the CLI's --help and study plans import this module

    res = stats.bootstrap((values,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
                          method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def aggregate_scores(scores: pd.DataFrame, confidence: float = 0.95, n_resamples: int = 1000,
                     seed: int = 0) -> pd.DataFrame:
    """`scores` has columns system, metric, value (one row per example); one row per
    (system, metric) with the columns of AGG_COLUMNS."""
    missing = {"system", "metric", "value"} - set(scores.columns)
    if missing:
        raise ValueError(f"scores lack column(s) {sorted(missing)}")
    rows = []
    for (system, metric), part in scores.groupby(["system", "metric"], sort=True):
        values = part["value"].to_numpy(dtype=np.float64)
        ok = values[~np.isnan(values)]
        low, high = bootstrap_ci(ok, confidence, n_resamples, seed)
        rows.append({"system": system, "metric": metric,
                     "mean": float(ok.mean()) if len(ok) else float("nan"),
                     "std": float(ok.std(ddof=0)) if len(ok) else float("nan"),
                     "n": int(len(ok)), "n_missing": int(len(values) - len(ok)),
                     "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows, columns=list(AGG_COLUMNS))


def format_results_table(agg: pd.DataFrame, dataset: str = "", metrics: Sequence[str] | None = None,
                         systems: Sequence[str] | None = None,
                         higher_is_better: Callable[[str], bool] = lambda m: True) -> str:
    """Markdown in the layout of seed 000's Tables III–VI: one row per metric, one column
    per system, "mean±std" (the mean alone where there is no std, as for corpus-level
    metrics); the best system per metric in bold, the worst in italics (no marks when all
    systems tie)."""
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(agg["metric"]))
    systems = list(systems) if systems is not None else list(dict.fromkeys(agg["system"]))
    table = agg.set_index(["metric", "system"])
    lines = ["| Dataset | Metric | " + " | ".join(systems) + " |", "|---|---|" + "---|" * len(systems)]
    for i, metric in enumerate(metrics):
        means = {s: table.loc[(metric, s), "mean"] for s in systems if (metric, s) in table.index}
        finite = {s: v for s, v in means.items() if np.isfinite(v)}
        best = worst = None
        if len(finite) > 1 and len(set(finite.values())) > 1:
            pick = max if higher_is_better(metric) else min
            other = min if higher_is_better(metric) else max
            best, worst = pick(finite, key=finite.get), other(finite, key=finite.get)
        cells = []
        for s in systems:
            if (metric, s) not in table.index:
                cells.append("–")
                continue
            r = table.loc[(metric, s)]
            text = ("–" if not np.isfinite(r["mean"]) else f"{r['mean']:.4f}" if not np.isfinite(r["std"])
                    else f"{r['mean']:.4f}±{r['std']:.4f}")
            cells.append(f"**{text}**" if s == best else f"*{text}*" if s == worst else text)
        lines.append(f"| {dataset if i == 0 else ''} | {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
