"""The Markdown tables of `rexeval meta-evaluate`, laid out like the seeds' tables so
a run can be read beside the paper it reproduces."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

PAIRWISE_METRICS = (("accuracy", "ACC"), ("cohen_kappa", "C-κ"), ("krippendorff_alpha", "K-α"))


def _md(text: str) -> str:
    """A name as a table cell: judge names may hold a "|"."""
    return str(text).replace("|", "\\|")


def _cell(v: float, scale: float = 100.0, digits: int = 2) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{v * scale:.{digits}f}"


def _notes(results: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    """Why each undefined value of the printed table is undefined, one line per
    (row of the table, reason): an empty cell is never left to guesswork."""
    if "note" not in results or results["note"].isna().all():
        return []
    noted = results[results["note"].notna()]
    lines = ["", 'Why "–":', ""]
    for key, part in noted.groupby(list(keys) + ["note"], sort=False):
        where = " / ".join(_md(k) for k in key[:-1])
        unit = "level" if "level" in part else "metric"
        names = list(dict.fromkeys(part[unit]))
        lines.append(f"- {where} ({unit}{'s' if len(names) > 1 else ''} {', '.join(names)}): {_md(key[-1])}")
    return lines


def correlation_markdown(results: pd.DataFrame, method: str, levels: Sequence[str]) -> str:
    """Seed 001's Table 1 layout: one row per evaluator, one column per aspect (and their
    average when there are several), each cell the levels' values ×100 joined by " / ",
    and why any of them is undefined; then every cell with its interval, the groups it
    rests on and its note."""
    shown = results[results["method"] == method]
    evaluators = list(dict.fromkeys(shown["evaluator"]))
    aspects = list(dict.fromkeys(shown["aspect"]))
    value = {(r.evaluator, r.aspect, r.level): r.value for r in shown.itertuples()}
    header = aspects + (["Average"] if len(aspects) > 1 else [])
    lines = [f"# Meta-evaluation: {method.capitalize()} correlation with human ratings (×100)", "",
             f"Each cell: {' / '.join(levels)} level (seed 001, section 2.4). \"–\": undefined.", "",
             "| Evaluator | " + " | ".join(_md(h) for h in header) + " |", "|---|" + "---|" * len(header)]
    for ev in evaluators:
        cells = []
        for a in aspects:
            cells.append(" / ".join(_cell(value.get((ev, a, lv), math.nan)) for lv in levels))
        if len(aspects) > 1:
            means = []
            for lv in levels:
                vals = [value.get((ev, a, lv), math.nan) for a in aspects]
                means.append(float(np.mean(vals)) if all(np.isfinite(vals)) else math.nan)
            cells.append(" / ".join(_cell(m) for m in means))
        lines.append(f"| {_md(ev)} | " + " | ".join(cells) + " |")
    lines += _notes(shown, ["evaluator", "aspect"])
    lines += ["", "## Every cell", "",
              "| Evaluator | Aspect | Method | Level | ×100 | 95% CI | rows | groups used / total | note |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results.itertuples():
        ci = "–" if not np.isfinite(r.ci_low) else f"[{_cell(r.ci_low)}, {_cell(r.ci_high)}]"
        lines.append(f"| {_md(r.evaluator)} | {_md(r.aspect)} | {r.method} | {r.level} | {_cell(r.value)} | {ci} | "
                     f"{r.n_rows} | {r.n_groups_used} / {r.n_groups_total} | {_md(_note(r))} |")
    return "\n".join(lines) + "\n"


def _note(row) -> str:
    note = getattr(row, "note", None)
    return "" if note is None or (isinstance(note, float) and math.isnan(note)) else str(note)


def pairwise_markdown(results: pd.DataFrame) -> str:
    """Seed 004's Table 2 layout: ACC, C-κ and K-α with ties and without, per evaluator
    (and aspect, when there are several)."""
    aspects = list(dict.fromkeys(results["aspect"]))
    by = {(r.evaluator, r.aspect, r.ties, r.metric): r for r in results.itertuples()}
    head = ["Evaluator"] + (["Aspect"] if len(aspects) > 1 else [])
    cols = [f"{lab} w. tie" for _, lab in PAIRWISE_METRICS] + ["n w. tie"]
    cols += [f"{lab} w/o tie" for _, lab in PAIRWISE_METRICS] + ["n w/o tie"]
    lines = ["# Meta-evaluation: agreement with human verdicts", "",
             "Without ties: items where neither the judge nor the human says C (tie).", "",
             "| " + " | ".join(head + cols) + " |", "|" + "---|" * (len(head) + len(cols))]
    for ev, asp in dict.fromkeys((r.evaluator, r.aspect) for r in results.itertuples()):
        cells = [_md(ev)] + ([_md(asp)] if len(aspects) > 1 else [])
        for ties in (True, False):
            rows = [by[(ev, asp, ties, m)] for m, _ in PAIRWISE_METRICS]
            cells += [_cell(r.value, 1.0, 3) for r in rows] + [str(rows[0].n_used)]
        lines.append("| " + " | ".join(cells) + " |")
    if "note" in results:
        lines += _notes(results.assign(ties=results["ties"].map({True: "with ties", False: "without ties"})),
                        ["evaluator", "aspect", "ties"])
    lines += ["", "## Every cell", "",
              "| Evaluator | Aspect | Ties | Metric | Value | 95% CI | n used / total | note |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results.itertuples():
        ci = "–" if not np.isfinite(r.ci_low) else f"[{_cell(r.ci_low, 1.0, 3)}, {_cell(r.ci_high, 1.0, 3)}]"
        lines.append(f"| {_md(r.evaluator)} | {_md(r.aspect)} | {'with' if r.ties else 'without'} | {r.metric} | "
                     f"{_cell(r.value, 1.0, 3)} | {ci} | {r.n_used} / {r.n_total} | {_md(_note(r))} |")
    return "\n".join(lines) + "\n"


def ensemble_markdown(summary: pd.DataFrame, method: str, levels: Sequence[str], notes: Sequence[str] = ()) -> str:
    """Seed 001's Figure 4 as numbers: per aspect and ensemble size N, the mean [min,
    max] of the correlation over the subsets of N evaluators, one column per level;
    then every (aspect, method, level, N) with the best and worst subset."""
    shown = summary[summary["method"] == method]
    by = {(r.aspect, r.n, r.level): r for r in shown.itertuples()}
    lines = [f"# Ensemble size: {method.capitalize()} correlation of the mean of N evaluators (×100)", "",
             "Each cell: mean [min, max] over the subsets of N evaluators whose scores are averaged per "
             "explanation (seed 001, Figure 4). subsets: how many were scored, of the C(K, N) possible "
             "(a seeded sample past the cap). \"–\": undefined."]
    lines += [""] + [f"Note: {n}." for n in notes]
    lines += ["", "| Aspect | N | subsets | " + " | ".join(levels) + " |", "|---|---:|---:|" + "---:|" * len(levels)]
    for aspect, n in dict.fromkeys((r.aspect, r.n) for r in shown.itertuples()):
        first = next(by[(aspect, n, lv)] for lv in levels if (aspect, n, lv) in by)
        count = str(first.n_subsets) if not first.sampled else f"{first.n_subsets} of {first.n_possible}"
        cells = []
        for lv in levels:
            r = by.get((aspect, n, lv))
            cells.append("–" if r is None or not np.isfinite(r.mean) else
                         f"{_cell(r.mean)} [{_cell(r.min)}, {_cell(r.max)}]")
        lines.append(f"| {_md(aspect)} | {n} | {count} | " + " | ".join(cells) + " |")
    lines += ["", "## Every cell", "",
              "| Aspect | Method | Level | N | subsets | defined | mean | min | max | best subset | worst subset |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in summary.itertuples():
        count = str(r.n_subsets) if not r.sampled else f"{r.n_subsets} of {r.n_possible}"
        lines.append(f"| {_md(r.aspect)} | {r.method} | {r.level} | {r.n} | {count} | {r.n_defined} | "
                     f"{_cell(r.mean)} | {_cell(r.min)} | {_cell(r.max)} | {_md(r.best or '–')} | "
                     f"{_md(r.worst or '–')} |")
    return "\n".join(lines) + "\n"
