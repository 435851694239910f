"""What the judge jobs read: explanations, the recommendation context, and the pairs
a pairwise judge compares.

Every input may be a local path or a URI (`rexeval/storage.py`); the driver
reads these small tables, and the chunks read their rows from the job's payload.

Contexts (the shopper's purchase history, the item's description) come from a file that
already holds them (`user_id, item_id, user_profile, item_description`) or are built from
an ingested reviews table (`pipelines.core.context.build_contexts`). Every explanation
row ends in a judged row or an error row: a pair whose baseline explanation is missing
is an error row naming the file, row and field, not a silent drop. Every table may be
Parquet, CSV, TSV or JSON lines, gzipped or not, its columns mapped to ours by
`columns` (--columns). A file that cannot be read (damaged Parquet, broken CSV or JSON
lines, a format rexeval does not read) is named with the format tried, one that lacks a
column with the columns found there, and a context text that is not text (a number) is
refused with its file, row (1-based) and column.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.inputs import given_text, reviews_path
from rexeval.pipelines.core.io import FORMAT_NAMES, json_lines, read_parquet, read_raw, read_table, told_format
from rexeval.pipelines.core.schema import SchemaError
from rexeval.storage import PathLike, location
from rexeval.pipelines.core.context import CONTEXT_COLUMNS
from rexeval.pipelines.core.schema import ERRORS


def read_frame(path: PathLike, columns: dict[str, str] | None = None, own: Sequence[str] = (),
               name: str = "table") -> pd.DataFrame:
    """A small user-given table: Parquet, CSV or TSV (all text, as written) or JSON lines,
    gzipped or not, the format told by the file's name and checked by its first bytes
    (`io.told_format`); one that cannot be read is named with the format tried. `columns`
    (ours -> theirs) renames the file's columns to ours, only the entries for our columns
    `own` when given (one mapping serves several tables). The format read is in
    `df.attrs["format"]`, for `need_columns`."""
    loc, p = location(path), given_text(path)
    fmt = told_format(p, name)
    if fmt == "jsonl":  # line by line: a bad line is named by its number
        df = pd.DataFrame.from_records([obj for _, obj in json_lines(loc, name)])
    elif fmt == "parquet":
        df = read_parquet_frame(loc)
    else:
        df = read_raw(p, name=name, text=True, fmt=fmt).to_pandas()
    back = {theirs: ours for ours, theirs in (columns or {}).items() if not own or ours in own}
    if back:
        df = df.rename(columns=back)
    df.attrs["format"] = fmt
    return df


def need_columns(df: pd.DataFrame, needed: Sequence[str], source: str, name: str) -> None:
    """Refuse a table read by `read_frame` that lacks one of `needed`: the SchemaError
    names the file, the format it was read as and the columns found there."""
    missing = [c for c in needed if c not in df.columns]
    if missing:
        fmt = df.attrs.get("format")
        read_as = f"{FORMAT_NAMES.get(fmt, fmt)} file, " if fmt else ""
        raise SchemaError(name, source, missing[0], None,
                          f"required column(s) missing: {', '.join(missing)}; {read_as}columns found: "
                          f"{', '.join(map(str, df.columns)) or 'none'} (map yours with --columns OURS=YOURS, "
                          "or `columns:` in a config)")


def read_parquet_frame(path: PathLike) -> pd.DataFrame:
    """A Parquet file as pandas reads it, local or by URI (`read_parquet` names a damaged one)."""
    return read_parquet(location(path)).to_pandas()


def as_numbers(df: pd.DataFrame, cols: Sequence[str], source: str, name: str) -> pd.DataFrame:
    """`cols` as numbers: a CSV or TSV read as text (`read_frame`) holds "4" or "" there;
    an empty or missing cell is NaN, anything else that is not a number is a SchemaError
    naming the file, the row (1-based) and the column."""
    for c in cols:
        if c not in df.columns or pd.api.types.is_numeric_dtype(df[c]):
            continue
        col = df[c].map(lambda v: None if isinstance(v, str) and not v.strip() else v)
        num = pd.to_numeric(col, errors="coerce")
        bad = num.isna() & col.notna()
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise SchemaError(name, source, c, i + 1, f"{col.iloc[i]!r} is not a number")
        df[c] = num.astype(float)
    return df


def _blank_as_missing(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    """A CSV or TSV's empty text cells in `cols` as missing (None), as Parquet and JSON
    lines hold them (CSV has no other way to write one)."""
    if df.attrs.get("format") in ("csv", "tsv"):
        for c in cols:
            if c in df.columns:
                df[c] = df[c].map(lambda v: None if isinstance(v, str) and v == "" else v).astype(object)
    return df


def pool_columns(aspects: Sequence[str]) -> tuple[str, ...]:
    """The one-shot pool's own columns for `aspects` (item_description optional)."""
    from rexeval.pipelines.judge.likert import POOL_COLUMNS

    return (*POOL_COLUMNS, "item_description", *(f"human_{a}" for a in aspects))


def read_examples(path: PathLike, aspects: Sequence[str], columns: dict[str, str] | None = None) -> pd.DataFrame:
    """The Likert judge's one-shot pool (`--examples`): human-rated explanations, any
    format `read_frame` reads, `columns` (ours -> theirs) renaming its own columns
    (user_id, item_id, system, explanation, item_description, human_<aspect>). A missing
    column names the file, the format read and the columns found; a rating that is not a
    number names its row."""
    from rexeval.pipelines.judge.likert import POOL_COLUMNS

    p = given_text(path)
    own = pool_columns(aspects)
    df = read_frame(path, columns, own, "examples")
    need_columns(df, [*POOL_COLUMNS, *(f"human_{a}" for a in aspects)], p, "examples")
    return as_numbers(df, [f"human_{a}" for a in aspects], p, "examples")


LIKERT_SCORE_KEYS = ("judge", "example_id", "system", "aspect", "score")


def read_likert_scores(path: PathLike, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """A `judge likert` scores table (likert_scores.parquet, or one of yours in any format
    `read_frame` reads, `columns` renaming its own columns): the score as a number (an
    empty cell missing), a CSV's empty text cells missing."""
    from rexeval.pipelines.judge.likert import SCORE_COLUMNS

    p = given_text(path)
    df = read_frame(path, columns, SCORE_COLUMNS, "likert scores")
    need_columns(df, LIKERT_SCORE_KEYS, p, "likert scores")
    df = _blank_as_missing(df, [c for c in SCORE_COLUMNS if c != "score"])
    return as_numbers(df, ["score"], p, "likert scores")


CONTEXT_TEXTS = ("user_profile", "item_description")  # the ids may be numbers; these must be text


def _check_texts(df: pd.DataFrame, source: str, columns: Sequence[str]) -> None:
    """Refuse a context text that is a number (or a list...): written as "3" it would
    reach the judge's prompt as the shopper's history."""
    for c in columns:
        if pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            raise SchemaError("contexts", source, c, None, f"holds {df[c].dtype} values, expected text (string); "
                              "check the column holds the texts")
        for i, v in enumerate(df[c].tolist()):
            if v is None or isinstance(v, str) or (isinstance(v, float) and pd.isna(v)):
                continue
            raise SchemaError("contexts", source, c, i + 1,
                              f"{v!r} is {type(v).__name__}, expected text (string); check the column holds "
                              "the texts")


def read_contexts(path: PathLike, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """A contexts file (any format `read_frame` reads) with CONTEXT_COLUMNS (`columns`:
    our names -> the file's)."""
    p = given_text(path)
    df = read_frame(path, columns, CONTEXT_COLUMNS, "contexts")
    need_columns(df, CONTEXT_COLUMNS, p, "contexts")
    _check_texts(df, p, [c for c in CONTEXT_TEXTS if c in CONTEXT_COLUMNS])
    for c in CONTEXT_COLUMNS:
        df[c] = df[c].fillna("").astype(str)
    dup = df.duplicated(["user_id", "item_id"], keep=False)
    if dup.any():
        i = int(dup.to_numpy().argmax())
        raise ValueError(f"{p}: row {i + 1}: (user_id, item_id) = ({df.user_id.iloc[i]}, "
                         f"{df.item_id.iloc[i]}) appears more than once")
    return df[list(CONTEXT_COLUMNS)].reset_index(drop=True)


def reviews_table(path: PathLike, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """An ingested reviews table (a `rexeval ingest` folder or its reviews/ Parquet), or a
    reviews file in any table format (`columns`: our names -> the file's)."""
    return read_table(reviews_path(path), "reviews", rename=columns or None).to_pandas()


def attach_contexts(expl: pd.DataFrame, contexts: pd.DataFrame | None) -> tuple[pd.DataFrame, int]:
    """Explanations with user_profile and item_description columns; rows without a
    context get an empty history and the item id as description (counted)."""
    out = expl.copy()
    if contexts is None:
        out["user_profile"], out["item_description"] = "", out["item_id"].astype(str)
        return out, len(out)
    out = out.merge(contexts, on=["user_id", "item_id"], how="left")
    missing = out["item_description"].isna()
    out["user_profile"] = out["user_profile"].fillna("")
    out.loc[missing, "item_description"] = out.loc[missing, "item_id"].astype(str)
    return out, int(missing.sum())


def load_contexts(contexts: str | None, reviews: Sequence[str], interactions: pd.DataFrame,
                  max_history: int = 10, columns: dict[str, str] | None = None) -> pd.DataFrame | None:
    if contexts:
        return read_contexts(contexts, columns)
    if reviews:
        from rexeval.pipelines.core.context import build_contexts

        table = pd.concat([reviews_table(r, columns) for r in reviews], ignore_index=True)
        return build_contexts(table, interactions[["user_id", "item_id"]].drop_duplicates(),
                              max_history=max_history)
    return None


def explanations_frame(paths: Sequence[str], systems: Sequence[str] | None = None,
                       limit: int | None = None, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """EXPLANATIONS rows as a DataFrame (any table format; `columns`: our names -> the
    file's), optionally limited to systems and to the first `limit` examples of each
    system (in file order)."""
    from rexeval.pipelines.core.inputs import read_explanation_rows  # local or by URI

    df = read_explanation_rows(paths, columns)[0].to_pandas()
    if systems:
        unknown = sorted(set(systems) - set(df["system"]))
        if unknown:
            raise ValueError(f"system(s) {unknown} not in the explanations (they have "
                             f"{sorted(set(df['system']))})")
        df = df[df["system"].isin(systems)]
    if limit:
        df = df.groupby("system", sort=False, group_keys=False).head(limit)
    dup = df.duplicated(["system", "example_id"], keep="first")
    return df[~dup].reset_index(drop=True)


def baseline_pairs(expl: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, pa.Table]:
    """(pairs, errors): each other system's explanation against the baseline's for the
    same example; explanation_a is the system's, explanation_b the baseline's."""
    systems = sorted(set(expl["system"]))
    if baseline not in systems:
        raise ValueError(f"baseline system {baseline!r} is not in the explanations (they have {systems})")
    base = expl[expl["system"] == baseline].set_index("example_id")
    rows, errors = [], []
    for r in expl[expl["system"] != baseline].itertuples(index=False):
        if r.example_id not in base.index:
            errors.append({"stage": "judge_pairwise", "source": None, "line": None,
                           "row_id": f"{r.system}|{r.example_id}", "field": "example_id",
                           "error_type": "no_baseline",
                           "message": f"system {r.system!r}, example {r.example_id!r}: the baseline "
                                      f"{baseline!r} has no explanation for this example", "raw": None})
            continue
        b = base.loc[r.example_id]
        rows.append({"pair_id": f"{r.system}|{r.example_id}", "system": r.system, "baseline": baseline,
                     "example_id": r.example_id, "user_id": r.user_id, "item_id": r.item_id,
                     "user_profile": r.user_profile, "item_description": r.item_description,
                     "explanation_a": r.explanation, "explanation_b": b["explanation"]})
    cols = ["pair_id", "system", "baseline", "example_id", "user_id", "item_id", "user_profile",
            "item_description", "explanation_a", "explanation_b"]
    return pd.DataFrame(rows, columns=cols), pa.Table.from_pylist(errors, schema=ERRORS)
