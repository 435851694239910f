"""Inputs of `rexeval meta-evaluate`: tables read, long judge scores pivoted, the
evaluator table joined with the human one, columns paired into targets, values read.

Three layouts of the evaluator table are understood, told apart by their columns:
- wide: evaluator columns (`judge_<aspect>`) beside the keys;
- long, as `rexeval judge likert` writes it (judge, aspect, score): pivoted to one
  column per (judge, aspect); each distinct judge is an evaluator, named by its value;
- verdicts, as `rexeval judge pairwise` writes it (pair_id, system, verdict): in
  pairwise mode `verdict` and each `verdict_<criterion>` meet `human_verdict` and
  `human_verdict_<criterion>`.

Keys: rows match on the explanation key (`system` unless --key says otherwise) plus
`example_id` when every table has that column, else plus user and item. The evaluator
table always needs user and item, since correlations are grouped by them.

Nothing is dropped silently: a missing or repeated key (in the long layout a repeated
(judge, explanation, aspect) score), a row with no partner, an unreadable value each
become an error row naming the file, the row and the field. Two tables of which no row
matches are refused (nothing could be measured), naming both files, the key columns and
a few keys of each; a missing column is blamed on the file that should hold it.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.metrics.agreement import LABELS, TIE, Target
from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.io import FORMAT_NAMES, json_lines, read_parquet, read_raw, table_files
from rexeval.storage import location
from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.table_formats import UnknownTableFormat, table_format
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig

STAGE = "meta_evaluate"
AUTO_KEYS = ("system", "explanation_id", "pair_id")
EXAMPLE_KEY = "example_id"
LONG_COLUMNS = ("judge", "aspect", "score")
VERDICT_COLUMNS = ("pair_id", "system", "verdict")
DEFAULT_JUDGE_PREFIXES = ["judge_"]
MISSING_TEXT = {"", "nan", "none", "null", "na", "n/a"}


# ------------------------------------------------------------------ reading


@dataclass
class InputTable:
    """A user's table as read, and how a person names each row of it."""

    source: str
    df: pd.DataFrame  # columns as in the file; a plain 0..n-1 index
    labels: list[int]  # JSON lines: the line number; otherwise the 1-based record number
    unit: str  # "line" or "row"
    fmt: str = "parquet"  # the format it was read as (table_formats.FORMATS)
    found: list[str] = field(default_factory=list)  # its columns as read (renamed by `columns`)

    def where(self, i: int) -> str:
        return f"{self.source}, {self.unit} {self.labels[i]}"

    def line(self, i: int) -> int | None:
        return self.labels[i] if self.unit == "line" else None

    def origin(self, i: int, column: str | None) -> tuple[str, int | None, str | None, str]:
        """(where, line, field, raw row) an error about row i's `column` points at."""
        raw = json.dumps(self.df.iloc[i].to_dict(), default=str, ensure_ascii=False, sort_keys=True)
        return self.where(i), self.line(i), column, raw


@dataclass
class PivotedTable(InputTable):
    """Evaluator columns built from a long table; errors point back at its rows, so a
    bad score is reported at the row of the file that holds it."""

    long: InputTable = None  # type: ignore[assignment]
    rows: list[list[int]] = field(default_factory=list)  # per wide row: its long rows
    cells: dict[tuple[int, str], int] = field(default_factory=dict)  # (row, column) -> long row
    columns: dict[str, tuple[str, str]] = field(default_factory=dict)  # column -> (judge, aspect)

    def where(self, i: int) -> str:
        labels = [str(self.long.labels[p]) for p in self.rows[i]]
        shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
        return f"{self.source}, {self.unit}{'s' if len(labels) > 1 else ''} {shown}"

    def line(self, i: int) -> int | None:
        return self.long.line(self.rows[i][0])

    def origin(self, i: int, column: str | None) -> tuple[str, int | None, str | None, str]:
        if (i, column) not in self.cells:
            return super().origin(i, column)
        p = self.cells[(i, column)]
        judge, aspect = self.columns[column]
        where, line, _, raw = self.long.origin(p, "score")
        return f"{where} (judge {judge!r}, aspect {aspect!r})", line, "score", raw


def read_input(path: str | Path, columns: dict[str, str] | None = None) -> InputTable:
    """Parquet (a file or a folder of parts), CSV, TSV or JSON lines, gzipped or not,
    from a local path or a URI: the format told by the file's name and checked against
    its first bytes (`table_formats.table_format`). CSV cells stay text, so a key like
    "007" keeps its zeros and a bad value can be shown exactly as written; JSON lines keep
    their line numbers. `columns` maps our column names to the file's (ours -> theirs)."""
    loc, p = location(path), given_text(path)  # error rows name the input as it was given
    if not loc.exists():
        raise FileNotFoundError(f"input not found: {p}")
    if loc.is_dir():
        files = table_files(loc)
        if not files:
            raise FileNotFoundError(f"{p}: no table there (a folder with no *.parquet parts); give a "
                                    "Parquet, CSV, TSV or JSON-lines file, or a folder of Parquet parts")
        df = pa.concat_tables([read_parquet(f) for f in files]).to_pandas()  # a non-Parquet part is named
        table = InputTable(p, df.reset_index(drop=True), list(range(1, len(df) + 1)), "row", "parquet")
    else:
        try:
            fmt = table_format(p)
        except UnknownTableFormat as exc:
            raise SchemaError(STAGE, p, None, None, str(exc).split(": ", 1)[-1]) from None
        if fmt == "jsonl":  # line by line: a value of another type is an error row, not a failed read
            rows = list(json_lines(p, STAGE))
            df = pd.DataFrame.from_records([obj for _, obj in rows])
            table = InputTable(p, df, [n for n, _ in rows], "line", fmt)
        else:
            df = read_raw(p, name=STAGE, text=True, fmt=fmt).to_pandas()
            table = InputTable(p, df, list(range(1, len(df) + 1)), "row", fmt)
    if columns:
        table.df = table.df.rename(columns={theirs: ours for ours, theirs in columns.items()})
    table.found = [str(c) for c in table.df.columns]
    return table


def with_columns_found(exc: SchemaError, tables: Sequence[InputTable | None]) -> SchemaError:
    """`exc` about a missing column of one of `tables`, its problem also naming the
    format the file was read as and the columns found there (once)."""
    table = next((t for t in tables if t is not None and t.source == exc.source), None)
    missing = "column is missing" in exc.problem or "no explanation key column" in exc.problem
    if table is not None and missing and "columns found" not in exc.problem:
        exc.problem += (f" ({FORMAT_NAMES.get(table.fmt, table.fmt)} file, columns found: "
                        f"{_shown(table.found) or 'none'}; map yours with --columns OURS=YOURS)")
    return exc


def _is_missing(v) -> bool:
    if v is None or v is pd.NA:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v.strip().lower() in MISSING_TEXT


def _key_text(v) -> str:
    return "" if _is_missing(v) else str(v).strip()


def _error(table: InputTable, i: int, row_id: str | None, column: str | None, kind: str, problem: str) -> dict:
    where, line, column, raw = table.origin(i, column)
    return {"source": table.source, "line": line, "row_id": row_id, "field": column,
            "error_type": kind, "message": f"{where}, field '{column}': {problem}", "raw": raw}


# ------------------------------------------------------------------ layouts


def layout_of(cfg: MetaEvaluateConfig, table: InputTable) -> str:
    """"long", "verdicts" or "wide", by the columns; refuses settings that do not apply."""
    cols = set(table.df.columns)
    if all(c in cols for c in LONG_COLUMNS):
        if cfg.mode != "scores":
            raise ValueError(f"{table.source} holds long-format Likert scores (judge, aspect, score); "
                             "they need --mode scores")
        if cfg.judge_cols or cfg.judge_prefixes != DEFAULT_JUDGE_PREFIXES or cfg.evaluator:
            raise ValueError(f"{table.source} holds long-format scores: evaluators are its judge values, "
                             "so --judge-col, --judge-prefix and --evaluator do not apply")
        return "long"
    explicit = cfg.judge_cols or cfg.judge_prefixes != DEFAULT_JUDGE_PREFIXES
    if all(c in cols for c in VERDICT_COLUMNS) and not explicit:
        if cfg.mode == "pairwise":
            return "verdicts"
        if not any(c.startswith(p) for c in cols for p in cfg.judge_prefixes):
            raise ValueError(f"{table.source} holds pairwise verdicts (pair_id, system, verdict); "
                             "they need --mode pairwise")
    return "wide"


def explanation_key(cfg: MetaEvaluateConfig, tables: Sequence[InputTable]) -> str:
    """--key, or the first of AUTO_KEYS that every table has."""
    if cfg.key != "auto":
        return cfg.key
    found = [k for k in AUTO_KEYS if all(k in t.df.columns for t in tables)]
    if found:
        return found[0]
    has = {t.source: [k for k in AUTO_KEYS if k in t.df.columns] for t in tables}
    lacking = next((t for t in tables if not has[t.source]), None)
    if lacking is not None:  # the file without any of them is the one to fix
        raise SchemaError(STAGE, lacking.source, None, None,
                          f"no explanation key column ({', '.join(AUTO_KEYS)}); name it with --key")
    raise ValueError("no explanation key column in both tables: " + "; ".join(
        f"{src} has {', '.join(ks)}" for src, ks in has.items()) + "; name the one to join on with --key")


def resolve_keys(cfg: MetaEvaluateConfig, tables: Sequence[InputTable]) -> tuple[list[str], list[str]]:
    """(join keys, user and item columns the evaluator table carries besides them).
    Join keys: example_id and the explanation key when every table has example_id,
    else user, item and the explanation key."""
    key = explanation_key(cfg, tables)
    users = [cfg.user_col, cfg.item_col]
    if key != EXAMPLE_KEY and key not in users and all(EXAMPLE_KEY in t.df.columns for t in tables):
        keys = [EXAMPLE_KEY, key]
    else:
        keys = users + [key]
    also = [c for c in users if c not in keys]
    for n, t in enumerate(tables):
        for k in keys + (also if n == 0 else []):
            if k not in t.df.columns:
                raise SchemaError(STAGE, t.source, k, None, "required key column is missing")
    return keys, also


def pivot_long(cfg: MetaEvaluateConfig, table: InputTable) -> tuple[PivotedTable, list[dict]]:
    """One row per explanation (user, item, example_id when present, explanation key),
    one column per (judge, aspect) holding the score as written. A row missing a key,
    judge or aspect, and a repeated (judge, explanation, aspect) score, are error rows;
    the first score is the one used."""
    ids = [cfg.user_col, cfg.item_col] + ([EXAMPLE_KEY] if EXAMPLE_KEY in table.df.columns else [])
    ids.append(explanation_key(cfg, [table]))
    ids = list(dict.fromkeys(ids))
    for k in ids:
        if k not in table.df.columns:
            raise SchemaError(STAGE, table.source, k, None, "required key column is missing")
    names = ids + ["judge", "aspect"]
    scores = table.df["score"].tolist()
    groups: dict[tuple[str, ...], int] = {}
    out = PivotedTable(table.source, pd.DataFrame(), [], table.unit, table.fmt, table.found, long=table)
    values: dict[str, dict[int, object]] = {}
    errors = []
    for i, raw in enumerate(zip(*(table.df[c].tolist() for c in names))):
        text = tuple(_key_text(v) for v in raw)
        key, judge, aspect = text[:len(ids)], text[-2], text[-1]
        row_id = "/".join(key)
        missing = [c for c, v in zip(names, raw) if _is_missing(v)]
        if missing:
            errors.append(_error(table, i, row_id, missing[0], "missing_key", "the key value is missing"))
            continue
        col = score_column(judge, aspect)
        n = groups.setdefault(key, len(groups))
        if (n, col) in out.cells:
            shown = ", ".join(f"{k}={v}" for k, v in zip(ids, key))
            errors.append(_error(table, i, row_id, "score", "duplicate_key",
                                 f"repeats judge {judge!r}'s {aspect!r} score for ({shown}) of an earlier "
                                 "row, which is the one used (several runs in one file? filter it first)"))
            continue
        if n == len(out.rows):
            out.rows.append([])
            out.labels.append(table.labels[i])
        out.rows[n].append(i)
        out.cells[(n, col)] = i
        out.columns.setdefault(col, (judge, aspect))
        values.setdefault(col, {})[n] = scores[i]
    df = pd.DataFrame(list(groups), columns=ids)
    for col, by_row in values.items():
        df[col] = pd.Series([by_row.get(n) for n in range(len(df))], dtype=object)
    out.df = df
    return out, errors


def score_column(judge: str, aspect: str) -> str:
    """A pivoted column's name; brackets keep it apart from any key or human column."""
    return f"score[{judge} | {aspect}]"


# ------------------------------------------------------------------ joining


def keyed_rows(table: InputTable, keys: list[str], also: Sequence[str] = ()
               ) -> tuple[pd.DataFrame, list[dict]]:
    """(keys and `also` as text + `pos`, the row's position in the table) for rows with a
    complete, first-seen key; error rows for the others (the first of a repeated key is
    kept). `also` must be present but does not make a row unique."""
    cols = list(keys) + [c for c in also if c not in keys]
    out = {k: [] for k in cols} | {"pos": []}
    errors, seen = [], set()
    for i, values in enumerate(zip(*(table.df[k].tolist() for k in cols))):
        text = tuple(_key_text(v) for v in values)
        key = text[:len(keys)]
        row_id = "/".join(key)
        missing = [k for k, v in zip(cols, values) if _is_missing(v)]
        if missing:
            errors.append(_error(table, i, row_id, missing[0], "missing_key", "the key value is missing"))
            continue
        if key in seen:
            errors.append(_error(table, i, row_id, keys[-1], "duplicate_key",
                                 f"repeats the key ({', '.join(f'{k}={v}' for k, v in zip(keys, key))}) "
                                 "of an earlier row, which is the one used"))
            continue
        seen.add(key)
        for k, v in zip(cols, text):
            out[k].append(v)
        out["pos"].append(i)
    return pd.DataFrame(out), errors


def join_tables(scores: InputTable, human: InputTable | None, keys: list[str], also: Sequence[str] = ()
                ) -> tuple[pd.DataFrame, list[dict], dict[str, int]]:
    """Rows in both tables: keys, `also` (from the scores table), `pos_judge` and
    `pos_human` (positions in each table). One table: both positions are the same row.
    Rows of one table without a partner in the other are error rows naming their file
    and row."""
    left, errors = keyed_rows(scores, keys, also)
    counts = {"rows_scores": len(scores.df)}
    if human is None:
        joined = left.rename(columns={"pos": "pos_judge"}).assign(pos_human=left["pos"])
        return joined, errors, counts | {"joined": len(joined)}
    right, more = keyed_rows(human, keys)
    errors += more
    merged = left.merge(right, on=keys, how="outer", suffixes=("_judge", "_human"), indicator=True)
    if not (merged["_merge"] == "both").any():
        raise ValueError(no_match(scores, human, keys, left, right))
    field_name = ",".join(keys)
    for side, table, other, pos in (("left_only", scores, human, "pos_judge"),
                                    ("right_only", human, scores, "pos_human")):
        for r in merged[merged["_merge"] == side].itertuples(index=False):
            i = int(getattr(r, pos))
            key_text = ", ".join(f"{k}={getattr(r, k)}" for k in keys)
            errors.append(_error(table, i, "/".join(str(getattr(r, k)) for k in keys), field_name,
                                 "unmatched_row", f"no row with the same key ({key_text}) in {other.source}"))
    joined = merged[merged["_merge"] == "both"].drop(columns="_merge").sort_values("pos_judge")
    joined = joined.astype({"pos_judge": np.int64, "pos_human": np.int64}).reset_index(drop=True)
    counts |= {"rows_human": len(human.df), "joined": len(joined),
               "unmatched_scores": int((merged["_merge"] == "left_only").sum()),
               "unmatched_human": int((merged["_merge"] == "right_only").sum())}
    return joined, errors, counts


def no_match(scores: InputTable, human: InputTable, keys: Sequence[str], left: pd.DataFrame,
             right: pd.DataFrame, most: int = 3) -> str:
    """Why two tables share no row, with a few keys of each side: nothing could be
    measured, and the keys side by side usually show the mismatch (a prefix, a case, a
    different id column)."""
    def sample(frame: pd.DataFrame, table: InputTable) -> str:
        if frame.empty:
            return f"{table.source} has no row with a complete key"
        shown = ["(" + ", ".join(f"{k}={v}" for k, v in zip(keys, row)) + ")"
                 for row in frame[list(keys)].head(most).itertuples(index=False, name=None)]
        more = f" and {len(frame) - most} more" if len(frame) > most else ""
        return f"{table.source} has {', '.join(shown)}{more}"

    return (f"no row of {scores.source} matches a row of {human.source} on ({', '.join(keys)}): "
            f"{sample(left, scores)}; {sample(right, human)}; check that both files describe the same "
            "explanations, or name the key columns with --key, --user-col and --item-col")


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


def _check_targets(targets: list[Target], judge_columns: Sequence[str], human_columns: Sequence[str],
                   keys: Sequence[str], judge_source: str, human_source: str) -> list[Target]:
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


def resolve_targets(cfg: MetaEvaluateConfig, judge_columns: Sequence[str], human_columns: Sequence[str],
                    keys: Sequence[str], judge_source: str, human_source: str) -> list[Target]:
    """Wide layout: pair evaluator columns with human columns: explicit pairs, or
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
                raise no_aspects(cfg, judge_columns, human_columns, keys, judge_source, human_source)
        for p in cfg.judge_prefixes:
            for a in aspects:
                if p + a in judge_columns or cfg.aspects:
                    targets.append(Target(_name(p, cfg), a, p + a, hp + a))
    return _check_targets(targets, judge_columns, human_columns, keys, judge_source, human_source)


def _shown(columns: Sequence[str], most: int = 12) -> str:
    cols = [str(c) for c in columns]
    return ", ".join(cols[:most]) + (f" and {len(cols) - most} more" if len(cols) > most else "")


def no_aspects(cfg: MetaEvaluateConfig, judge_columns: Sequence[str], human_columns: Sequence[str],
               keys: Sequence[str], judge_source: str, human_source: str) -> SchemaError:
    """Why no aspect pairs up, blaming the file that lacks its columns: the human file
    when it has no human column, the evaluator file when it has no evaluator column,
    and the human file again, with the columns it would need and both files named, when
    each has some but no aspect is in both (a misspelt rating column, usually)."""
    hp, prefixes = cfg.human_prefix, cfg.judge_prefixes
    fix = "name them with --aspect, --judge-prefix/--human-prefix or --judge-col/--human-col"
    rated = [c for c in human_columns if c not in keys and c.startswith(hp) and c != hp]
    judged = [c for c in judge_columns if c not in keys and c not in rated
              and any(c.startswith(p) and c != p for p in prefixes)]
    if not rated:
        return SchemaError(STAGE, human_source, None, None,
                           f"no aspect columns found: no human rating column ({hp}<aspect>) among its columns "
                           f"({_shown([c for c in human_columns if c not in keys])}); {fix}")
    if not judged:
        wanted = " or ".join(p + "<aspect>" for p in prefixes)
        return SchemaError(STAGE, judge_source, None, None,
                           f"no aspect columns found: no evaluator column ({wanted}) among its columns "
                           f"({_shown([c for c in judge_columns if c not in keys])}); {fix}")
    expected = list(dict.fromkeys(hp + c[len(p):] for c in judged for p in prefixes if c.startswith(p)))
    return SchemaError(STAGE, human_source, None, None,
                       f"no aspect columns found: no human rating column for the aspects scored in {judge_source} "
                       f"(expected {' or '.join(expected[:12])}; found {_shown(rated)}); {fix}")


def long_targets(cfg: MetaEvaluateConfig, table: PivotedTable, human_columns: Sequence[str],
                 human_source: str) -> list[Target]:
    """Long layout: each judge against `<human prefix><aspect>` for each aspect it scored
    (default: every aspect with a human column)."""
    hp = cfg.human_prefix
    found = list(dict.fromkeys(a for _, a in table.columns.values()))
    if cfg.aspects:
        absent = [a for a in cfg.aspects if a not in found]
        if absent:
            raise SchemaError(STAGE, table.source, "aspect", None, f"no scores for aspect(s) {absent}; "
                              f"the file scores {found}")
        aspects = list(cfg.aspects)
    else:
        aspects = [a for a in found if hp + a in human_columns]
        if not aspects:
            raise SchemaError(STAGE, human_source, None, None,
                              f"no human column for the scored aspects: expected one of "
                              f"{[hp + a for a in found]} (give the human ratings with --human FILE)")
    by_pair = {pair: col for col, pair in table.columns.items()}
    judges = list(dict.fromkeys(j for j, _ in table.columns.values()))
    targets = [Target(j, a, by_pair[(j, a)], hp + a) for j in judges for a in aspects if (j, a) in by_pair]
    return _check_targets(targets, list(table.df.columns), human_columns, (), table.source, human_source)


def verdict_targets(cfg: MetaEvaluateConfig, judge_columns: Sequence[str], human_columns: Sequence[str],
                    judge_source: str, human_source: str) -> list[Target]:
    """Verdicts layout: `verdict` (aspect "overall") and `verdict_<criterion>` (aspect
    <criterion>) against the human column of the same name behind the human prefix."""
    hp = cfg.human_prefix
    found = {("overall" if c == "verdict" else c[len("verdict_"):]): c for c in judge_columns
             if c == "verdict" or (c.startswith("verdict_") and c != "verdict_")}
    aspects = list(cfg.aspects) or [a for a, c in found.items() if hp + c in human_columns]
    if not aspects:
        raise SchemaError(STAGE, human_source, None, None,
                          f"no human verdict column found: expected {hp}verdict or "
                          f"{hp}verdict_<criterion> (the file has {sorted(found.values())})")
    for a in aspects:
        if a not in found:
            raise SchemaError(STAGE, judge_source, "verdict_" + a, None, "verdict column is missing")
    targets = [Target(cfg.evaluator or "judge", a, found[a], hp + found[a]) for a in aspects]
    return _check_targets(targets, judge_columns, human_columns, (), judge_source, human_source)


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
