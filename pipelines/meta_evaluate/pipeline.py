"""`rexeval meta-evaluate`: how well evaluators agree with human ratings, from files.

This module holds the settings and the run; reading, pivoting, joining and pairing
columns are in `meta_evaluate.inputs` (its docstring states the layouts and the key
rule), the Markdown tables in `meta_evaluate.report`.

The evaluator table is wide (`judge_<aspect>` columns), long as `rexeval judge likert`
writes it (judge, aspect, score: one evaluator per judge), or a `rexeval judge
pairwise` verdicts file. The human ratings sit in the same table or in `--human`,
joined on the keys. Missing ratings follow seed 001's null policy (counted in the
report); missing verdicts are left out and counted; every row or value that cannot be
used is an error row. The work is small tabular arithmetic, so no Ray is used.
`--ensemble-sweep` adds seed 001's Figure 4 (`meta_evaluate.ensemble`).

A value that is undefined (NaN) carries its reason (constant human ratings, constant
evaluator scores, too few rows, no group with a defined value) in the results' `note`
column, under the printed table, and as a warning printed and kept in the report's
"warnings", so an empty cell is never left to guesswork.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.metrics.agreement import (
    RESULT_COLUMNS,
    TIE,
    Target,
    apply_null_policy,
    meta_evaluate,
    pairwise_agreement,
)
from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.io import config_hash, is_atomic_leftover, write_json_atomic, write_parquet_atomic
from rexeval.storage import Location, location
from rexeval.pipelines.meta_evaluate.inputs import (
    InputTable,
    STAGE,
    join_tables,
    layout_of,
    long_targets,
    parse_column,
    pivot_long,
    read_input,
    read_number,
    read_verdict,
    resolve_keys,
    resolve_targets,
    verdict_targets,
    with_columns_found,
)
from rexeval.pipelines.meta_evaluate.config import META_EVALUATE_OUTPUTS, MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.ensemble import SWEEP_OUTPUTS, ensemble_groups, run_ensemble_sweep
from rexeval.pipelines.meta_evaluate.report import correlation_markdown, pairwise_markdown
from rexeval.pipelines.core.schema import SchemaError, error_rows

RESULTS_FILE, TABLE_FILE, REPORT_FILE, ERRORS_FILE = (
    META_EVALUATE_OUTPUTS.results, META_EVALUATE_OUTPUTS.table, META_EVALUATE_OUTPUTS.report,
    META_EVALUATE_OUTPUTS.errors)


CORRELATION_RESULTS = pa.schema([
    pa.field("evaluator", pa.string()), pa.field("aspect", pa.string()), pa.field("level", pa.string()),
    pa.field("method", pa.string()), pa.field("value", pa.float64()), pa.field("n_rows", pa.int64()),
    pa.field("n_groups_used", pa.int64()), pa.field("n_groups_total", pa.int64()),
    pa.field("ci_low", pa.float64()), pa.field("ci_high", pa.float64()),
    pa.field("note", pa.string()),  # why the value is undefined, when it is
])
PAIRWISE_RESULTS = pa.schema([
    pa.field("evaluator", pa.string()), pa.field("aspect", pa.string()), pa.field("ties", pa.bool_()),
    pa.field("metric", pa.string()), pa.field("value", pa.float64()), pa.field("n_used", pa.int64()),
    pa.field("n_total", pa.int64()), pa.field("n_missing", pa.int64()), pa.field("n_tie_dropped", pa.int64()),
    pa.field("ci_low", pa.float64()), pa.field("ci_high", pa.float64()),
    pa.field("note", pa.string()),  # why the value is undefined, when it is
])


# ------------------------------------------------------------------ the job


def _policy(value: float | str) -> float | None:
    return None if value == "drop" else float(value)


def _own_leftover(path: Location) -> bool:
    """A file this job writes before its report (or a temporary file of one): a run
    killed before `report.json` left it, and the re-run rewrites it."""
    own = (RESULTS_FILE, TABLE_FILE, ERRORS_FILE, *SWEEP_OUTPUTS)
    return path.is_file() and (path.name in own or is_atomic_leftover(path))


def _prepare_out(cfg: MetaEvaluateConfig, digest: str, overwrite: bool) -> Location:
    """Refuse to mix two configs' results in one folder (local or a URI) unless asked to
    overwrite. A folder holding only this job's own files and no report is a killed
    run's: taken over."""
    root, shown = location(cfg.out), given_text(cfg.out)
    report = root / REPORT_FILE
    if report.exists():
        old = report.read_json().get("config_hash")
        if old != digest and not overwrite:
            raise FileExistsError(f"{shown} holds meta-evaluation results of another config "
                                  f"(hash {old} != {digest}); use another folder or --overwrite")
    elif root.exists() and not overwrite and not all(_own_leftover(f) for f in root.iterdir()):
        raise FileExistsError(f"{shown} is not empty and holds no meta-evaluation report; "
                              "use another folder or --overwrite")
    root.mkdir()
    for f in root.iterdir():
        if is_atomic_leftover(f):
            f.unlink()
    return root


def _random_targets(targets: list[Target]) -> list[Target]:
    first = {}
    for t in targets:
        first.setdefault(t.aspect, t)
    return [Target("random", a, f"<random {a}>", t.human_col) for a, t in first.items()]


def _read(cfg: MetaEvaluateConfig, progress: Callable[[str], None]) -> dict:
    """Both tables read (a long table pivoted), the keys and the targets."""
    scores = read_input(cfg.scores, cfg.columns)
    human = read_input(cfg.human, cfg.columns) if cfg.human else None
    progress(f"read {len(scores.df):,} rows from {scores.source}"
             + (f" and {len(human.df):,} from {human.source}" if human else ""))
    try:
        return _layout(cfg, scores, human, progress)
    except SchemaError as exc:  # a missing column: the format read and the columns found said too
        raise with_columns_found(exc, [scores, human]) from None


def _layout(cfg: MetaEvaluateConfig, scores: InputTable, human: InputTable | None,
            progress: Callable[[str], None]) -> dict:
    layout, errors, counts = layout_of(cfg, scores), [], {}
    if layout == "long":
        long_rows = len(scores.df)
        scores, errors = pivot_long(cfg, scores)
        cells = sum(len(r) for r in scores.rows)
        counts = {"long_rows": long_rows,
                  "absent_scores": len(scores.df) * len(scores.columns) - len(scores.cells)}
        progress(f"long layout: {cells:,} scores of {len(scores.columns)} (judge, aspect) pair(s) "
                 f"over {len(scores.df):,} explanations")
    hum = human or scores
    keys, also = resolve_keys(cfg, [scores] + ([human] if human else []))
    ids = keys + also
    if layout == "long":
        targets = long_targets(cfg, scores, list(hum.df.columns), hum.source)
    elif layout == "verdicts":
        targets = verdict_targets(cfg, list(scores.df.columns), list(hum.df.columns), scores.source, hum.source)
    else:
        targets = resolve_targets(cfg, list(scores.df.columns), list(hum.df.columns), ids, scores.source,
                                  hum.source)
    return {"scores": scores, "human": human, "hum": hum, "layout": layout, "keys": keys, "also": also,
            "targets": targets, "errors": errors, "counts": counts}


def run_meta_evaluate(cfg: MetaEvaluateConfig, overwrite: bool = False,
                      progress: Callable[[str], None] = lambda s: None) -> dict:
    """Read, join, pair, score and write the outputs; returns the report."""
    settings = cfg.recorded_settings()
    digest = config_hash(settings)
    inp = _read(cfg, progress)
    scores, human, hum, keys, targets = inp["scores"], inp["human"], inp["hum"], inp["keys"], inp["targets"]
    ensemble = ensemble_groups(targets) if cfg.ensemble_sweep else None  # refuse before writing anything
    joined, errors, counts = join_tables(scores, human, keys, inp["also"])  # refuses two tables that never meet
    root = _prepare_out(cfg, digest, overwrite)
    errors[:0] = inp["errors"]
    counts = inp["counts"] | counts
    progress(f"{counts['joined']:,} rows joined on {', '.join(keys)}; {len(targets)} column pair(s)")
    keys_text = ["/".join(r) for r in joined[keys].itertuples(index=False, name=None)]
    reader = read_number if cfg.mode == "scores" else read_verdict
    parsed: dict[tuple[str, str], tuple[list, np.ndarray]] = {}

    def column(side: str, name: str) -> tuple[list, np.ndarray]:
        if (side, name) not in parsed:
            table, pos = (scores, joined["pos_judge"]) if side == "judge" else (hum, joined["pos_human"])
            values, bad, errs = parse_column(table, pos.to_numpy(), name, keys_text, reader)
            errors.extend(errs)
            parsed[(side, name)] = values, bad
        return parsed[(side, name)]

    if cfg.mode == "scores":
        results, per_target = _score_targets(cfg, joined, targets, column)
    else:
        results, per_target = _pairwise_targets(cfg, targets, column)
    sweep = None
    if ensemble is not None:
        sweep = run_ensemble_sweep(cfg, joined, *ensemble, column, root, _policy(cfg.human_null),
                                   _policy(cfg.judge_null), progress)
    else:
        for name in SWEEP_OUTPUTS:  # a previous run's sweep is not this run's
            (root / name).unlink(missing_ok=True)
    warnings = unmatched_warnings(counts, scores.source, human.source if human else None)
    warnings += undefined_warnings(results)
    for w in warnings:
        progress(f"  warning: {w}")
    err = error_rows(STAGE, errors)
    counts |= {"targets": len(per_target), "errors": err.num_rows,
               "bad_values": sum(e["error_type"] == "bad_value" for e in errors),
               "missing_key": sum(e["error_type"] == "missing_key" for e in errors),
               "duplicate_key": sum(e["error_type"] == "duplicate_key" for e in errors),
               "users": int(joined[cfg.user_col].nunique()),
               "pairs": len(joined[[cfg.user_col, cfg.item_col]].drop_duplicates())}
    # Summed over the (evaluator, aspect) pairs, the random baseline left out; each
    # pair's own numbers are in the report's "targets".
    real = [t for t in per_target if t["evaluator"] != "random" or not cfg.random_baseline]
    for name in ("human_filled", "judge_filled", "dropped_null", "missing_labels", "tie_dropped"):
        if any(name in t for t in real):
            counts[name] = int(sum(t.get(name, 0) for t in real))
    if sweep is not None:
        counts["ensemble_subsets"] = sweep["subsets"]
    schema = CORRELATION_RESULTS if cfg.mode == "scores" else PAIRWISE_RESULTS
    write_parquet_atomic(root / RESULTS_FILE, pa.Table.from_pandas(results, schema=schema, preserve_index=False))
    markdown = (correlation_markdown(results, cfg.shown_method, cfg.levels) if cfg.mode == "scores"
                else pairwise_markdown(results))
    (root / TABLE_FILE).write_text(markdown, encoding="utf-8")
    outputs = [RESULTS_FILE, TABLE_FILE, REPORT_FILE] + (sweep["outputs"] if sweep else [])
    if err.num_rows:
        write_parquet_atomic(root / ERRORS_FILE, err)
        outputs.append(ERRORS_FILE)
    else:
        (root / ERRORS_FILE).unlink(missing_ok=True)  # a previous run's errors are not this run's
    report = {"job": STAGE, "mode": cfg.mode, "layout": inp["layout"], "config": settings, "config_hash": digest,
              "keys": keys,
              "counts": counts, "targets": per_target, "warnings": warnings, "outputs": outputs}
    extra = {}
    if sweep is not None:
        report["ensemble_sweep"] = {k: v for k, v in sweep.items() if k not in ("outputs", "markdown")}
        extra = {"ensemble_markdown": sweep["markdown"]}
    write_json_atomic(root / REPORT_FILE, report)
    return report | {"markdown": markdown} | extra


def _score_targets(cfg: MetaEvaluateConfig, joined: pd.DataFrame, targets: list[Target],
                   column: Callable) -> tuple[pd.DataFrame, list[dict]]:
    """Correlations of every target, after the null policy; one report entry each."""
    plan = [(t, column("judge", t.judge_col)) for t in targets]
    if cfg.random_baseline:
        for i, t in enumerate(_random_targets(targets)):
            rng = np.random.default_rng([cfg.seed, i])
            plan.append((t, (list(rng.integers(1, 6, len(joined)).astype(float)), np.zeros(len(joined), bool))))
    frames, report = [], []
    for t, (j_values, j_bad) in plan:
        h_values, h_bad = column("human", t.human_col)
        ok = ~(j_bad | h_bad)
        res = apply_null_policy(np.asarray(h_values, np.float64)[ok], np.asarray(j_values, np.float64)[ok],
                                _policy(cfg.human_null), _policy(cfg.judge_null))
        sub = joined.loc[ok, [cfg.user_col, cfg.item_col]][res.keep]
        sub = sub.assign(judge=res.judge, human=res.human)
        cells = meta_evaluate(sub, [Target(t.evaluator, t.aspect, "judge", "human")], cfg.methods,
                              cfg.levels, cfg.bootstrap, cfg.confidence, cfg.seed, cfg.user_col, cfg.item_col)
        why = {lv: undefined_reason(sub, lv, cfg.user_col, cfg.item_col, res.human_filled, res.judge_filled)
               for lv in dict.fromkeys(cells.loc[cells["value"].isna(), "level"])}
        cells["note"] = [why.get(lv) if pd.isna(v) else None for lv, v in zip(cells["level"], cells["value"])]
        frames.append(cells)
        report.append({**t._asdict(), "rows": len(sub), "bad_values": int((~ok).sum()),
                       "human_filled": res.human_filled, "judge_filled": res.judge_filled,
                       "dropped_null": res.dropped, **({"undefined": why} if why else {})})
    results = (pd.concat(frames, ignore_index=True) if frames
               else pd.DataFrame(columns=[*RESULT_COLUMNS, "note"]))
    return results, report


# ------------------------------------------------------------------ why a value is undefined

LEVEL_GROUPS = {"user": ("user", "users"), "pair": ("(user, item) pair", "(user, item) pairs")}


def _constant(values: np.ndarray) -> bool:
    return values.size > 0 and bool(np.all(values == values[0]))


def _filled(n: int, setting: str) -> str:
    return f", {n} of them filled in by {setting}" if n else ""


def undefined_reason(sub: pd.DataFrame, level: str, user_col: str, item_col: str, human_filled: int = 0,
                     judge_filled: int = 0) -> str:
    """Why a correlation at `level` over `sub` (columns judge, human, the user and
    item) is undefined: a constant side or too few rows over all the rows, else what
    kept every user or (user, item) group from a defined value."""
    judge, human = sub["judge"].to_numpy(np.float64), sub["human"].to_numpy(np.float64)
    if len(sub) < 2:
        return (f"{'no row' if len(sub) == 0 else 'only one row'} with both an evaluator score and a human "
                "rating: correlation undefined")
    sides = []
    if _constant(human):
        sides.append(f"constant human ratings (all {human[0]:g}{_filled(human_filled, '--human-null')})")
    if _constant(judge):
        sides.append(f"constant evaluator scores (all {judge[0]:g}{_filled(judge_filled, '--judge-null')})")
    if sides:
        return " and ".join(sides) + ": correlation undefined"
    if level not in LEVEL_GROUPS:
        return "correlation undefined"
    one, many = LEVEL_GROUPS[level]
    groups = sub.groupby([user_col] if level == "user" else [user_col, item_col], sort=False)
    size = groups.size()
    small = size < 2
    parts = [(int(small.sum()), "with fewer than two rows"),
             (int(((groups["human"].nunique() == 1) & ~small).sum()), "with constant human ratings"),
             (int(((groups["judge"].nunique() == 1) & ~small).sum()), "with constant evaluator scores")]
    said = ", ".join(f"{n} {what}" for n, what in parts if n)
    return f"no {one} has a defined correlation (of {len(size)} {many}: {said})"


def undefined_warnings(results: pd.DataFrame) -> list[str]:
    """One line per (evaluator, aspect, reason): which cells are undefined and why."""
    if "note" not in results or results["note"].isna().all():
        return []
    noted = results[results["note"].notna()]
    cols = ["evaluator", "aspect", "note"] + (["ties"] if "ties" in noted else [])
    lines = []
    for key, part in noted.groupby(cols, sort=False):
        ev, aspect, note = key[:3]
        if "level" in part:
            names = list(dict.fromkeys(part["level"]))
            where = f"level{'s' if len(names) > 1 else ''} {', '.join(names)}"
        else:
            where = ("with ties: " if key[3] else "without ties: ") + ", ".join(dict.fromkeys(part["metric"]))
        lines.append(f"{ev} / {aspect} ({where}): {note}")
    return lines


def unmatched_warnings(counts: dict, scores: str, human: str | None) -> list[str]:
    """Rows of one table with no partner in the other: error rows, easy to overlook."""
    if human is None:
        return []
    out = []
    for side, source, other in (("unmatched_scores", scores, human), ("unmatched_human", human, scores)):
        if counts.get(side):
            out.append(f"{counts[side]} row(s) of {source} have no partner in {other}; they are error rows "
                       "(unmatched_row) in errors.parquet")
    return out


def pairwise_reason(judge: list, human: list, ties: bool) -> str:
    """Why a pairwise agreement value is undefined: no item has a verdict on both sides
    (after leaving out ties), or every verdict is the same label, where chance agreement
    is total and kappa and alpha divide by zero."""
    used = [(j, h) for j, h in zip(judge, human)
            if j is not None and h is not None and (ties or TIE not in (j, h))]
    if not used:
        return "no item has a verdict on both sides" + ("" if ties else " that is not a tie")
    labels = sorted({x for pair in used for x in pair})
    if len(labels) == 1:
        return (f"every verdict on both sides is {labels[0]}: chance agreement is total, "
                "so kappa and alpha are undefined")
    return "undefined"


def _pairwise_targets(cfg: MetaEvaluateConfig, targets: list[Target], column: Callable
                      ) -> tuple[pd.DataFrame, list[dict]]:
    """Accuracy, kappa and alpha of every target with and without ties."""
    rows, report = [], []
    for t in targets:
        (j, j_bad), (h, h_bad) = column("judge", t.judge_col), column("human", t.human_col)
        ok = ~(j_bad | h_bad)
        j_ok = [v for v, keep in zip(j, ok) if keep]
        h_ok = [v for v, keep in zip(h, ok) if keep]
        entry = {**t._asdict(), "bad_values": int((~ok).sum())}
        for ties in (True, False):
            res = pairwise_agreement(j_ok, h_ok, ties=ties, n_resamples=cfg.bootstrap,
                                     confidence=cfg.confidence, seed=cfg.seed)
            values = {"accuracy": (res.accuracy, res.accuracy_ci), "cohen_kappa": (res.kappa, res.kappa_ci),
                      "krippendorff_alpha": (res.alpha, res.alpha_ci)}
            for metric, (value, (low, high)) in values.items():
                note = pairwise_reason(j_ok, h_ok, ties) if pd.isna(value) else None
                rows.append({"evaluator": t.evaluator, "aspect": t.aspect, "ties": ties, "metric": metric,
                             "value": value, "n_used": res.n_used, "n_total": res.n_total,
                             "n_missing": res.n_missing, "n_tie_dropped": res.n_tie_dropped,
                             "ci_low": low, "ci_high": high, "note": note})
            entry["rows_with_ties" if ties else "rows_without_ties"] = res.n_used
            entry["missing_labels"] = res.n_missing
            if not ties:
                entry["tie_dropped"] = res.n_tie_dropped
        report.append(entry)
    return pd.DataFrame(rows, columns=PAIRWISE_RESULTS.names), report
