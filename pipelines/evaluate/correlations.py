"""Metric agreement for `rexeval evaluate`: Kendall tau-b between every pair of metrics,
over systems and over examples (`metrics.correlation`), from the files the job already
wrote (scores.parquet, aggregates.parquet), so a resumed or re-run job rebuilds it
cheaply and the same way. Writes, beside them:

- metric_correlations.parquet / .csv: dataset, over (systems | examples), metric_a,
  metric_b, tau, p, n, note (why tau is NaN, when it is);
- metric_correlations_<dataset>_<over>.png: one heat map per dataset and level, cells
  annotated, metrics in the results tables' order;
- metric_correlations.md: the same as lower-triangle Markdown tables.

No existing output of the job changes. Lower-is-better metrics are negated first (see
`metrics.correlation`), so a positive tau always means agreement on which is better.
"""
from __future__ import annotations

import io
import re
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.metrics.correlation import (
    LEVELS,
    correlation_matrix,
    metric_correlations,
    ordered_metrics,
    registry_direction,
)
from rexeval.pipelines.core.io import read_table, write_bytes_atomic, write_parquet_atomic
from rexeval.pipelines.core.schema import SCORE_AGGREGATES, SCORES
from rexeval.storage import PathLike, location
from rexeval.pipelines.evaluate.config import EVALUATE_OUTPUTS as OUT

DEFAULT_DATASET = "all"  # the dataset label when the job was given no --dataset
SIGNIFICANT = 0.05

METRIC_CORRELATIONS = pa.schema([
    pa.field("dataset", pa.string(), nullable=False),
    pa.field("over", pa.string(), nullable=False),  # systems | examples
    pa.field("metric_a", pa.string(), nullable=False),
    pa.field("metric_b", pa.string(), nullable=False),
    pa.field("tau", pa.float64()),  # Kendall tau-b, lower-is-better metrics negated
    pa.field("p", pa.float64()),  # two-sided
    pa.field("n", pa.int64(), nullable=False),  # systems, or (system, example) rows with both values
    pa.field("note", pa.string()),  # why tau is NaN, when it is
])


def report_order() -> tuple[list[str], dict[str, str]]:
    """Metric keys in the results tables' order, and their labels there."""
    from rexeval.pipelines.evaluate.report import tables_for

    rows = [(m, lab) for _, table in tables_for() for m, lab in table]
    return [m for m, _ in rows], dict(rows)


def slug(dataset: str) -> str:
    """A file-name-safe form of a dataset name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", dataset).strip("_") or DEFAULT_DATASET


def frames_from_job(root: PathLike, dataset: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-example values, per-system values) as wide frames, from the job's files."""
    root = location(root)
    scores = read_table(root / OUT.scores, SCORES).to_pandas()
    examples = (scores.set_index(["system", "example_id", "metric"])["value"].unstack("metric")
                .reset_index() if len(scores) else pd.DataFrame(columns=["system", "example_id"]))
    agg = read_table(root / OUT.aggregates, SCORE_AGGREGATES).select(["system", "metric", "mean"]).to_pandas()
    systems = (agg.set_index(["system", "metric"])["mean"].unstack("metric").reset_index()
               if len(agg) else pd.DataFrame(columns=["system"]))
    for frame in (examples, systems):
        frame.columns.name = None
        frame.insert(0, "dataset", dataset)
    return examples, systems


def write_metric_correlations(root: PathLike, dataset: str = "",
                              progress: Callable[[str], None] = print) -> str:
    """Compute and write the correlation files in the job folder `root` (a local path
    or a URI); returns the Markdown."""
    root = location(root)
    dataset = dataset or DEFAULT_DATASET
    order, labels = report_order()
    examples, systems = frames_from_job(root, dataset)
    long = metric_correlations(examples, systems, order=order)
    table = pa.Table.from_pandas(long, schema=METRIC_CORRELATIONS, preserve_index=False)
    write_parquet_atomic(root / OUT.correlations, table)
    buf = io.StringIO()
    long.to_csv(buf, index=False, float_format="%.6g")
    write_bytes_atomic(root / OUT.correlations_csv, buf.getvalue().encode())
    for old in root.glob(OUT.correlation_figures.pattern):  # heat maps of an earlier run (another dataset name)
        old.unlink()
    drawn = 0
    for (ds, over), part in long.groupby(["dataset", "over"], sort=True):
        metrics = ordered_metrics([*part["metric_a"], *part["metric_b"]], order)
        png = root / OUT.correlation_figures.format(dataset=slug(ds), over=over)
        drawn += plot_heatmap(part, metrics, png, labels, ds, over)
    md = correlations_markdown(long, order, labels)
    write_bytes_atomic(root / OUT.correlations_md, md.encode())
    n_ok = int(long["tau"].notna().sum())
    progress(f"evaluate: Kendall tau for {len(long)} metric pair(s) ({n_ok} defined), {drawn} heat map(s) "
             f"-> {root / OUT.correlations_csv}")
    return md


# ------------------------------------------------------------------ report


def _direction_note(metrics: list[str], labels: dict[str, str]) -> str:
    flipped = [labels.get(m, m) for m in metrics if not registry_direction(m)]
    return (f"Lower-is-better metrics negated first ({', '.join(flipped)}), so " if flipped else
            "All metrics here are higher-is-better, so ") + "τ > 0 means two metrics agree on which is better."


def correlations_markdown(long: pd.DataFrame, order: list[str], labels: dict[str, str]) -> str:
    """One lower-triangle table per (dataset, over): Kendall tau-b, * for p < 0.05, – for
    undefined (the note under the table says why)."""
    out = ["## Metric agreement (Kendall τ-b between metrics)", "",
           "Seed 000's research questions on how far the metrics agree when they rank systems. "
           "Kendall τ-b between every pair of metrics: over systems (each system's mean, or its corpus-level "
           "value) and over examples (every (system, example) row; pairs with a NaN left out). "
           f"* p < {SIGNIFICANT}; – undefined. Full table: {OUT.correlations_csv}.", ""]
    if long.empty:
        return "\n".join([*out, "No pair of metrics to correlate (fewer than two metrics were computed).", ""])
    for (ds, over) in [(d, o) for d in dict.fromkeys(long["dataset"]) for o in LEVELS]:
        part = long[(long["dataset"] == ds) & (long["over"] == over)]
        if part.empty:
            continue
        metrics = ordered_metrics([*part["metric_a"], *part["metric_b"]], order)
        ns = part["n"]
        count = (f"{ns.max()} systems" if over == "systems" else
                 f"n = {ns.min()}–{ns.max()} (system, example) rows per pair" if ns.min() != ns.max()
                 else f"n = {ns.max()} (system, example) rows per pair")
        out += [f"### Kendall τ over {over}: {ds}", "",
                f"Over {count}. {_direction_note(metrics, labels)}", ""]
        key = {(r.metric_a, r.metric_b): r for r in part.itertuples(index=False)}
        key.update({(b, a): r for (a, b), r in list(key.items())})
        out.append("| Metric | " + " | ".join(labels.get(m, m) for m in metrics[:-1]) + " |")
        out.append("|---|" + "---:|" * (len(metrics) - 1))
        for i, a in enumerate(metrics[1:], start=1):
            cells = []
            for j, b in enumerate(metrics[:-1]):
                r = key.get((a, b)) if j < i else None
                cells.append("" if j >= i else "–" if r is None or not np.isfinite(r.tau)
                             else f"{r.tau:.2f}{'*' if r.p < SIGNIFICANT else ''}")
            out.append(f"| {labels.get(a, a)} | " + " | ".join(cells) + " |")
        notes = part["note"].dropna().value_counts()
        out.append("")
        for note, k in notes.items():
            out.append(f"{k} pair(s) undefined: {note}.")
        if len(notes):
            out.append("")
    return "\n".join(out)


def plot_heatmap(part: pd.DataFrame, metrics: list[str], path: PathLike, labels: dict[str, str], dataset: str,
                 over: str) -> bool:
    """A PNG heat map of one (dataset, over) slice: tau in each cell, grey where
    undefined. False (nothing drawn) for fewer than two metrics."""
    if len(metrics) < 2:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = correlation_matrix(part, metrics).to_numpy(dtype=np.float64)
    k = len(metrics)
    size = max(4.0, 0.42 * k + 2.0)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#d9d9d9")
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=-1.0, vmax=1.0)
    font = 8 if k <= 12 else 6 if k <= 24 else 4.5
    for i in range(k):
        for j in range(k):
            v = m[i, j]
            ax.text(j, i, "n/a" if not np.isfinite(v) else f"{v:.2f}", ha="center", va="center", fontsize=font,
                    color="white" if np.isfinite(v) and abs(v) > 0.6 else "black")
    names = [labels.get(x, x) + ("" if registry_direction(x) else " (negated)") for x in metrics]
    ax.set_xticks(range(k), names, rotation=60, ha="right", fontsize=font + 1)
    ax.set_yticks(range(k), names, fontsize=font + 1)
    n = int(part["n"].max()) if len(part) else 0
    what = f"{n} systems" if over == "systems" else "examples"
    ax.set_title(f"Kendall τ-b between metrics over {what} ({dataset})", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="τ (> 0: agree on which is better)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return True
