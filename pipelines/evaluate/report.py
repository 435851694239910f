"""Seed 000's results tables (III-VI, plus the n-gram and feature metrics; VII when the
references are the reviews) from the aggregates of `rexeval evaluate`, as Markdown and
CSV, and its Figure 2 (StEnt-bin)."""
from __future__ import annotations

import io

import pandas as pd

from rexeval.metrics.aggregate import format_results_table
from rexeval.metrics.registry import higher_is_better
from rexeval.storage import location

# (title, [(metric, label)]): the seed's tables, in its order and naming. A metric
# registered with `table=`/`label=` (metrics.registry) joins these in `tables_for`.
TABLES: list[tuple[str, list[tuple[str, str]]]] = [
    ("Table III: LLM-based statement-level metrics",
     [("st2exp_p", "St2Exp-P"), ("st2exp_r", "St2Exp-R"), ("st2exp_f1", "St2Exp-F1")]),
    ("Table IV: NLI-based statement-level metrics",
     [("stent_p", "StEnt-P"), ("stent_r", "StEnt-R"), ("stent_f1", "StEnt-F1"),
      ("stent_bin_p", "StEnt-bin-P"), ("stent_bin_r", "StEnt-bin-R"), ("stent_bin_f1", "StEnt-bin-F1"),
      ("stcoh_p", "StCoh-P"), ("stcoh_r", "StCoh-R")]),
    ("Table V: standard NLI and QG-QA metrics",
     [("alignscore", "AlignScore"), ("summac_zs", "SummaC-ZS"), ("summac_conv", "SummaC-Conv"),
      ("questeval", "QuestEval"), ("questeval_f1", "QuestEval-F1")]),
    ("Table VI: text similarity metrics",
     [("bertscore-p", "BERT-P"), ("bertscore-r", "BERT-R"), ("bertscore-f1", "BERT-F1"), ("sts", "STS"),
      ("bartscore", "BART"), ("bleurt", "BLEURT")]),
    ("n-gram and feature metrics",
     [("bleu-1", "BLEU-1"), ("bleu-4", "BLEU-4"), ("sentence-bleu-1", "sentence BLEU-1"),
      ("sentence-bleu-4", "sentence BLEU-4"), ("rouge-1-f", "ROUGE-1"), ("rouge-2-f", "ROUGE-2"),
      ("rouge-l-f", "ROUGE-L"), ("meteor", "METEOR"), ("usr", "USR"), ("fmr", "FMR"), ("fcr", "FCR"),
      ("div", "DIV")]),
]


SIMILARITY_TABLE = "Table VI: text similarity metrics"
REVIEW_TABLE = "Table VII: text similarity metrics on review generation"


def tables_for(task: str = "explanation") -> list[tuple[str, list[tuple[str, str]]]]:
    """The seed's tables for `task`, then the metrics registered with a table: appended to
    a seed table of that title, or in a table of their own after the seed's. On review
    generation (references = the reviews) the text similarity metrics are the seed's
    Table VII, not Table VI."""
    from rexeval.metrics.registry import tabled_metrics

    tables = [(title, list(rows)) for title, rows in TABLES]
    listed = {m for _, rows in tables for m, _ in rows}
    for info in tabled_metrics():
        if info.name in listed:
            continue
        rows = next((rows for title, rows in tables if title == info.table), None)
        if rows is None:
            rows = []
            tables.append((info.table, rows))
        rows.append((info.name, info.label or info.name))
    if task != "review":
        return tables
    return [(REVIEW_TABLE if title == SIMILARITY_TABLE else title, rows) for title, rows in tables]


def results_markdown(agg: pd.DataFrame, dataset: str = "", systems: list[str] | None = None,
                     task: str = "explanation") -> str:
    """Every table that has at least one computed metric; best system per metric in
    bold, worst in italics (direction from the metric registry)."""
    systems = systems or sorted(agg["system"].unique())
    tables = tables_for(task)
    labels = {m: lab for _, rows in tables for m, lab in rows}
    out = []
    for title, rows in tables:
        present = [m for m, _ in rows if m in set(agg["metric"])]
        if not present:
            continue
        table = format_results_table(agg, dataset=dataset, metrics=present, systems=systems,
                                     higher_is_better=higher_is_better)
        for m in present:
            table = table.replace(f"| {m} |", f"| {labels[m]} |", 1)
        out.append(f"### {title}\n\n{table}")
    return "\n".join(out)


def results_csv(agg: pd.DataFrame, task: str = "explanation") -> str:
    """One row per (table, metric, system) with mean, std, n, n_missing and the interval."""
    tables = tables_for(task)
    order = {m: (i, j, lab, title) for i, (title, rows) in enumerate(tables)
             for j, (m, lab) in enumerate(rows)}
    rows = []
    for r in agg.to_dict("records"):
        i, j, label, title = order.get(r["metric"], (len(tables), 0, r["metric"], "other"))
        rows.append({"table": title, "metric": label, "key": r["metric"], "system": r["system"],
                     **{k: r.get(k) for k in ("mean", "std", "n", "n_missing", "ci_low", "ci_high", "kind")},
                     "_o": (i, j)})
    df = pd.DataFrame(rows)
    if len(df):
        df = df.sort_values(["_o", "system"], kind="stable").drop(columns="_o")
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.6g")
    return buf.getvalue()


FIGURE2 = [("stent_bin_p", "StEnt-bin-P"), ("stent_bin_r", "StEnt-bin-R"), ("stent_bin_f1", "StEnt-bin-F1")]


def plot_stent_bin(agg: pd.DataFrame, path, dataset: str = "", systems: list[str] | None = None) -> bool:
    """Seed 000's Figure 2: StEnt-bin P/R/F1 per system as grouped bars (in %), with each
    mean's bootstrap interval as an error bar; PNG and SVG at `path` (.png/.svg beside; a
    local path or a URI, each written whole through the storage module). False (nothing
    drawn) when no StEnt-bin metric was computed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = agg[agg["metric"].isin([m for m, _ in FIGURE2])]
    if rows.empty:
        return False
    systems = [s for s in (systems or sorted(rows["system"].unique())) if s in set(rows["system"])]
    width = 0.8 / len(FIGURE2)
    x = np.arange(len(systems))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(systems) + 1.5), 3.2))
    for k, (metric, label) in enumerate(FIGURE2):
        sub = rows[rows["metric"] == metric].set_index("system")
        mean = np.array([100 * float(sub["mean"].get(s, np.nan)) for s in systems])
        lo = np.array([100 * float(sub["ci_low"].get(s, np.nan)) for s in systems])
        hi = np.array([100 * float(sub["ci_high"].get(s, np.nan)) for s in systems])
        err = np.vstack([np.nan_to_num(mean - lo), np.nan_to_num(hi - mean)])
        ax.bar(x + (k - 1) * width, mean, width, yerr=err, capsize=2, label=label)
    ax.set_xticks(x, systems)
    ax.set_ylabel("%")
    ax.set_title(f"StEnt-bin{f' ({dataset})' if dataset else ''}: mean and 95% interval")
    ax.legend(fontsize=8)
    fig.tight_layout()
    loc = location(path)
    for fmt, kwargs in (("png", {"dpi": 120}), ("svg", {})):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, **kwargs)
        (loc.parent / f"{loc.stem}.{fmt}").write_bytes(buf.getvalue())
    plt.close(fig)
    return True


HEADLINE = ["st2exp_f1", "stent_f1", "alignscore", "questeval", "bertscore-f1", "sts", "bleu-4", "rouge-l-f", "usr"]
"""One metric per family of seed 000's tables, for a one-screen summary."""


def headline_markdown(agg: pd.DataFrame, systems: list[str] | None = None) -> str:
    """The headline metrics that were computed, one row each, the mean per system
    (a short summary: the full tables, with spreads and intervals, are in tables.md)."""
    labels = {m: lab for _, rows in TABLES for m, lab in rows}
    systems = systems or sorted(agg["system"].unique())
    means = agg.pivot_table(index="metric", columns="system", values="mean", aggfunc="first")
    present = [m for m in HEADLINE if m in means.index]
    lines = ["| metric | " + " | ".join(systems) + " |", "|---|" + "---:|" * len(systems)]
    for m in present:
        cells = [f"{means.at[m, s]:.3f}" if s in means.columns and pd.notna(means.at[m, s]) else "–"
                 for s in systems]
        arrow = "↑" if higher_is_better(m) else "↓"
        lines.append(f"| {labels.get(m, m)} {arrow} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
