"""Seed 002 Table 1 and Figure 3 from the results folders of the `rexeval star` jobs.

Table 1: P/R/NDCG@k per method at global and item level; under each learned model a
"Gain" row = its value minus the best popularity baseline's (USERPOP, ITEMPOP,
GLOBALPOP; chosen per level and metric, as the seed does), with significance stars from
a paired t-test on the per-interaction values against that baseline
(* p<0.05, ** p<0.01, *** p<0.001). The best popularity baseline is underlined and the
best method in bold. Cohen's d and Cliff's delta of the same comparisons go to the
details table (CSV / JSON).

A model trained with several seeds (seed 002 reports the mean of 3 runs) shows the mean
over runs of each run's average, ± the sample standard deviation over runs (min and max
in the CSV). The seed says only "t-test against the best baseline"; here the paired
t-test pools the per-interaction values of every run, each paired with the baseline's
value on the same interaction (see `table1`).
"""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import numpy as np
import pandas as pd

from rexeval.storage import Location, location
from rexeval.pipelines.star.outputs import PER_INTERACTION, RESULTS

from rexeval.metrics.significance import compare

POPULARITY = ("USERPOP", "ITEMPOP", "GLOBALPOP")
ORDER = ("RANDOM", "USERPOP", "ITEMPOP", "GLOBALPOP", "BPER+", "EXPGCN")
METRICS = ("precision", "recall", "ndcg")
SHORT = {"precision": "P", "recall": "R", "ndcg": "N"}


def load_results(run: str | Path | Location) -> dict[str, pd.DataFrame]:
    """method -> per-interaction table of a run folder (its results/<method>/), local or by URI."""
    from rexeval.pipelines.core.io import read_parquet

    root = location(run) / RESULTS
    if not root.is_dir():
        raise FileNotFoundError(f"{run}: no results/ folder (run `rexeval star baselines` or "
                                "`rexeval star train` with --out there first)")
    out = {}
    for d in root.iterdir():
        f = d / PER_INTERACTION.name
        if f.exists():
            out[d.name] = read_parquet(f).to_pandas()
    if not out:
        raise FileNotFoundError(f"{root}: no results/<method>/per_interaction.parquet")
    return out


def _ordered(methods: Sequence[str]) -> list[str]:
    known = [m for m in ORDER if m in methods]
    return known + sorted(m for m in methods if m not in ORDER)


def _values(df: pd.DataFrame, level: str, metric: str) -> dict:
    """Run -> per-interaction values at `level` (a Series by interaction); a table
    without a `run` column is one run (key None)."""
    part = df[df["level"] == level]
    if metric not in part:
        return {}
    if "run" not in part:
        return {None: part.set_index("interaction")[metric]}
    return {run: g.set_index("interaction")[metric] for run, g in part.groupby("run", sort=True)}


def _pooled(runs: dict, base: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Every run's values, each paired with the baseline's on the same interaction."""
    pairs = [s.align(base, join="inner") for s in runs.values()]
    return (np.concatenate([a.to_numpy() for a, _ in pairs]), np.concatenate([b.to_numpy() for _, b in pairs]))


def table1(runs: dict[str, str | Path], k: int = 10, levels: Sequence[str] = ("global", "item")) -> pd.DataFrame:
    """Long table: dataset, method, level, metric, value, plus for learned models the gain
    against the best popularity baseline and its statistics.

    A method with several runs (a `run` column, `star train --seeds N`) gets as `value`
    the mean over runs of each run's macro average, and `std` (sample standard deviation
    over runs, ddof=1), `min`, `max` of those and `runs`; its t-test (and Cohen's d,
    Cliff's delta) pools every run's per-interaction values, each paired with the
    baseline's value on the same interaction (the popularity baselines are deterministic,
    so their values repeat per run; a baseline with runs pairs with its per-interaction
    mean). Tables of one-run methods only keep today's columns.
    """
    rows = []
    for dataset, run in runs.items():
        res = load_results(run)
        for level in levels:
            for metric in METRICS:
                name = f"{metric}@{k}"
                vals = {m: _values(df, level, name) for m, df in res.items()}
                vals = {m: v for m, v in vals.items() if sum(len(s) for s in v.values())}
                run_means = {m: [float(s.mean()) for s in v.values()] for m, v in vals.items()}
                means = {m: rm[0] if len(rm) == 1 else float(np.mean(rm)) for m, rm in run_means.items()}
                pops = [m for m in POPULARITY if m in means]
                best_pop = max(pops, key=lambda m: means[m]) if pops else None
                best_all = max(means, key=lambda m: means[m]) if means else None
                for m in _ordered(list(vals)):
                    row = {"dataset": dataset, "method": m, "level": level, "metric": name,
                           "value": means[m], "n": max(int(s.notna().sum()) for s in vals[m].values()),
                           "best_popularity": m == best_pop, "best": m == best_all}
                    rm = run_means[m]
                    if len(rm) > 1:
                        row.update({"std": float(np.std(rm, ddof=1)), "min": min(rm), "max": max(rm),
                                    "runs": len(rm)})
                    if best_pop and m not in POPULARITY and m != "RANDOM":
                        base = list(vals[best_pop].values())
                        base = base[0] if len(base) == 1 else pd.concat(base, axis=1).mean(axis=1)
                        c = compare(*_pooled(vals[m], base))
                        row.update({"baseline": best_pop, "gain": means[m] - means[best_pop],
                                    "p": c["p"], "stars": c["stars"], "cohens_d": c["cohens_d"],
                                    "cliffs_delta": c["cliffs_delta"], "pairs": c["n"]})
                    rows.append(row)
    df = pd.DataFrame(rows)
    if "std" in df:  # the spread next to the value
        spread = ["std", "min", "max", "runs"]
        rest = [c for c in df.columns if c not in spread]
        at = rest.index("value") + 1
        df = df[rest[:at] + spread + rest[at:]]
    return df


def _runs(row: pd.Series) -> int:
    """How many runs a table1 row averages (1 for a one-run method)."""
    n = row.get("runs")
    return 1 if n is None or (isinstance(n, float) and math.isnan(n)) else int(n)


def _fmt(v: float) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.5f}"


def format_table1(df: pd.DataFrame, k: int = 10, levels: Sequence[str] = ("global", "item")) -> str:
    """Markdown in the layout of seed 002 Table 1."""
    cols = [(lv, m) for lv in levels for m in METRICS]
    head = "| Method | " + " | ".join(f"{lv} {SHORT[m]}@{k}" for lv, m in cols) + " |"
    lines = [head, "|---|" + "---|" * len(cols)]
    for dataset in df["dataset"].unique():
        part = df[df["dataset"] == dataset]
        lines.append(f"| **{dataset}** |" + " |" * len(cols))
        for method in _ordered(list(part["method"].unique())):
            cells, gains, any_gain = [], [], False
            for lv, m in cols:
                r = part[(part["method"] == method) & (part["level"] == lv) & (part["metric"] == f"{m}@{k}")]
                if r.empty:
                    cells.append("–")
                    gains.append("–")
                    continue
                r = r.iloc[0]
                stars = r.get("stars")
                text = _fmt(r["value"]) + (stars if isinstance(stars, str) else "")
                if r["best"]:
                    text = f"**{text}**"
                elif r["best_popularity"]:
                    text = f"<u>{text}</u>"
                if _runs(r) > 1:
                    text += f" ± {_fmt(r['std'])}"
                cells.append(text)
                gain = r.get("gain")
                if gain is not None and not (isinstance(gain, float) and math.isnan(gain)):
                    any_gain = True
                    gains.append(f"{gain:+.5f}")
                else:
                    gains.append("–")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
            if any_gain:
                lines.append("| Gain | " + " | ".join(gains) + " |")
    lines.append("")
    lines.append("Gain: difference to the best popularity baseline per level and metric; stars: paired "
                 "t-test against it (* p<0.05, ** p<0.01, *** p<0.001). Bold: best; underlined: best "
                 "popularity baseline.")
    if "runs" in df and (df["runs"] > 1).any():
        n = sorted({int(v) for v in df["runs"].dropna()})
        lines.append(f"Mean ± sample standard deviation over {'/'.join(map(str, n))} runs (seeds) of each run's "
                     "average; their t-test pools every run's per-interaction values, each paired with the "
                     "baseline's value on the same interaction.")
    return "\n".join(lines) + "\n"


def plot_sensitivity(rows: list[dict], param: str, method: str,
                     out_stem: str | Path | Location) -> list[Path | Location]:
    """Figure 3-style plot (NDCG/P/R@10 against one setting, one panel per level) + CSV.
    Rows with `<col>_min` / `<col>_max` (means over runs, `mean_over_runs`) get error
    bars from the runs' minimum to maximum. Both are written through the storage module
    (`out_stem` may be a URI); the files come back as local Paths when they are local."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = location(out_stem)
    png, csv = (stem.parent / PurePosixPath(stem.name).with_suffix(ext).name for ext in (".png", ".csv"))
    df = pd.DataFrame(rows)
    csv.write_text(df.to_csv(index=False))
    levels = [lv for lv in ("global", "item", "user") if any(f"{lv}_{m}" in df for m in METRICS)]
    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.2), squeeze=False)
    for ax, lv in zip(axes[0], levels):
        for m, style in (("ndcg", "o-"), ("precision", "s--"), ("recall", "^:")):
            col = f"{lv}_{m}"
            if col in df and f"{col}_min" in df:
                spread = [df[col] - df[f"{col}_min"], df[f"{col}_max"] - df[col]]
                ax.errorbar(df[param], df[col], yerr=spread, fmt=style, capsize=3, label=f"{SHORT[m]}@10")
            elif col in df:
                ax.plot(df[param], df[col], style, label=f"{SHORT[m]}@10")
        runs = f", mean of {int(df['runs'].max())} runs, bars min-max" if "runs" in df else ""
        ax.set_title(f"{method}: {lv} level{runs}")
        ax.set_xlabel(param)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    png.write_bytes(image.getvalue())
    return [f.local_path() if f.is_local else f for f in (png, csv)]


def mean_over_runs(rows: list[dict], by: list[str]) -> list[dict]:
    """Rows of several runs (a `run` key) -> one row per value of `by`: each other
    column's mean over the runs, its spread (`<col>_std`: sample standard deviation,
    `<col>_min`, `<col>_max`) and `runs`, how many were averaged."""
    df = pd.DataFrame(rows)
    cols = [c for c in df.columns if c not in by and c != "run"]
    groups = df.groupby(by, sort=True)
    out = groups[cols].mean()
    for stat in ("std", "min", "max"):
        out = out.join(groups[cols].agg(stat).add_suffix(f"_{stat}"))
    out["runs"] = groups["run"].nunique()
    return out.reset_index().to_dict("records")


def effect_details(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with a comparison (learned models against the best baseline)."""
    cols = ["dataset", "method", "level", "metric", "value", "std", "min", "max", "runs", "baseline", "gain",
            "p", "stars", "cohens_d", "cliffs_delta", "pairs"]
    have = [c for c in cols if c in df]
    out = df[have]
    return out[out["baseline"].notna()] if "baseline" in out else out.iloc[0:0]
