"""The review file formats rexeval reads, and how their fields map onto REVIEWS.

Known layouts:
- `amazon2014`: JSON lines of the 2014 and 2018 Amazon dumps (`reviewerID`, `asin`,
  `overall`, `unixReviewTime`, ...), `.json`/`.jsonl`, optionally gzipped; lines may be
  Python literals (the 2014 "strict=False" files) instead of strict JSON.
- `amazon2023`: JSON lines of the 2023 dump (`user_id`, `parent_asin`, `rating`,
  `timestamp` in milliseconds, ...).
- `kaggle_csv`: the headerless CSV with the nine 2014 columns, in their order.
- `csv` / `parquet`: any table, with a `--columns` mapping from our field names to
  the file's column names (or 0-based positions for a headerless CSV).
"""
from __future__ import annotations

import gzip
import io
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.storage import Location, PathLike, location

# Our field -> the source field, per layout. A tuple lists alternatives, first wins.
AMAZON2014_FIELDS = {
    "user_id": "reviewerID", "item_id": "asin", "rating": "overall",
    "timestamp": "unixReviewTime", "text": "reviewText", "summary": "summary",
    "user_name": "reviewerName", "helpful_votes": ("helpful", "vote"), "category": "category",
}
AMAZON2023_FIELDS = {
    "user_id": "user_id", "item_id": ("parent_asin", "asin"), "rating": "rating",
    "timestamp": "timestamp", "text": "text", "summary": "title",
    "helpful_votes": "helpful_vote", "category": "category",
}
KAGGLE_CSV_COLUMNS = ["reviewerID", "asin", "reviewerName", "helpful", "reviewText",
                      "overall", "summary", "unixReviewTime", "reviewTime"]
KAGGLE_CSV_FIELDS = {
    "user_id": "reviewerID", "item_id": "asin", "rating": "overall",
    "timestamp": "unixReviewTime", "text": "reviewText", "summary": "summary",
    "user_name": "reviewerName", "helpful_votes": "helpful",
}
REQUIRED_FIELDS = ("user_id", "item_id", "rating", "timestamp", "text")
OPTIONAL_FIELDS = ("summary", "user_name", "helpful_votes", "category")
MAPPABLE_FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS
FORMATS = ("auto", "amazon2014", "amazon2023", "kaggle_csv", "csv", "parquet")


@dataclass(frozen=True)
class Layout:
    """A resolved input layout: format, field mapping, and CSV header handling."""

    format: str
    fields: dict = field(default_factory=dict)
    csv_columns: tuple[str, ...] | None = None  # CSV column names (from the header, if any)
    has_header: bool = False  # the first record of the file is the header


def parse_columns(spec: str | dict | None) -> dict[str, str]:
    """Parse `user_id=reviewer,item_id=product,...` into a field mapping."""
    if not spec:
        return {}
    if isinstance(spec, dict):
        pairs = list(spec.items())
    else:
        pairs = []
        for part in spec.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"--columns entry '{part}' is not FIELD=COLUMN")
            k, v = part.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    out = {}
    for k, v in pairs:
        if k not in MAPPABLE_FIELDS:
            raise ValueError(f"--columns: unknown field '{k}' (fields: {', '.join(MAPPABLE_FIELDS)})")
        out[k] = str(v)
    return out


READ_BLOCK = 1 << 20
"""Bytes per read from storage (one request each on an object store)."""


@contextmanager
def open_bytes(path: PathLike) -> Iterator[BinaryIO]:
    """A file (local or by URI) as a buffered byte stream whose lines iterate,
    transparently decompressing gzip."""
    loc = location(path)
    gz = is_gzip(loc)
    with loc.fs.open_input_stream(loc.path, compression=None, buffer_size=READ_BLOCK) as raw:
        with (gzip.GzipFile(fileobj=raw) if gz else io.BufferedReader(raw, READ_BLOCK)) as fh:
            yield fh


def is_gzip(path: PathLike) -> bool:
    with location(path).open_input() as fh:
        return fh.read(2) == b"\x1f\x8b"


def _first_record(path: PathLike) -> bytes:
    with open_bytes(path) as fh:
        for line in fh:
            if line.strip():
                return line.strip()
    return b""


def parse_record(text: str):
    """Decode one line of a JSON-lines dump: strict JSON, else a Python literal.

    The 2014 dumps' "strict=False" files hold Python dict literals (single quotes).
    Raises ValueError, with the JSON parser's message, when the line is neither.
    """
    try:
        return json.loads(text)
    except ValueError as exc:
        import ast

        try:
            return ast.literal_eval(text.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"not JSON nor a Python literal: {exc}") from None


def _json_keys(line: bytes) -> set[str]:
    try:
        obj = parse_record(line.decode("utf-8", "replace"))
    except ValueError:
        return set()
    return set(obj) if isinstance(obj, dict) else set()


def detect_layout(path: PathLike, fmt: str = "auto", columns: dict[str, str] | None = None) -> Layout:
    """Decide how to read `path` (local or a URI): from `fmt` when given, else from its
    name and content (its first record only)."""
    loc = location(path)
    path = given_text(path)  # what messages name
    columns = columns or {}
    if fmt not in FORMATS:
        raise ValueError(f"unknown format '{fmt}' (formats: {', '.join(FORMATS)})")
    if not loc.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    name = loc.name.lower().removesuffix(".gz")
    if fmt == "auto":
        if name.endswith(".parquet"):
            fmt = "parquet"
        elif name.endswith((".csv", ".tsv")):
            fmt = "csv" if columns else _sniff_csv(loc, path)
        else:
            first = _first_record(loc)
            if first.startswith(b"{"):
                keys = _json_keys(first)
                if "reviewerID" in keys or ("asin" in keys and "parent_asin" not in keys):
                    fmt = "amazon2014"
                elif "parent_asin" in keys or {"user_id", "rating"} <= keys:
                    fmt = "amazon2023"
                else:
                    raise ValueError(f"{path}: JSON lines with unknown keys {sorted(keys)[:12]}; "
                                     "pass --format")
            else:
                fmt = "csv" if columns else _sniff_csv(loc, path)
    if fmt == "amazon2014":
        return Layout("json", {**AMAZON2014_FIELDS, **columns})
    if fmt == "amazon2023":
        return Layout("json", {**AMAZON2023_FIELDS, **columns})
    if fmt == "kaggle_csv":
        return Layout("csv", {**KAGGLE_CSV_FIELDS, **columns}, tuple(KAGGLE_CSV_COLUMNS), False)
    if fmt == "csv":
        return _csv_layout(loc, path, columns)
    # parquet
    _require_mapping(path, columns, _parquet_names(loc))
    return Layout("parquet", _default_mapping(columns, _parquet_names(loc)))


def _sniff_csv(loc: Location, path: str) -> str:
    import csv

    first = _first_record(loc).decode("utf-8", "replace")
    row = next(csv.reader(io.StringIO(first)), [])
    if len(row) == len(KAGGLE_CSV_COLUMNS) and row[0] != "reviewerID":
        return "kaggle_csv"
    if row[:2] == KAGGLE_CSV_COLUMNS[:2]:
        return "csv"
    raise ValueError(f"{path}: CSV layout not recognised (first row has {len(row)} fields); "
                     "pass --columns FIELD=COLUMN,... to map it")


def _csv_layout(loc: Location, path: str, columns: dict[str, str]) -> Layout:
    import csv

    first = _first_record(loc).decode("utf-8", "replace")
    header = next(csv.reader(io.StringIO(first)), [])
    if columns and all(v.isdigit() for v in columns.values()):
        # Headerless: positions name the columns.
        names = tuple(f"c{i}" for i in range(len(header)))
        mapping = {k: f"c{int(v)}" for k, v in columns.items()}
        _require_mapping(path, mapping, names)
        return Layout("csv", mapping, names, False)
    if header[:2] == KAGGLE_CSV_COLUMNS[:2] and not columns:
        return Layout("csv", dict(KAGGLE_CSV_FIELDS), tuple(header), True)
    mapping = _default_mapping(columns, header)
    _require_mapping(path, mapping, header)
    return Layout("csv", mapping, tuple(header), True)


def _parquet_names(path: PathLike) -> list[str]:
    from rexeval.pipelines.core.io import parquet_schema

    return parquet_schema(path).names


def _default_mapping(columns: dict[str, str], names) -> dict[str, str]:
    """Fields not mapped explicitly are taken from columns of the same name."""
    mapping = {f: f for f in MAPPABLE_FIELDS if f in names}
    if "text" not in mapping and "review_text" in names:
        mapping["text"] = "review_text"
    mapping.update(columns)
    return mapping


def _require_mapping(path: str, mapping: dict[str, str], names) -> None:
    missing = [f for f in REQUIRED_FIELDS if f not in mapping]
    if missing:
        raise ValueError(f"{path}: no column for required field(s) {', '.join(missing)}; "
                         f"available columns: {', '.join(map(str, names))}; "
                         "map them with --columns FIELD=COLUMN,...")
    absent = [f"{k}={v}" for k, v in mapping.items() if v not in names]
    if absent:
        raise ValueError(f"{path}: --columns names column(s) not in the file: {', '.join(absent)}; "
                         f"available: {', '.join(map(str, names))}")
