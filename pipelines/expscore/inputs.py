"""Reading and validating ExpScore's input files, so the runners only see clean rows.

Explanation tables are Parquet (a file or a folder of parts), CSV or TSV (with a
header) or JSON lines, gzipped or not (`io.told_format` tells which), one explanation
per row, with columns named in the config (or mapped by `columns`): the text, the
item id, the human rating (training; optional when scoring) and, optionally, an example
id and the item's feature words (a list, a JSON array string, or words separated by
";"). The item's reviews (for relevance, REL) come from a REVIEWS table (`rexeval
ingest` output or a table in any of those formats) or from a column holding them.

Nothing is lost: a row that cannot be used becomes an error row naming the file, the
row (1-based: the line of a JSON-lines file, the record number of a CSV or Parquet
file) and the field; a value that is not text where text belongs (a number in a JSON
line) is one too. A Parquet column of the wrong type (numbers for the explanation) is
refused whole, naming the file, the column and the type expected, and so is a damaged
Parquet file.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.metrics.expscore_factors import words
from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.io import FORMAT_NAMES, json_lines, read_parquet, read_raw, read_table, told_format
from rexeval.pipelines.core.schema import SchemaError, is_text_type
from rexeval.storage import Location, location
from rexeval.pipelines.expscore.config import ExpScoreInputs


def _cell(value: Any) -> Any:
    """A table cell as a plain Python value (NaN / NA -> None)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    try:
        if pd.isna(value) is True:
            return None
    except (TypeError, ValueError):
        pass
    return value.item() if isinstance(value, np.generic) else value


TEXT, TEXTS = "text", "text or a list of texts"


def read_rows(path: str | Path, kinds: dict[str, str] | None = None, columns: dict[str, str] | None = None,
              own: tuple[str, ...] = ()) -> tuple[list[dict], list[dict], list[str]]:
    """(rows, error rows, column names) of one explanation file (local or by URI): a
    folder of Parquet parts, or a Parquet, CSV, TSV or JSON-lines file, gzipped or not,
    its format told by its name and checked by its first bytes (`io.told_format`). Each
    row carries `_source` (the path as given) and `_line`; a JSON-lines line that is not
    a JSON object is an error row; an empty CSV cell is missing. `columns` (ours ->
    theirs) renames the file's columns to ours, only the entries for our columns `own`
    when given (one mapping also serves the reviews table). `kinds`: columns whose
    Parquet type must be TEXT (or TEXTS); another type refuses the file (a cast would
    make "3" an explanation)."""
    loc, p = location(path), given_text(path)
    if not loc.exists():
        raise FileNotFoundError(f"no such input: {p}")
    back = {theirs: ours for ours, theirs in (columns or {}).items() if not own or ours in own}
    rows: list[dict] = []
    errors: list[dict] = []
    fmt = "parquet" if loc.is_dir() else told_format(p, "explanations")
    if fmt == "parquet":
        frame = pd.concat([_parquet_part(f, p, kinds or {}, back).to_pandas() for f in _parquet_files(loc)],
                          ignore_index=True)
    elif fmt == "jsonl":
        names: dict[str, None] = {}

        def bad(n: int, problem: str, line: str) -> None:
            errors.append(error_row(p, n, None, None, "bad_json", problem, line))

        for n, obj in json_lines(loc, "explanations", on_bad=bad):
            obj = {back.get(k, k): v for k, v in obj.items()}
            names.update(dict.fromkeys(obj))
            rows.append({**obj, "_source": p, "_line": n})
        return rows, errors, list(names)
    else:  # CSV, TSV: every cell as written, an empty one missing
        frame = read_raw(p, name="explanations", text=True, fmt=fmt).to_pandas().rename(columns=back)
        frame = frame.replace("", None)
    for n, rec in enumerate(frame.to_dict("records"), start=1):
        rows.append({**{k: _cell(v) for k, v in rec.items()}, "_source": p, "_line": n})
    return rows, errors, [str(c) for c in frame.columns]


def format_read(path: str | Path) -> str:
    """How an explanation file was read, for a message: "Parquet", "CSV", ..."""
    loc = location(path)
    fmt = "parquet" if loc.is_dir() else told_format(given_text(path), "explanations")
    return FORMAT_NAMES.get(fmt, fmt)


def _parquet_part(part: Location, given: str, kinds: dict[str, str], back: dict[str, str] | None = None
                  ) -> pa.Table:
    """One Parquet part (`read_parquet` names one that is not Parquet), its columns
    renamed by `back` (theirs -> ours) and its typed columns checked."""
    shown = given if part.uri == location(given).uri else f"{given.rstrip('/')}/{part.name}"
    table = read_parquet(part)
    if back:
        table = table.rename_columns([back.get(c, c) for c in table.column_names])
    for name, kind in kinds.items():
        if name not in table.column_names:
            continue
        t = table.schema.field(name).type
        ok = is_text_type(t) or (kind == TEXTS and pa.types.is_list(t) and is_text_type(t.value_type))
        if not ok:
            raise SchemaError("explanations", shown, name, None,
                              f"holds {t} values, expected {kind} (string); check that the column named in the "
                              "settings holds the texts")
    return table


def _parquet_files(p: Location) -> list[Location]:
    if p.is_file():
        return [p]
    files = [f for f in p.glob("*.parquet") if not f.name.startswith(".")]  # sorted by name
    if not files:
        raise FileNotFoundError(f"{p}: no Parquet parts in this folder")
    return files


def error_row(source: str | None, line: int | None, row_id: str | None, field: str | None, kind: str,
              message: str, raw: Any = None) -> dict:
    """One error row (the ERRORS columns but `stage`); `raw` is kept as text."""
    raw_text = raw if isinstance(raw, str) or raw is None else json.dumps(raw, default=str)[:2000]
    return {"source": source, "line": line, "row_id": row_id, "field": field, "error_type": kind,
            "message": message, "raw": raw_text}


def parse_list(value: Any) -> list[str] | None:
    """A list of strings from a cell: a list, a JSON array string, or "a; b" text.
    None when the value cannot be one."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return None
        else:
            return [s.strip() for s in text.split(";") if s.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [v for v in value if v.strip()]
    return None


def validate_row(raw: dict, cfg: ExpScoreInputs, rating: Literal["required", "optional"],
                 scale: tuple[float, float] = (1, 5)) -> tuple[dict | None, dict | None]:
    """(clean row, None) or (None, error row) for one input row; ratings must lie in `scale`."""
    src, line = raw.get("_source"), raw.get("_line")
    rid = raw.get(cfg.id_column)
    row_id = str(rid) if rid is not None and str(rid).strip() else f"{Path(str(src)).name}:{line}"
    clean_raw = {k: v for k, v in raw.items() if not k.startswith("_")}

    def fail(field: str, kind: str, message: str):
        return None, error_row(src, line, row_id, field, kind, message, clean_raw)

    text = raw.get(cfg.text_column)
    if text is not None and not isinstance(text, str):
        return fail(cfg.text_column, "bad_type", f"the explanation is {json.dumps(text, default=str)} "
                                                  f"({type(text).__name__}), not text")
    if not isinstance(text, str) or not text.strip():
        return fail(cfg.text_column, "missing_text", "the explanation is missing or empty")
    if not words(text):
        return fail(cfg.text_column, "no_words", "the explanation has no words")
    item = raw.get(cfg.item_column)
    if item is None or not str(item).strip():
        return fail(cfg.item_column, "missing_item", "the item id is missing")
    value = raw.get(cfg.rating_column)
    label = None
    if value is None:
        if rating == "required":
            return fail(cfg.rating_column, "missing_rating", "the human rating is missing")
    else:
        try:
            if isinstance(value, bool):
                raise TypeError("a yes/no value is no rating")
            label = float(value)
        except (TypeError, ValueError):
            return fail(cfg.rating_column, "bad_rating", f"the rating {value!r} is not a number")
        lo, hi = scale
        if not math.isfinite(label) or not lo <= label <= hi:
            return fail(cfg.rating_column, "bad_rating", f"the rating {value!r} is outside {lo}..{hi}")
    features = parse_list(raw.get(cfg.features_column))
    if features is None:
        return fail(cfg.features_column, "bad_features",
                    "features must be a list of strings, a JSON array of strings, or text separated by ';'")
    row = {"example_id": row_id, "source": src, "line": line, "explanation": text, "item_id": str(item),
           "rating": label, "features": features}
    if cfg.reviews_column:
        reviews = raw.get(cfg.reviews_column)
        reviews = [reviews] if isinstance(reviews, str) else parse_list(reviews)
        if reviews is None:
            return fail(cfg.reviews_column, "bad_reviews", "reviews must be a text or a list of texts")
        row["item_reviews"] = [r for r in reviews if r.strip()]
    return row, None


def own_columns(cfg: ExpScoreInputs) -> tuple[str, ...]:
    """The explanation table's columns as the settings name them (what `columns` may map)."""
    return tuple(c for c in (cfg.text_column, cfg.item_column, cfg.rating_column, cfg.id_column,
                             cfg.features_column, cfg.reviews_column) if c)


def load_examples(cfg: ExpScoreInputs, rating: Literal["required", "optional"],
                  scale: tuple[float, float] = (1, 5)) -> tuple[list[dict], list[dict], bool]:
    """Valid rows, error rows, and whether any input has the features column."""
    if not cfg.inputs:
        raise ValueError("no input files given")
    if not cfg.reviews and not cfg.reviews_column:
        raise ValueError("give the item reviews: a reviews table (reviews) or an input column (reviews_column)")
    rows, errors, has_features, seen = [], [], False, set()
    own = own_columns(cfg)
    for path in cfg.inputs:
        kinds = {cfg.text_column: TEXT, **({cfg.reviews_column: TEXTS} if cfg.reviews_column else {})}
        raw_rows, errs, columns = read_rows(path, kinds, cfg.columns, own)
        errors += errs
        need = [cfg.text_column, cfg.item_column, *([cfg.rating_column] if rating == "required" else []),
                *([cfg.reviews_column] if cfg.reviews_column else [])]
        missing = [c for c in need if c not in columns]
        if raw_rows and missing:
            raise SchemaError("explanations", given_text(path), missing[0], None,
                              f"required column(s) missing: {', '.join(missing)}; {format_read(path)} file, "
                              f"columns found: {', '.join(columns) or 'none'} (map yours with --columns "
                              "OURS=YOURS, or set the column names in the config or flags)")
        has_features = has_features or cfg.features_column in columns
        for raw in raw_rows:
            row, err = validate_row(raw, cfg, rating, scale)
            if err is None and row["example_id"] in seen:
                err = error_row(row["source"], row["line"], row["example_id"], cfg.id_column, "duplicate_id",
                                f"example id {row['example_id']!r} was already used by an earlier row",
                                {k: v for k, v in raw.items() if not k.startswith("_")})
                row = None
            if err is not None:
                errors.append(err)
            else:
                seen.add(row["example_id"])
                rows.append(row)
    return rows, errors, has_features


def read_reviews(path: str | Path, columns: dict[str, str] | None = None) -> pa.Table:
    """item_id, text of a REVIEWS table (a file in any table format, a folder of Parquet
    parts, or an ingest folder); `columns`: our names -> the file's."""
    p = location(path)
    if (p / "reviews").is_dir():
        p = p / "reviews"
    return read_table(p, "reviews", columns=["review_id", "item_id", "text"], rename=columns or None)


def reviews_by_item(table: pa.Table, items: set[str], cap: int) -> dict[str, list[str]]:
    """Up to `cap` review texts per wanted item, in review_id order (deterministic)."""
    frame = table.to_pandas()
    frame = frame[frame["item_id"].isin(items) & frame["text"].str.strip().astype(bool)]
    frame = frame.sort_values(["item_id", "review_id"], kind="stable")
    return {item: grp["text"].tolist()[:cap] for item, grp in frame.groupby("item_id", sort=True)}


def attach_reviews(rows: list[dict], cfg: ExpScoreInputs
                   ) -> tuple[list[dict], list[dict], list[str], dict[str, list[str]]]:
    """Rows that have item reviews, error rows for those that do not, the WI corpus,
    and the reviews per item (empty in column mode, where rows carry their own)."""
    kept, errors = [], []
    if cfg.reviews_column:
        corpus = sorted({r for row in rows for r in row["item_reviews"]})
        by_item: dict[str, list[str]] = {}
        for row in rows:
            row["item_reviews"] = row["item_reviews"][: cfg.max_reviews_per_item]
            if row["item_reviews"]:
                kept.append(row)
            else:
                errors.append(error_row(row["source"], row["line"], row["example_id"], cfg.reviews_column,
                                        "no_reviews", "the row has no item reviews (relevance needs them)"))
        return kept, errors, corpus, by_item
    table = read_reviews(cfg.reviews, cfg.columns)
    corpus = [t for t in table.column("text").to_pylist() if t]
    by_item = reviews_by_item(table, {r["item_id"] for r in rows}, cfg.max_reviews_per_item)
    for row in rows:
        if by_item.get(row["item_id"]):
            kept.append(row)
        else:
            errors.append(error_row(row["source"], row["line"], row["example_id"], cfg.item_column, "no_reviews",
                                    f"item {row['item_id']!r} has no reviews in {cfg.reviews} (relevance needs them)"))
    return kept, errors, corpus, by_item


@dataclass
class Loaded:
    """A job's checked inputs: in this process (`rows`, and `by_item` the reviews of each
    item) or on Ray (`dataset`: the rows with their item's reviews, on the workers:
    `on_ray.load_on_ray`); the error rows, how many rows came in and are usable, whether
    a features column exists, and WI's word counts (when asked for)."""

    errors: list[dict]
    n_in: int
    n_rows: int
    has_features: bool
    tf: dict[str, int] | None = None
    rows: list[dict] | None = None
    by_item: dict[str, list[str]] = field(default_factory=dict)
    dataset: Any = None


def split_rows(n: int, test_fraction: float, seed: int) -> np.ndarray:
    """"train" / "test" per row from a seeded permutation (test = round(fraction * n))."""
    order = np.random.default_rng(seed).permutation(n)
    labels = np.array(["train"] * n, dtype=object)
    labels[order[: round(test_fraction * n)]] = "test"
    return labels
