"""ExpScore's report: agreement with human ratings and the Markdown tables (seed 003's
Tables 1-4 on this data), kept apart from the runners that fill it."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rexeval.metrics.expscore_factors import FACTOR_NAMES, FACTORS
from rexeval.models.expscore import ExpScoreModel


def correlations(x: Sequence[float], y: Sequence[float]) -> dict[str, float | None]:
    """Pearson's r and Kendall's tau (tau-b) with p-values; None where undefined
    (fewer than 3 rows, or a constant side)."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    out: dict[str, float | None] = {"n": len(x), "pearson": None, "pearson_p": None,
                                    "kendall": None, "kendall_p": None}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    r = stats.pearsonr(x, y)
    t = stats.kendalltau(x, y)
    out.update(pearson=float(r.statistic), pearson_p=float(r.pvalue),
               kendall=float(t.statistic), kendall_p=float(t.pvalue))
    return out


def accuracy_within(pred: Sequence[float], label: Sequence[float], tol: float = 0.5) -> float | None:
    """Share of predictions within label ± tol (seed 003, Table 4)."""
    pred = np.asarray(pred, dtype=np.float64)
    label = np.asarray(label, dtype=np.float64)
    return float(np.mean(np.abs(pred - label) <= tol)) if len(pred) else None


def head_metrics(model: ExpScoreModel, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """One head's agreement with the ratings of these rows: r, tau, accuracy and loss."""
    if len(y) == 0:
        return {"n": 0}
    pred = model.predict(x)
    return {**correlations(pred, y), "accuracy": accuracy_within(pred, y), "loss": model.loss(x, y),
            "loss_type": "CE" if model.head == "logistic" else "MSE"}


def baseline_correlations(values, y: np.ndarray, parts: dict[str, np.ndarray], names: Sequence[str],
                          unavailable: dict[str, str]) -> dict[str, dict | None]:
    """Seed 003's Table 1 baselines against the ratings: per baseline and part (the
    heads' train / test rows, and all rows), Pearson and Kendall over the rows where the
    baseline is defined; None for a baseline that could not run (`unavailable`)."""
    out: dict[str, dict | None] = {}
    for name in names:
        v = np.asarray(values[name], dtype=np.float64)
        out[name] = {part: correlations(v[m & np.isfinite(v)], y[m & np.isfinite(v)])
                     for part, m in {**parts, "all": np.ones(len(y), dtype=bool)}.items()}
    return out | {name: None for name in unavailable}


def baseline_notes(unavailable: dict[str, str]) -> list[str]:
    """One line per Table 1 baseline that could not be computed, with the reason."""
    return [f"baseline {name} not computed: {why}" for name, why in unavailable.items()]


def unavailable_notes(unavailable: dict[str, str]) -> list[str]:
    """One line per factor the model was trained and scores without, with the reason."""
    return [f"{f} ({FACTOR_NAMES[f]}) unavailable, so trained and scored without it: {why}"
            for f, why in unavailable.items()]


def _fmt(v: Any, digits: int = 3) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def report_markdown(report: dict) -> str:
    """report.json as Markdown: the seed's Tables 1-4 on this data."""
    lines = [f"# ExpScore {report['job']}", "", "| rows | count |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in report["counts"].items()] + [""]
    heads = report.get("heads") or {}
    for part in ("test", "train", "score"):
        have = {h: m[part] for h, m in heads.items() if m.get(part, {}).get("n")}
        if not have:
            continue
        lines += [f"## Heads against human ratings ({part} rows)", "",
                  "| metric | n | Pearson r | Kendall τ | accuracy (±0.5) | loss type | loss |",
                  "|---|---:|---:|---:|---:|---|---:|"]
        for name, m in (report.get("baselines") or {}).items():  # Table 1's text-overlap rows
            if m is None:
                lines.append(f"| {name} (vs the item's reviews) | – | unavailable | unavailable | – | | – |")
            elif m.get(part, {}).get("n"):
                b = m[part]
                lines.append(f"| {name} (vs the item's reviews) | {b['n']} | {_fmt(b.get('pearson'))} | "
                             f"{_fmt(b.get('kendall'))} | – | | – |")
        for h, m in have.items():
            lines.append(f"| ExpScore ({h}) | {m['n']} | {_fmt(m.get('pearson'))} | {_fmt(m.get('kendall'))} | "
                         f"{_fmt(m.get('accuracy'))} | {m.get('loss_type', '')} | {_fmt(m.get('loss'), 4)} |")
        lines.append("")
    factors = report.get("factor_correlations") or {}
    if factors:
        lines += ["## Single factors against human ratings (all scored rows)", "",
                  "| factor | | Pearson r | Kendall τ |", "|---|---|---:|---:|"]
        for f, m in factors.items():
            if m is None:
                lines.append(f"| {f} | {FACTOR_NAMES[f]} | unavailable | unavailable |")
            else:
                lines.append(f"| {f} | {FACTOR_NAMES[f]} | {_fmt(m.get('pearson'))} | {_fmt(m.get('kendall'))} |")
        lines.append("")
    weights = report.get("linear_weights")
    if weights:
        names = [f for f in FACTORS if f in weights]
        lines += ["## Factor weights of ExpScore (linear), on z-scored factors", "",
                  "| " + " | ".join(names) + " | bias |", "|" + "---:|" * (len(names) + 1),
                  "| " + " | ".join(_fmt(weights[f]) for f in names) + f" | {_fmt(weights['bias'])} |", ""]
    for note in report.get("notes") or []:
        lines.append(f"- {note}")
    return "\n".join(lines).rstrip() + "\n"
