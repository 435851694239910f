"""The win-rate study of seed 004 (section 5.2-5.3, Figure 5 and Table 4), from the
folders `rexeval judge pairwise` wrote.

Each folder holds the verdicts of every system against one baseline: the LLM judge's
(`verdicts.parquet`, ALERT-Gen, labelled with the judge model named in the folder's
report.json) and/or the reward model's (`verdicts_disc.parquet`, ALERT-Disc). A
verdict "A" means the system's explanation won, so the baseline lost; "B" that the
baseline won; "C" a tie; a missing verdict is unreadable and left out of the shares.

The folders are read into one long table, one row per (judge, system, example,
criterion): the criterion "overall" is the pair's final verdict, and every
`verdict_<criterion>` column adds that criterion's verdict (score columns and the
single-call "all" unit, which repeats the overall verdict, are not read). Several
folders may be given, e.g. one per batch of systems; they must share one baseline, and
no (judge, system, example) may appear twice.

Per (judge, criterion, system): wins, ties and losses with a percentile bootstrap
interval for each share (`metrics.preference.win_tie_loss`). Written to the output
folder:

- winrate.csv: every (judge, criterion, system) with counts, shares and intervals;
- winrate.md, figure5.png, figure5.svg: Figure 5, the overall outcome per judge and
  system ("<baseline> loses" = the system wins, "<baseline> wins", "tie"), as a table
  and as stacked horizontal bars, one panel per judge;
- table4.md, table4.csv: Table 4, per judge the win rate of each system (rows) on each
  criterion (columns) with its interval, e.g. "0.166 [0.10, 0.24]";
- report.json: the inputs, the settings and the counts;
- with `repeats` (further pairwise folders that judged the same pairs again, seed 004
  appendix B.2): table6.md and table6.csv, Table 6, how each judge agrees with itself
  over `runs` and the repeats (`metrics.agreement.run_agreement`: Cohen's kappa
  averaged over the pairs of runs, Krippendorff's alpha with every run a coder) on the
  overall verdicts. The win rates are those of `runs` alone.

The folders and the output may be local paths or URIs (`rexeval/storage.py`).
"""
from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from rexeval.metrics.preference import win_tie_loss
from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.io import config_hash, write_json_atomic
from rexeval.pipelines.core.outputs import REPORT_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import ReadPaths
from rexeval.storage import Location, PathLike, is_uri, location
from rexeval.pipelines.judge.evaluators import evaluator, evaluator_names

# What it writes (pipelines/core/outputs.py; see the module docstring).
WINRATE_OUTPUTS = Outputs(
    numbers=Output("winrate.csv", "every share with its interval, per judge, system and criterion"),
    table4_csv=Output("table4.csv", "Table 4 as CSV"),
    table4=Output("table4.md", "seed 004's Table 4: win rate per criterion"),
    figure5_md=Output("winrate.md", "Figure 5 as a table"),
    figure5=Output("figure5.png", "seed 004's Figure 5"),
    figure5_svg=Output("figure5.svg", "Figure 5 as SVG"),
    report=Output(REPORT_OUTPUT, "the inputs, the settings and the counts"),
    table6=Output("table6.md", "seed 004's Table 6: the judge's agreement with itself over runs (with repeats)"),
    table6_csv=Output("table6.csv", "Table 6 as CSV, with the kappa of each pair of runs"),
)
OVERALL = "overall"
REQUIRED = ("system", "baseline", "example_id", "verdict")
LONG_COLUMNS = ("judge", "source", "system", "baseline", "example_id", "user_id", "item_id", "criterion",
                "verdict")
# Figure 5's segments, left to right: (outcome share column, legend text after the baseline's name)
SEGMENTS = (("win", "loses"), ("loss", "wins"), ("tie", None))
COLORS = ("#4c72b0", "#dd8452", "#b0b0b0")


class WinrateConfig(BaseModel):
    """Settings of `rexeval judge winrate`."""

    model_config = ConfigDict(extra="forbid")

    runs: ReadPaths = Field(min_length=1, description="`rexeval judge pairwise` output folders")
    out: str = Field(description="output folder")
    confidence: float = Field(0.95, gt=0, lt=1, description="level of the bootstrap intervals")
    resamples: int = Field(2000, ge=0, description="bootstrap resamples (0: no intervals)")
    seed: int = Field(0, description="seed of the bootstrap")
    baseline_label: str | None = Field(None, description="the baseline's name in the figure and tables "
                                       "(default: its system name)")
    repeats: ReadPaths = Field(default_factory=list, description="pairwise folders that judged the pairs of "
                               "`runs` again, one run each: Table 6 (the judge's agreement with itself)")


# ------------------------------------------------------------------ reading


def _none_of(names: list[str]) -> str:
    """"neither verdicts.parquet nor verdicts_disc.parquet": the verdict files of every evaluator."""
    files = [evaluator(n).verdicts_file for n in names]
    if len(files) == 2:
        return f"neither {files[0]} nor {files[1]}"
    return "none of " + ", ".join(files)


def criterion_columns(columns: Sequence[str]) -> list[str]:
    """The per-criterion verdict columns of a verdicts table, in their order."""
    return [c for c in columns if c.startswith("verdict_") and c != "verdict_all"]


def long_verdicts(verdicts: pd.DataFrame, judge: str, source: str = "") -> pd.DataFrame:
    """One judge's verdicts table (one row per pair) as LONG_COLUMNS rows: the overall
    verdict and one row per criterion column."""
    missing = [c for c in REQUIRED if c not in verdicts.columns]
    if missing:
        raise ValueError(f"{source or 'verdicts'}: lacks column(s) {missing} (it has {list(verdicts.columns)})")
    base = pd.DataFrame({"judge": judge, "source": source,
                         **{c: verdicts[c].astype(str) for c in ("system", "baseline", "example_id")}})
    for c in ("user_id", "item_id"):
        base[c] = verdicts[c].astype(str) if c in verdicts.columns else None
    parts = []
    for crit, col in [(OVERALL, "verdict")] + [(c[len("verdict_"):], c) for c in criterion_columns(verdicts.columns)]:
        part = base.copy()
        part["criterion"] = crit
        part["verdict"] = [None if pd.isna(v) else str(v) for v in verdicts[col]]
        parts.append(part)
    return pd.concat(parts, ignore_index=True)[list(LONG_COLUMNS)]


def _read_report(folder: PathLike) -> dict:
    path = location(folder) / "report.json"
    if not path.exists():
        return {}
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{_shown(folder, 'report.json')}: not valid JSON ({exc})") from None
    return report if isinstance(report, dict) else {}


def _shown(run: PathLike, name: str | None = None) -> str:
    """A folder (or a file in it) as the user named it, for messages and report.json."""
    text = given_text(run).rstrip("/") or "/"
    if name is None:
        return text
    return f"{text}/{name}" if is_uri(text) else str(Path(text) / name)


def read_runs(runs: Sequence[PathLike]) -> tuple[pd.DataFrame, list[dict]]:
    """The long verdicts of every folder, and what was read from each.

    Errors name the folder: one without either verdicts file, verdicts of different
    baselines, and a (judge, system, example) that two files both judged."""
    parts, inputs = [], []
    for run in runs:
        folder = location(run)
        if not folder.is_dir():
            raise FileNotFoundError(f"{_shown(run)}: no such folder (expected a `rexeval judge pairwise` output "
                                    "folder)")
        report = _read_report(folder)
        files = {}
        for ev in map(evaluator, evaluator_names()):
            name = ev.verdicts_file
            path = folder / name
            if not path.exists():
                continue
            verdicts = pd.read_parquet(path.path, filesystem=path.fs)
            label = ev.label(report)
            parts.append(long_verdicts(verdicts, label, _shown(run, name)))
            files[name] = {"judge": label, "pairs": len(verdicts)}
        if not files:
            raise ValueError(f"{_shown(run)}: holds {_none_of(evaluator_names())} (expected the output folder "
                             f"of `rexeval judge pairwise --out`)")
        inputs.append({"folder": _shown(run), "files": files})
    long = pd.concat(parts, ignore_index=True)
    baselines = long.drop_duplicates("baseline")
    if len(baselines) > 1:
        seen = "; ".join(f"{r.baseline!r} in {r.source}" for r in baselines.itertuples(index=False))
        raise ValueError(f"the verdicts compare against different baselines: {seen} (one baseline per study)")
    overall = long[long["criterion"] == OVERALL]
    dup = overall.duplicated(["judge", "system", "example_id"], keep=False)
    if dup.any():
        first = overall[dup].iloc[0]
        where = overall[dup & (overall["system"] == first["system"]) & (overall["example_id"] == first["example_id"])
                        & (overall["judge"] == first["judge"])]["source"].tolist()
        raise ValueError(f"judge {first['judge']!r}, system {first['system']!r}, example {first['example_id']!r} "
                         f"is judged more than once ({', '.join(where)}): give each pair once")
    return long, inputs


# ------------------------------------------------------------------ tables


def winrate_table(long: pd.DataFrame, confidence: float = 0.95, n_resamples: int = 2000,
                  seed: int = 0) -> pd.DataFrame:
    """`win_tie_loss` per (judge, criterion, system) of a long verdicts table, with the
    baseline; judges and criteria in their order of appearance, systems sorted."""
    stats = win_tie_loss(long, by=("judge", "criterion", "system"), confidence=confidence,
                         n_resamples=n_resamples, seed=seed)
    stats.insert(3, "baseline", long["baseline"].iloc[0] if len(long) else None)
    judges, criteria = _order(long["judge"]), _order(long["criterion"])
    stats["_j"] = stats["judge"].map(judges.index)
    stats["_c"] = stats["criterion"].map(criteria.index)
    return stats.sort_values(["_j", "_c", "system"]).drop(columns=["_j", "_c"]).reset_index(drop=True)


def _order(values) -> list:
    return list(dict.fromkeys(values))


def system_order(stats: pd.DataFrame) -> list[str]:
    """Systems from the lowest overall win rate (averaged over judges) to the highest,
    the order of seed 004's Figure 5; ties by name."""
    overall = stats[stats["criterion"] == OVERALL]
    mean = overall.groupby("system")["win_rate"].mean()
    return sorted(_order(stats["system"]), key=lambda s: (_nan_last(mean.get(s)), s))


def _nan_last(v) -> float:
    return math.inf if v is None or pd.isna(v) else float(v)


def criterion_title(name: str) -> str:
    """clear_language -> Clear language."""
    text = name.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def _rate(p, low, high, pct: bool) -> str:
    if pd.isna(p):
        return "–"
    if pct:
        head = f"{p:.1%}"
        return head if pd.isna(low) else f"{head} [{low:.1%}, {high:.1%}]"
    head = f"{p:.3f}"
    return head if pd.isna(low) else f"{head} [{low:.2f}, {high:.2f}]"


def table4(stats: pd.DataFrame) -> pd.DataFrame:
    """Table 4: per judge, one row per system, one column per criterion (then Overall);
    cells are the system's win rate against the baseline with its interval."""
    criteria = [c for c in _order(stats["criterion"]) if c != OVERALL] + [OVERALL]
    systems = system_order(stats)
    cells = {(r.judge, r.system, r.criterion): _rate(r.win_rate, r.win_low, r.win_high, pct=False)
             for r in stats.itertuples(index=False)}
    rows = []
    for judge in _order(stats["judge"]):
        for system in systems:
            if not any((judge, system, c) in cells for c in criteria):
                continue
            rows.append({"judge": judge, "system": system,
                         **{criterion_title(c): cells.get((judge, system, c), "–") for c in criteria}})
    return pd.DataFrame(rows, columns=["judge", "system"] + [criterion_title(c) for c in criteria])


def table4_markdown(table: pd.DataFrame, baseline: str, confidence: float) -> str:
    lines = []
    criteria = [c for c in table.columns if c not in ("judge", "system")]
    for judge, part in table.groupby("judge", sort=False):
        lines += [f"Win rate against `{baseline}` per criterion, judge {judge} "
                  f"({confidence:.0%} bootstrap interval):", "",
                  "| system | " + " | ".join(criteria) + " |", "|---|" + "---|" * len(criteria)]
        for _, r in part.iterrows():
            lines.append(f"| {r['system']} | " + " | ".join(str(r[c]) for c in criteria) + " |")
        lines.append("")
    return "\n".join(lines)


def figure5_markdown(stats: pd.DataFrame, baseline_label: str, confidence: float) -> str:
    """Figure 5 as a table: per judge and system, the overall shares of pairs the
    baseline lost, won and tied, with their intervals."""
    overall = stats[stats["criterion"] == OVERALL].set_index(["judge", "system"])
    lines = []
    for judge in _order(stats["judge"]):
        lines += [f"Win rate of {judge} against `{baseline_label}` ({confidence:.0%} bootstrap interval):", "",
                  f"| system | n | {baseline_label} loses | {baseline_label} wins | tie | unreadable |",
                  "|---|---|---|---|---|---|"]
        for system in system_order(stats):
            if (judge, system) not in overall.index:
                continue
            r = overall.loc[(judge, system)]
            lines.append(f"| {system} | {int(r['n'])} | {_rate(r['win_rate'], r['win_low'], r['win_high'], True)} | "
                         f"{_rate(r['loss_rate'], r['loss_low'], r['loss_high'], True)} | "
                         f"{_rate(r['tie_rate'], r['tie_low'], r['tie_high'], True)} | {int(r['unreadable'])} |")
        lines.append("")
    return "\n".join(lines)


def self_agreement(runs: Sequence[pd.DataFrame], baseline: str) -> pd.DataFrame:
    """Table 6: per judge that every run holds, its overall verdicts on every (system,
    example) any run judged, aligned across the runs (a pair one run lacks is a missing
    verdict there), and `run_agreement` of them. Runs must share the baseline."""
    key = ["judge", "system", "example_id"]
    overall = []
    for k, run in enumerate(runs):
        other = run["baseline"].drop_duplicates().tolist()
        if other and other != [baseline]:
            raise ValueError(f"repeat {k}: its verdicts compare against {other}, the runs against {baseline!r}")
        overall.append(run[run["criterion"] == OVERALL].set_index(key)["verdict"])
    judges = [j for j in _order(runs[0]["judge"]) if all(j in o.index.get_level_values(0) for o in overall)]
    # Here, not at the top: the study plan and every command's --help import this
    # module, and agreement brings scipy.stats and scikit-learn (about 1.3 s).
    from rexeval.metrics.agreement import run_agreement

    rows = []
    for judge in judges:
        mine = [o[o.index.get_level_values(0) == judge] for o in overall]
        items = sorted(set().union(*(m.index for m in mine)))
        labels = [[None if pd.isna(v) else v for v in m.reindex(items)] for m in mine]
        agree = run_agreement(labels)
        rows.append({"judge": judge, "runs": agree.n_runs, "pairs": agree.n_items, "complete": agree.n_complete,
                     "kappa": agree.kappa, "alpha": agree.alpha,
                     **{f"kappa_{a + 1}_{b + 1}": agree.kappas[i] for i, (a, b) in enumerate(
                         (a, b) for a in range(agree.n_runs) for b in range(a + 1, agree.n_runs))}})
    return pd.DataFrame(rows)


def table6_markdown(table: pd.DataFrame) -> str:
    lines = ["The judge's agreement with itself over repeated runs of the same pairs (overall verdicts; Cohen's "
             "kappa averaged over the pairs of runs, Krippendorff's alpha with every run a coder):", "",
             "| judge | runs | pairs | C-κ | K-α |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r.judge} | {r.runs} | {r.pairs} | {r.kappa:.3f} | {r.alpha:.3f} |"
              for r in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ figure


def plot_figure5(stats: pd.DataFrame, baseline_label: str, out_stem: PathLike) -> list[Location]:
    """Figure 5: one panel per judge, one stacked horizontal bar per system (overall
    verdicts) with the segments "<baseline> loses", "<baseline> wins" and "tie",
    each labelled with its percentage. Writes <stem>.png and <stem>.svg (text kept as
    text in the SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    out_stem = location(out_stem)
    overall = stats[stats["criterion"] == OVERALL].set_index(["judge", "system"])
    judges, systems = _order(stats["judge"]), system_order(stats)
    legend = [f"{baseline_label} {verb}" if verb else "tie" for _, verb in SEGMENTS]
    paths = [out_stem.parent / f"{out_stem.stem}{suffix}" for suffix in (".png", ".svg")]
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        height = sum(0.42 * len(systems) + 1.3 for _ in judges)
        fig, axes = plt.subplots(len(judges), 1, figsize=(7.5, max(2.5, height)), squeeze=False)
        for ax, judge in zip(axes[:, 0], judges):
            shown = [s for s in systems if (judge, s) in overall.index]
            left = [0.0] * len(shown)
            for (share, _), color, label in zip(SEGMENTS, COLORS, legend):
                widths = [_zero(overall.loc[(judge, s), f"{share}_rate"]) for s in shown]
                ax.barh(range(len(shown)), widths, left=left, color=color, label=label, height=0.7,
                        edgecolor="white", linewidth=0.5)
                for y, (x0, w) in enumerate(zip(left, widths)):
                    if w >= 0.04:
                        ax.text(x0 + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=8,
                                color="white" if color != COLORS[2] else "black")
                left = [a + b for a, b in zip(left, widths)]
            for y, s in enumerate(shown):
                if int(overall.loc[(judge, s), "n"]) == 0:
                    ax.text(0.01, y, "no readable verdict", va="center", fontsize=8)
            ax.set_yticks(range(len(shown)), shown)
            ax.invert_yaxis()
            ax.set_xlim(0, 1)
            ax.xaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_title(f"Win rate of {judge}", pad=24, fontsize=10)
            ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False, fontsize=8)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        axes[-1, 0].set_xlabel("share of readable pairs")
        fig.tight_layout()
        for p in paths:  # rendered here, then put whole where they belong
            buf = io.BytesIO()
            fig.savefig(buf, format=p.suffix[1:], dpi=150)
            p.write_bytes(buf.getvalue())
        plt.close(fig)
    return paths


def _zero(v) -> float:
    return 0.0 if pd.isna(v) else float(v)


# ------------------------------------------------------------------ the job


def run_winrate(cfg: WinrateConfig, progress: Callable[[str], None] = print) -> dict:
    """Read the pairwise folders, compute the win / tie / loss shares with intervals
    and write the tables, the figure and report.json into `cfg.out` (see the module
    docstring). Returns the report, with `table_md` (the Figure 5 table) added."""
    t0 = time.time()
    long, inputs = read_runs(cfg.runs)
    if long.empty:
        raise ValueError(f"{', '.join(map(str, cfg.runs))}: the verdicts hold no pair (no example had both a "
                         "system's and the baseline's explanation); there is no win rate to report")
    baseline = str(long["baseline"].iloc[0])
    label = cfg.baseline_label or baseline
    judges = _order(long["judge"])
    progress(f"judge winrate: {len(inputs)} folder(s), judge(s) {', '.join(judges)}, baseline {baseline!r}")
    stats = winrate_table(long, cfg.confidence, cfg.resamples, cfg.seed)
    root = location(cfg.out)
    root.mkdir()
    (root / WINRATE_OUTPUTS.numbers).write_text(stats.to_csv(index=False))
    t4 = table4(stats)
    (root / WINRATE_OUTPUTS.table4_csv).write_text(t4.to_csv(index=False))
    (root / WINRATE_OUTPUTS.table4).write_text(table4_markdown(t4, label, cfg.confidence))
    md = figure5_markdown(stats, label, cfg.confidence)
    (root / WINRATE_OUTPUTS.figure5_md).write_text(md)
    plot_figure5(stats, label, root / WINRATE_OUTPUTS.figure5)
    overall = long[long["criterion"] == OVERALL]
    counts = {"folders": len(inputs), "judges": len(judges), "systems": int(overall["system"].nunique()),
              "criteria": int(long["criterion"].nunique()) - 1, "verdicts": len(overall),
              "unreadable": int(overall["verdict"].isna().sum())}
    report = {"job": "judge winrate", "config_hash": config_hash(cfg.model_dump(exclude={"out"})),
              "baseline": baseline, "baseline_label": label, "judges": judges,
              "systems": system_order(stats), "criteria": _order(long["criterion"]), "counts": counts,
              "inputs": inputs,
              "settings": {"confidence": cfg.confidence, "resamples": cfg.resamples, "seed": cfg.seed,
                           "interval": "percentile bootstrap over pairs"},
              "overall": stats[stats["criterion"] == OVERALL].to_dict("records"),
              "elapsed_s": round(time.time() - t0, 2)}
    if cfg.repeats:
        t6 = self_agreement([long] + [read_runs([r])[0] for r in cfg.repeats], baseline)
        (root / WINRATE_OUTPUTS.table6_csv).write_text(t6.to_csv(index=False))
        (root / WINRATE_OUTPUTS.table6).write_text(table6_markdown(t6))
        report["table6"] = t6.to_dict("records")
        report["inputs_repeats"] = [_shown(r) for r in cfg.repeats]
    write_json_atomic(root / WINRATE_OUTPUTS.report, report)
    report["table_md"] = md
    return report
