"""`rexeval meta-evaluate --ensemble-sweep`: seed 001's Figure 4 from the columns the
job already read. The evaluators of one aspect (judge prefixes in a wide table, judges
in long scores) are the candidates; `metrics.ensemble` averages every subset and
correlates it. This module groups the targets, applies the job's null policies, and
writes the table, the Markdown and the figure."""
from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.metrics.agreement import Target
from rexeval.metrics.ensemble import SUBSET_COLUMNS, SWEEP_COLUMNS, ensemble_sweep
from rexeval.pipelines.core.io import write_bytes_atomic, write_parquet_atomic
from rexeval.storage import Location, location
from rexeval.pipelines.meta_evaluate.config import META_EVALUATE_OUTPUTS as OUT, MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.report import ensemble_markdown

SWEEP_FILE, SWEEP_CSV, SWEEP_TABLE, SWEEP_FIGURE, SUBSETS_FILE = (
    OUT.sweep, OUT.sweep_csv, OUT.sweep_table, OUT.sweep_figure, OUT.subsets)
SWEEP_OUTPUTS = (SWEEP_FILE, SWEEP_CSV, SWEEP_TABLE, SWEEP_FIGURE, SUBSETS_FILE)

SWEEP_RESULTS = pa.schema([
    pa.field("aspect", pa.string()), pa.field("method", pa.string()), pa.field("level", pa.string()),
    pa.field("n", pa.int64()), pa.field("n_judges", pa.int64()), pa.field("n_subsets", pa.int64()),
    pa.field("n_possible", pa.int64()), pa.field("sampled", pa.bool_()), pa.field("n_defined", pa.int64()),
    pa.field("mean", pa.float64()), pa.field("min", pa.float64()), pa.field("max", pa.float64()),
    pa.field("best", pa.string()), pa.field("worst", pa.string()),
])
assert tuple(SWEEP_RESULTS.names) == SWEEP_COLUMNS

SUBSET_RESULTS = pa.schema([
    pa.field("aspect", pa.string()), pa.field("n", pa.int64()), pa.field("subset", pa.string()),
    pa.field("method", pa.string()), pa.field("level", pa.string()), pa.field("value", pa.float64()),
    pa.field("n_rows", pa.int64()), pa.field("n_groups_used", pa.int64()), pa.field("n_groups_total", pa.int64()),
])
assert tuple(SUBSET_RESULTS.names) == SUBSET_COLUMNS


def ensemble_groups(targets: list[Target]) -> tuple[dict[str, list[Target]], list[str]]:
    """The targets by aspect, for the aspects with at least two evaluators, and a note
    for each aspect left out. ValueError when no aspect has two (nothing to sweep), or
    when an aspect's evaluators meet different human columns."""
    by_aspect: dict[str, list[Target]] = {}
    for t in targets:
        by_aspect.setdefault(t.aspect, []).append(t)
    groups, notes = {}, []
    for aspect, ts in by_aspect.items():
        if len(ts) < 2:
            notes.append(f"aspect {aspect!r} has a single evaluator ({ts[0].evaluator}): left out of the "
                         "ensemble sweep")
            continue
        humans = sorted({t.human_col for t in ts})
        if len(humans) > 1:
            raise ValueError(f"ensemble sweep: the evaluators of aspect {aspect!r} are compared with different "
                             f"human columns {humans}; an ensemble needs one")
        groups[aspect] = ts
    if not groups:
        found = "; ".join(f"{a}: {', '.join(t.evaluator for t in ts)}" for a, ts in by_aspect.items())
        raise ValueError("the ensemble sweep (--ensemble-sweep) needs at least two evaluators scoring one aspect, "
                         f"found only one per aspect ({found or 'no evaluator'}); give several --judge-prefix "
                         "in a wide table, or long scores from several judges")
    return groups, notes


def run_ensemble_sweep(cfg: MetaEvaluateConfig, joined: pd.DataFrame, groups: dict[str, list[Target]],
                       notes: list[str], column: Callable, root: Location, human_null: float | None,
                       judge_null: float | None, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Sweep every aspect of `groups`, write the outputs into `root`; returns the
    report's entry (the evaluators per aspect, the subsets scored, notes, files).
    `column(side, name)` is the job's reader: (values, unreadable mask) per joined row."""
    summaries, subsets, n_subsets = [], [], 0
    for aspect, ts in groups.items():
        read = [column("judge", t.judge_col) for t in ts]
        scores = np.column_stack([np.asarray(values, np.float64) for values, _ in read])
        unusable = np.column_stack([bad for _, bad in read])
        h_values, h_bad = column("human", ts[0].human_col)
        human = np.asarray(h_values, np.float64)
        human = np.where(np.isnan(human), np.nan if human_null is None else human_null, human)
        human[h_bad] = np.nan  # an unreadable rating leaves its row out
        frame = joined[[cfg.user_col, cfg.item_col]].assign(human=human)
        per_subset, summary = ensemble_sweep(frame, scores, [t.evaluator for t in ts], "human", aspect,
                                             cfg.methods, cfg.levels, cfg.ensemble_cap, cfg.seed, judge_null,
                                             unusable, cfg.user_col, cfg.item_col)
        count = per_subset[["n", "subset"]].drop_duplicates().shape[0]
        n_subsets += count
        progress(f"ensemble sweep, {aspect}: {count} subset(s) of {len(ts)} evaluators")
        summaries.append(summary)
        subsets.append(per_subset)
    summary = pd.concat(summaries, ignore_index=True)
    # Every subset's own correlation, for statistics beyond Figure 4's mean and range.
    every = pd.concat(subsets, ignore_index=True)
    write_parquet_atomic(root / SUBSETS_FILE, pa.Table.from_pandas(every.astype({"n": "int64"}), schema=SUBSET_RESULTS,
                                                                   preserve_index=False))
    write_parquet_atomic(root / SWEEP_FILE, pa.Table.from_pandas(summary, schema=SWEEP_RESULTS, preserve_index=False))
    write_bytes_atomic(root / SWEEP_CSV, summary.to_csv(index=False).encode())
    markdown = ensemble_markdown(summary, cfg.shown_method, cfg.levels, notes)
    write_bytes_atomic(root / SWEEP_TABLE, markdown.encode())
    plot_sweep(summary, cfg.methods, cfg.levels, root / SWEEP_FIGURE)
    return {"aspects": {a: [t.evaluator for t in ts] for a, ts in groups.items()}, "cap": cfg.ensemble_cap,
            "seed": cfg.seed, "subsets": n_subsets, "notes": notes, "outputs": list(SWEEP_OUTPUTS),
            "markdown": markdown}


def plot_sweep(summary: pd.DataFrame, methods: list[str], levels: list[str],
               path: Path | Location) -> Path | Location:
    """Figure 4's layout: one panel per (aspect, level), x = N, a line for the mean over
    the subsets of each method and a band from their minimum to their maximum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aspects = list(dict.fromkeys(summary["aspect"]))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(len(aspects), len(levels), figsize=(3.2 * len(levels) + 0.8, 2.6 * len(aspects) + 0.8),
                             squeeze=False)
    for i, aspect in enumerate(aspects):
        for j, level in enumerate(levels):
            ax = axes[i, j]
            for m, method in enumerate(methods):
                d = summary[(summary["aspect"] == aspect) & (summary["level"] == level)
                            & (summary["method"] == method)].sort_values("n")
                color = colors[m % len(colors)]
                ax.plot(d["n"], d["mean"], marker="o", color=color, label=f"{method} (mean)")
                ax.fill_between(d["n"], d["min"], d["max"], color=color, alpha=0.15, linewidth=0,
                                label=f"{method} (min–max)")
            ks = summary.loc[summary["aspect"] == aspect, "n"]
            ax.set_xticks(range(1, int(ks.max()) + 1))
            ax.axhline(0.0, color="grey", linewidth=0.5)
            ax.set_title(f"{aspect}, {level} level", fontsize=9)
            if i == len(aspects) - 1:
                ax.set_xlabel("N (evaluators averaged)")
            if j == 0:
                ax.set_ylabel("correlation")
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    image = io.BytesIO()  # drawn in memory, written through the storage module (a URI out)
    fig.savefig(image, format="png", dpi=150)
    plt.close(fig)
    location(path).write_bytes(image.getvalue())
    return path
