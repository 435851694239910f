"""What the judge jobs read: explanations, the recommendation context, and the pairs
a pairwise judge compares.

Every input may be a local path or a URI (`pipelines/core/storage.py`); the driver
reads these small tables, and the chunks read their rows from the job's payload.

Contexts (the shopper's purchase history, the item's description) come from a file that
already holds them (`user_id, item_id, user_profile, item_description`) or are built from
an ingested reviews table (`pipelines.generate.context.build_contexts`). Every explanation
row ends in a judged row or an error row: a pair whose baseline explanation is missing
is an error row naming the file, row and field, not a silent drop. A file that cannot be
read (damaged Parquet, broken CSV or JSON lines) is named, and a context text that is
not text (a number) is refused with its file, row (1-based) and column.
"""
from __future__ import annotations

import io
from collections.abc import Sequence

import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.inputs import given_text, reviews_path
from rexeval.pipelines.core.io import json_lines, read_parquet, read_table
from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.storage import PathLike, location
from rexeval.pipelines.generate.context import CONTEXT_COLUMNS
from rexeval.pipelines.core.schema import ERRORS


def read_frame(path: PathLike) -> pd.DataFrame:
    """A small user-given table: Parquet, CSV (all text) or JSON lines, by suffix; one
    that cannot be read is named (Arrow and pandas do not always say which file)."""
    loc, p = location(path), given_text(path)
    if loc.suffix == ".csv":
        try:
            return pd.read_csv(io.BytesIO(loc.read_bytes()), dtype=str, keep_default_na=False)
        except pd.errors.EmptyDataError:
            raise SchemaError("table", p, None, None, "the file is empty") from None
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise SchemaError("table", p, None, None,
                              f"not a readable CSV file: {str(exc).strip().splitlines()[-1]}") from None
    if loc.suffix in (".jsonl", ".json"):
        return pd.DataFrame.from_records([obj for _, obj in json_lines(loc, "table")])
    return read_parquet_frame(loc)


def read_parquet_frame(path: PathLike) -> pd.DataFrame:
    """A Parquet file as pandas reads it, local or by URI (`read_parquet` names a damaged one)."""
    return read_parquet(location(path)).to_pandas()


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


def read_contexts(path: PathLike) -> pd.DataFrame:
    """A contexts file (Parquet, CSV or JSON lines) with CONTEXT_COLUMNS."""
    p = given_text(path)
    df = read_frame(path)
    missing = [c for c in CONTEXT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: contexts need column(s) {missing} (it has {list(df.columns)})")
    _check_texts(df, p, [c for c in CONTEXT_TEXTS if c in CONTEXT_COLUMNS])
    for c in CONTEXT_COLUMNS:
        df[c] = df[c].fillna("").astype(str)
    dup = df.duplicated(["user_id", "item_id"], keep=False)
    if dup.any():
        i = int(dup.to_numpy().argmax())
        raise ValueError(f"{p}: row {i + 1}: (user_id, item_id) = ({df.user_id.iloc[i]}, "
                         f"{df.item_id.iloc[i]}) appears more than once")
    return df[list(CONTEXT_COLUMNS)].reset_index(drop=True)


def reviews_table(path: PathLike) -> pd.DataFrame:
    """An ingested reviews table (a `rexeval ingest` folder or its reviews/ Parquet)."""
    return read_table(reviews_path(path), "reviews").to_pandas()


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
                  max_history: int = 10) -> pd.DataFrame | None:
    if contexts:
        return read_contexts(contexts)
    if reviews:
        from rexeval.pipelines.generate.context import build_contexts

        table = pd.concat([reviews_table(r) for r in reviews], ignore_index=True)
        return build_contexts(table, interactions[["user_id", "item_id"]].drop_duplicates(),
                              max_history=max_history)
    return None


def explanations_frame(paths: Sequence[str], systems: Sequence[str] | None = None,
                       limit: int | None = None, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """EXPLANATIONS rows as a DataFrame (any table format; `columns`: our names -> the
    file's), optionally limited to systems and to the first `limit` examples of each
    system (in file order)."""
    from rexeval.pipelines.evaluate.inputs import read_explanation_rows  # local or by URI

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
