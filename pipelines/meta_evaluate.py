"""`rexeval meta-evaluate`: how well evaluators agree with human ratings, from files.

Inputs are tables (Parquet file or folder, CSV, TSV, JSON lines) keyed by user, item
and an explanation key (`system` or `explanation_id`, or `pair_id` for pairwise
verdicts; configurable). Either one table holds both the evaluator columns and the
human columns, or an evaluator table and a human table are joined on the keys.

Columns are paired into targets (evaluator, aspect, judge column, human column) by
prefixes (`judge_persuasiveness` with `human_persuasiveness`; several judge prefixes
give several evaluators) or by explicit column pairs.

Nothing is lost: a row with a missing or repeated key, a row of one table with no
partner in the other, and a value that cannot be read (a rating "seven", a verdict
"D") each become an error row naming the file, the row and the field; a bad value
leaves its row out of the targets that use that column only. Missing ratings follow
seed 001's null policy (counted in the report); missing verdicts are left out and
counted. The work is small tabular arithmetic, so no Ray is used.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from metrics.agreement import (
    LABELS,
    LEVELS,
    METHODS,
    RESULT_COLUMNS,
    TIE,
    Target,
    apply_null_policy,
    meta_evaluate,
    pairwise_agreement,
)
from pipelines.io import (
    config_hash,
    json_lines,
    table_files,
    write_json_atomic,
    write_parquet_atomic,
)
from pipelines.schema import SchemaError, error_rows

STAGE = "meta_evaluate"
AUTO_KEYS = ("system", "explanation_id", "pair_id")
MISSING_TEXT = {"", "nan", "none", "null", "na", "n/a"}
RESULTS_FILE, TABLE_FILE, REPORT_FILE, ERRORS_FILE = (
    "meta_evaluation.parquet", "meta_evaluation.md", "report.json", "errors.parquet")

Method = Literal["pearson", "spearman", "kendall"]
Level = Literal["dataset", "user", "pair"]

CORRELATION_RESULTS = pa.schema([
    pa.field("evaluator", pa.string()), pa.field("aspect", pa.string()), pa.field("level", pa.string()),
    pa.field("method", pa.string()), pa.field("value", pa.float64()), pa.field("n_rows", pa.int64()),
    pa.field("n_groups_used", pa.int64()), pa.field("n_groups_total", pa.int64()),
    pa.field("ci_low", pa.float64()), pa.field("ci_high", pa.float64()),
])
PAIRWISE_RESULTS = pa.schema([
    pa.field("evaluator", pa.string()), pa.field("aspect", pa.string()), pa.field("ties", pa.bool_()),
    pa.field("metric", pa.string()), pa.field("value", pa.float64()), pa.field("n_used", pa.int64()),
    pa.field("n_total", pa.int64()), pa.field("n_missing", pa.int64()), pa.field("n_tie_dropped", pa.int64()),
    pa.field("ci_low", pa.float64()), pa.field("ci_high", pa.float64()),
])
PAIRWISE_METRICS = (("accuracy", "ACC"), ("cohen_kappa", "C-κ"), ("krippendorff_alpha", "K-α"))


class MetaEvaluateConfig(BaseModel):
    """Settings of `rexeval meta-evaluate` (YAML keys = the flags' names)."""

    model_config = ConfigDict(extra="forbid")

    scores: str = Field(description="evaluator table, or the one table with both sides")
    human: str | None = Field(None, description="human table joined to `scores` on the keys")
    out: str
    mode: Literal["scores", "pairwise"] = "scores"
    aspects: list[str] = Field(default_factory=list, description="default: every aspect found")
    judge_prefixes: list[str] = Field(default_factory=lambda: ["judge_"])
    human_prefix: str = "human_"
    judge_cols: list[str] = Field(default_factory=list, description="explicit pairs, with human_cols")
    human_cols: list[str] = Field(default_factory=list)
    evaluator: str | None = Field(None, description="evaluator name for a single prefix or column pairs")
    user_col: str = "user_id"
    item_col: str = "item_id"
    key: str = Field("auto", description="explanation key; auto: system, explanation_id, pair_id")
    methods: list[Method] = Field(default_factory=lambda: list(METHODS))
    levels: list[Level] = Field(default_factory=lambda: list(LEVELS))
    table_method: Method | None = Field(None, description="method of the Markdown table (default: first)")
    human_null: float | Literal["drop"] = 3.0
    judge_null: float | Literal["drop"] = 0.0
    bootstrap: int = Field(1000, ge=0, description="resamples for the 95% interval (0: none)")
    confidence: float = Field(0.95, gt=0, lt=1)
    seed: int = 0
    random_baseline: bool = Field(False, description="add seed 001's Random row (uniform 1-5)")

    @model_validator(mode="after")
    def _check(self) -> MetaEvaluateConfig:
        if len(self.judge_cols) != len(self.human_cols):
            raise ValueError(f"give one human column per judge column ({len(self.judge_cols)} judge, "
                             f"{len(self.human_cols)} human)")
        if self.judge_cols and self.aspects:
            raise ValueError("give either column pairs (judge_cols/human_cols) or aspects, not both")
        if not self.methods or not self.levels:
            raise ValueError("methods and levels must not be empty")
        if self.table_method is not None and self.table_method not in self.methods:
            raise ValueError(f"table_method {self.table_method!r} is not among methods {self.methods}")
        return self

    @property
    def shown_method(self) -> str:
        return self.table_method or self.methods[0]


# ------------------------------------------------------------------ reading


@dataclass
class InputTable:
    """A user's table as read, and how a person names each row of it."""

    source: str
    df: pd.DataFrame  # columns as in the file; a plain 0..n-1 index
    labels: list[int]  # JSON lines: the line number; otherwise the 1-based record number
    unit: str  # "line" or "row"

    def where(self, i: int) -> str:
        return f"{self.source}, {self.unit} {self.labels[i]}"

    def line(self, i: int) -> int | None:
        return self.labels[i] if self.unit == "line" else None


def read_input(path: str | Path) -> InputTable:
    """Parquet (file or folder of parts), CSV, TSV or JSON lines, by the file's suffix.
    CSV cells stay text, so a key like "007" keeps its zeros and a bad value can be
    shown exactly as written."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"input not found: {p}")
    suffix = p.suffix.lower()
    if p.is_dir() or suffix in (".parquet", ".pq"):
        df = pa.concat_tables([pq.read_table(f) for f in table_files(p)]).to_pandas()
        return InputTable(str(p), df.reset_index(drop=True), list(range(1, len(df) + 1)), "row")
    if suffix in (".csv", ".tsv"):
        try:
            df = pd.read_csv(p, dtype=str, sep="\t" if suffix == ".tsv" else ",")
        except pd.errors.EmptyDataError:
            raise SchemaError(STAGE, str(p), None, None, "the file is empty") from None
        return InputTable(str(p), df, list(range(1, len(df) + 1)), "row")
    if suffix in (".jsonl", ".json", ".ndjson"):
        rows = list(json_lines(p, STAGE))
        df = pd.DataFrame.from_records([obj for _, obj in rows])
        return InputTable(str(p), df, [n for n, _ in rows], "line")
    raise ValueError(f"{p}: unknown table format {suffix or '(no suffix)'!r}; "
                     "use Parquet, CSV, TSV or JSON lines (.jsonl)")


def resolve_keys(cfg: MetaEvaluateConfig, tables: Sequence[InputTable]) -> list[str]:
    """The join keys: user, item, and the explanation key (auto: the first of AUTO_KEYS
    that every table has)."""
    key = cfg.key
    if key == "auto":
        found = [k for k in AUTO_KEYS if all(k in t.df.columns for t in tables)]
        if not found:
            raise SchemaError(STAGE, tables[0].source, None, None,
                              f"no explanation key column ({', '.join(AUTO_KEYS)}); name it with --key")
        key = found[0]
    keys = [cfg.user_col, cfg.item_col, key]
    for t in tables:
        for k in keys:
            if k not in t.df.columns:
                raise SchemaError(STAGE, t.source, k, None, "required key column is missing")
    return keys


def _is_missing(v) -> bool:
    if v is None or v is pd.NA:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v.strip().lower() in MISSING_TEXT


def _error(table: InputTable, i: int, row_id: str | None, field: str | None, kind: str, problem: str) -> dict:
    raw = json.dumps(table.df.iloc[i].to_dict(), default=str, ensure_ascii=False, sort_keys=True)
    return {"source": table.source, "line": table.line(i), "row_id": row_id, "field": field,
            "error_type": kind, "message": f"{table.where(i)}, field '{field}': {problem}", "raw": raw}


def keyed_rows(table: InputTable, keys: list[str]) -> tuple[pd.DataFrame, list[dict]]:
    """(keys as text + `pos`, the row's position in the table) for rows with a complete,
    first-seen key; error rows for the others (the first of a repeated key is kept)."""
    out = {k: [] for k in keys} | {"pos": []}
    errors, seen = [], set()
    columns = [table.df[k].tolist() for k in keys]
    for i, values in enumerate(zip(*columns)):
        missing = [k for k, v in zip(keys, values) if _is_missing(v)]
        text = tuple(str(v).strip() if not _is_missing(v) else "" for v in values)
        row_id = "/".join(text)
        if missing:
            errors.append(_error(table, i, row_id, missing[0], "missing_key", "the key value is missing"))
            continue
        if text in seen:
            errors.append(_error(table, i, row_id, keys[-1], "duplicate_key",
                                 f"repeats the key ({', '.join(f'{k}={v}' for k, v in zip(keys, text))}) "
                                 "of an earlier row, which is the one used"))
            continue
        seen.add(text)
        for k, v in zip(keys, text):
            out[k].append(v)
        out["pos"].append(i)
    return pd.DataFrame(out), errors


def join_tables(scores: InputTable, human: InputTable | None, keys: list[str]
                ) -> tuple[pd.DataFrame, list[dict], dict[str, int]]:
    """Rows in both tables: keys, `pos_judge` and `pos_human` (positions in each table).
    One table: both positions are the same row. Rows of one table without a partner in
    the other are error rows naming their file and row."""
    left, errors = keyed_rows(scores, keys)
    counts = {"rows_scores": len(scores.df)}
    if human is None:
        joined = left.rename(columns={"pos": "pos_judge"}).assign(pos_human=left["pos"])
        return joined, errors, counts | {"joined": len(joined)}
    right, more = keyed_rows(human, keys)
    errors += more
    merged = left.merge(right, on=keys, how="outer", suffixes=("_judge", "_human"), indicator=True)
    field = ",".join(keys)
    for side, table, other, pos in (("left_only", scores, human, "pos_judge"),
                                    ("right_only", human, scores, "pos_human")):
        for r in merged[merged["_merge"] == side].itertuples(index=False):
            i = int(getattr(r, pos))
            key_text = ", ".join(f"{k}={getattr(r, k)}" for k in keys)
            errors.append(_error(table, i, "/".join(str(getattr(r, k)) for k in keys), field, "unmatched_row",
                                 f"no row with the same key ({key_text}) in {other.source}"))
    joined = merged[merged["_merge"] == "both"].drop(columns="_merge").sort_values("pos_judge")
    joined = joined.astype({"pos_judge": np.int64, "pos_human": np.int64}).reset_index(drop=True)
    counts |= {"rows_human": len(human.df), "joined": len(joined),
               "unmatched_scores": int((merged["_merge"] == "left_only").sum()),
               "unmatched_human": int((merged["_merge"] == "right_only").sum())}
    return joined, errors, counts


# ------------------------------------------------------------------ targets


def _name(prefix: str, cfg: MetaEvaluateConfig) -> str:
    if cfg.evaluator and len(cfg.judge_prefixes) == 1:
        return cfg.evaluator
    return prefix.rstrip("_-.: ") or cfg.evaluator or "judge"


def _strip_aspect(column: str, aspect: str) -> str:
    for cut in (column.removesuffix("_" + aspect), column.removeprefix(aspect + "_")):
        if cut != column and cut:
            return cut
    return column


def resolve_targets(cfg: MetaEvaluateConfig, judge_columns: Sequence[str], human_columns: Sequence[str],
                    keys: Sequence[str], judge_source: str, human_source: str) -> list[Target]:
    """Pair evaluator columns with human columns: explicit pairs, or
    `<judge prefix><aspect>` with `<human prefix><aspect>` for each aspect (default:
    every aspect with a human column and at least one evaluator column)."""
    hp = cfg.human_prefix
    targets: list[Target] = []
    if cfg.judge_cols:
        for j, h in zip(cfg.judge_cols, cfg.human_cols):
            aspect = h.removeprefix(hp) or h
            targets.append(Target(cfg.evaluator or _strip_aspect(j, aspect), aspect, j, h))
    else:
        aspects = list(cfg.aspects)
        if not aspects:
            found = [c[len(hp):] for c in human_columns if c.startswith(hp) and c not in keys and c[len(hp):]]
            # In one table a column cannot be its own partner (both prefixes empty).
            same_table = judge_source == human_source
            aspects = [a for a in found if any(p + a in judge_columns and not (same_table and p == hp)
                                               for p in cfg.judge_prefixes)]
            if not aspects:
                raise SchemaError(STAGE, judge_source, None, None,
                                  f"no aspect columns found: expected pairs like "
                                  f"{cfg.judge_prefixes[0]}<aspect> and {hp}<aspect>; "
                                  "name them with --aspect, --judge-prefix/--human-prefix or --judge-col/--human-col")
        for p in cfg.judge_prefixes:
            for a in aspects:
                if p + a in judge_columns or cfg.aspects:
                    targets.append(Target(_name(p, cfg), a, p + a, hp + a))
    for t in targets:
        if t.judge_col not in judge_columns:
            raise SchemaError(STAGE, judge_source, t.judge_col, None, "evaluator column is missing")
        if t.human_col not in human_columns:
            raise SchemaError(STAGE, human_source, t.human_col, None, "human column is missing")
        if t.judge_col in keys or t.human_col in keys:
            raise ValueError(f"key column used as a score: {t}")
    names = [(t.evaluator, t.aspect) for t in targets]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"two column pairs share evaluator and aspect {repeated}; name them apart")
    return targets


# ------------------------------------------------------------------ values


def read_number(v) -> float:
    """A rating or score as a float; NaN when missing; ValueError when not a number."""
    if _is_missing(v):
        return math.nan
    number = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
    try:
        x = float(v) if number else float(v.strip() if isinstance(v, str) else None)
    except (TypeError, ValueError):
        raise ValueError(f"not a number: {v!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {v!r}")
    return x


def read_verdict(v) -> str | None:
    """A pairwise verdict as "A", "B" or "C" (also "[[A]]" and "tie"); None when
    missing; ValueError otherwise."""
    if _is_missing(v):
        return None
    text = str(v).strip().upper()
    if text.startswith("[[") and text.endswith("]]"):
        text = text[2:-2].strip()
    text = TIE if text == "TIE" else text
    if text not in LABELS:
        raise ValueError(f"not a verdict (A, B or C): {v!r}")
    return text


def parse_column(table: InputTable, positions: np.ndarray, column: str, keys_text: list[str],
                 reader: Callable) -> tuple[list, np.ndarray, list[dict]]:
    """Values of `column` at `positions` through `reader`, a mask of unreadable cells and
    an error row for each of them."""
    values, bad, errors = [], np.zeros(len(positions), dtype=bool), []
    cells = table.df[column].to_numpy(dtype=object)
    for n, i in enumerate(positions):
        try:
            values.append(reader(cells[i]))
        except ValueError as exc:
            values.append(None)
            bad[n] = True
            errors.append(_error(table, int(i), keys_text[n], column, "bad_value", str(exc)))
    return values, bad, errors


# ------------------------------------------------------------------ the job


def _policy(value: float | str) -> float | None:
    return None if value == "drop" else float(value)


def _prepare_out(cfg: MetaEvaluateConfig, digest: str, overwrite: bool) -> Path:
    """Refuse to mix two configs' results in one folder unless asked to overwrite."""
    root = Path(cfg.out)
    report = root / REPORT_FILE
    if report.exists():
        old = json.loads(report.read_text()).get("config_hash")
        if old != digest and not overwrite:
            raise FileExistsError(f"{root} holds meta-evaluation results of another config "
                                  f"(hash {old} != {digest}); use another folder or --overwrite")
    elif root.exists() and any(root.iterdir()) and not overwrite:
        raise FileExistsError(f"{root} is not empty and holds no meta-evaluation report; "
                              "use another folder or --overwrite")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _random_targets(targets: list[Target]) -> list[Target]:
    first = {}
    for t in targets:
        first.setdefault(t.aspect, t)
    return [Target("random", a, f"<random {a}>", t.human_col) for a, t in first.items()]


def run_meta_evaluate(cfg: MetaEvaluateConfig, overwrite: bool = False,
                      progress: Callable[[str], None] = lambda s: None) -> dict:
    """Read, join, pair, score and write the outputs; returns the report."""
    settings = cfg.model_dump(exclude={"out"})
    digest = config_hash(settings)
    scores = read_input(cfg.scores)
    human = read_input(cfg.human) if cfg.human else None
    progress(f"read {len(scores.df):,} rows from {scores.source}"
             + (f" and {len(human.df):,} from {human.source}" if human else ""))
    tables = [scores] + ([human] if human else [])
    keys = resolve_keys(cfg, tables)
    hum = human or scores
    targets = resolve_targets(cfg, list(scores.df.columns), list(hum.df.columns), keys, scores.source,
                              hum.source)
    root = _prepare_out(cfg, digest, overwrite)
    joined, errors, counts = join_tables(scores, human, keys)
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
    schema = CORRELATION_RESULTS if cfg.mode == "scores" else PAIRWISE_RESULTS
    write_parquet_atomic(root / RESULTS_FILE, pa.Table.from_pandas(results, schema=schema, preserve_index=False))
    markdown = (correlation_markdown(results, cfg.shown_method, cfg.levels) if cfg.mode == "scores"
                else pairwise_markdown(results))
    (root / TABLE_FILE).write_text(markdown, encoding="utf-8")
    outputs = [RESULTS_FILE, TABLE_FILE, REPORT_FILE]
    if err.num_rows:
        write_parquet_atomic(root / ERRORS_FILE, err)
        outputs.append(ERRORS_FILE)
    else:
        (root / ERRORS_FILE).unlink(missing_ok=True)  # a previous run's errors are not this run's
    report = {"job": STAGE, "mode": cfg.mode, "config": settings, "config_hash": digest, "keys": keys,
              "counts": counts, "targets": per_target, "outputs": outputs}
    write_json_atomic(root / REPORT_FILE, report)
    return report | {"markdown": markdown}


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
        frames.append(meta_evaluate(sub, [Target(t.evaluator, t.aspect, "judge", "human")], cfg.methods,
                                    cfg.levels, cfg.bootstrap, cfg.confidence, cfg.seed, cfg.user_col,
                                    cfg.item_col))
        report.append({**t._asdict(), "rows": len(sub), "bad_values": int((~ok).sum()),
                       "human_filled": res.human_filled, "judge_filled": res.judge_filled,
                       "dropped_null": res.dropped})
    results = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(RESULT_COLUMNS))
    return results, report


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
                rows.append({"evaluator": t.evaluator, "aspect": t.aspect, "ties": ties, "metric": metric,
                             "value": value, "n_used": res.n_used, "n_total": res.n_total,
                             "n_missing": res.n_missing, "n_tie_dropped": res.n_tie_dropped,
                             "ci_low": low, "ci_high": high})
            entry["rows_with_ties" if ties else "rows_without_ties"] = res.n_used
            entry["missing_labels"] = res.n_missing
            if not ties:
                entry["tie_dropped"] = res.n_tie_dropped
        report.append(entry)
    return pd.DataFrame(rows, columns=PAIRWISE_RESULTS.names), report


# ------------------------------------------------------------------ tables


def _cell(v: float, scale: float = 100.0, digits: int = 2) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{v * scale:.{digits}f}"


def correlation_markdown(results: pd.DataFrame, method: str, levels: Sequence[str]) -> str:
    """Seed 001's Table 1 layout: one row per evaluator, one column per aspect (and their
    average when there are several), each cell the levels' values ×100 joined by " / ";
    then every cell with its interval and the groups it rests on."""
    shown = results[results["method"] == method]
    evaluators = list(dict.fromkeys(shown["evaluator"]))
    aspects = list(dict.fromkeys(shown["aspect"]))
    value = {(r.evaluator, r.aspect, r.level): r.value for r in shown.itertuples()}
    header = aspects + (["Average"] if len(aspects) > 1 else [])
    lines = [f"# Meta-evaluation: {method.capitalize()} correlation with human ratings (×100)", "",
             f"Each cell: {' / '.join(levels)} level (seed 001, section 2.4). \"–\": undefined.", "",
             "| Evaluator | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
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
        lines.append(f"| {ev} | " + " | ".join(cells) + " |")
    lines += ["", "## Every cell", "",
              "| Evaluator | Aspect | Method | Level | ×100 | 95% CI | rows | groups used / total |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results.itertuples():
        ci = "–" if not np.isfinite(r.ci_low) else f"[{_cell(r.ci_low)}, {_cell(r.ci_high)}]"
        lines.append(f"| {r.evaluator} | {r.aspect} | {r.method} | {r.level} | {_cell(r.value)} | {ci} | "
                     f"{r.n_rows} | {r.n_groups_used} / {r.n_groups_total} |")
    return "\n".join(lines) + "\n"


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
        cells = [ev] + ([asp] if len(aspects) > 1 else [])
        for ties in (True, False):
            rows = [by[(ev, asp, ties, m)] for m, _ in PAIRWISE_METRICS]
            cells += [_cell(r.value, 1.0, 3) for r in rows] + [str(rows[0].n_used)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Every cell", "", "| Evaluator | Aspect | Ties | Metric | Value | 95% CI | n used / total |",
              "|---|---|---|---|---|---|---|"]
    for r in results.itertuples():
        ci = "–" if not np.isfinite(r.ci_low) else f"[{_cell(r.ci_low, 1.0, 3)}, {_cell(r.ci_high, 1.0, 3)}]"
        lines.append(f"| {r.evaluator} | {r.aspect} | {'with' if r.ties else 'without'} | {r.metric} | "
                     f"{_cell(r.value, 1.0, 3)} | {ci} | {r.n_used} / {r.n_total} |")
    return "\n".join(lines) + "\n"
