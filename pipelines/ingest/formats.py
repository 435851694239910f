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
import re
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.table_formats import JSON_ARRAY
from rexeval.storage import Location, PathLike, location

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


BOM = b"\xef\xbb\xbf"
HEAD_BYTES = READ_BLOCK
"""How much of a file's content layout detection reads: a bounded prefix, so a file
that is one 5 GB line costs no more than any other."""


def strip_bom(data: bytes) -> bytes:
    """`data` without a leading UTF-8 byte order mark (Excel and Notepad write one)."""
    return data[len(BOM):] if data.startswith(BOM) else data


def gunzip(stream: BinaryIO, limit: int | None = None) -> tuple[bytes, str | None]:
    """Decompress a gzip stream (every member of it) and say why it stopped early.

    Returns (the bytes decompressed, None) for a whole stream, or (the bytes decompressed
    before the fault, the reason) for a truncated or damaged one, so a reader keeps the
    rows before the fault instead of losing the file. `limit`: stop after that many bytes.
    """
    out = bytearray()
    unzip = None
    while limit is None or len(out) < limit:
        block = stream.read(READ_BLOCK)
        if not block:
            break
        while block:
            if unzip is None or unzip.eof:
                if unzip is not None and not block.strip(b"\x00"):
                    break  # zero padding after the last member
                unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out += unzip.decompress(block, 0 if limit is None else max(1, limit - len(out)))
            except zlib.error as exc:
                return bytes(out), f"damaged gzip data after {len(out):,} decompressed bytes ({exc})"
            if limit is not None and len(out) >= limit:
                return bytes(out[:limit]), None
            block = unzip.unused_data if unzip.eof else b""
    if limit is None and (unzip is None or not unzip.eof):
        return bytes(out), "the gzip data ends early (a truncated or partly downloaded file)"
    return bytes(out), None


def read_head(path: PathLike, limit: int = HEAD_BYTES) -> bytes:
    """The first `limit` bytes of a file's content (decompressed when gzipped), without
    a byte order mark; a damaged gzip file gives what could be read of it."""
    loc = location(path)
    if is_gzip(loc):
        with loc.fs.open_input_stream(loc.path, compression=None, buffer_size=READ_BLOCK) as raw:
            data, _ = gunzip(raw, limit)
    else:
        with loc.open_input() as fh:
            data = fh.read(limit)
    return strip_bom(data)


def parse_record(text: str):
    """Decode one line of a JSON-lines dump: strict JSON, else a Python literal.

    The 2014 dumps' "strict=False" files hold Python dict literals (single quotes), so
    only text that starts like a dict is tried as one (evaluating anything else costs
    time and finds no review). Raises ValueError, with the JSON parser's message, when
    the line is neither (also for nesting too deep to decode).
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except ValueError as exc:
        import ast

        if not text.lstrip().startswith("{"):
            raise ValueError(f"not JSON: {exc}") from None
        try:
            return ast.literal_eval(text.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"not JSON nor a Python literal: {exc}") from None


_DETECT_RECORDS = 64
"""JSON lines detection looks at up to this many records for one that decodes, so a
damaged first line does not refuse a whole file."""


def _json_keys(head: bytes) -> set[str] | None:
    """The keys of the first of the first records of `head` that decodes to an object
    (None when none does): what tells the Amazon layouts apart."""
    lines = head.split(b"\n")
    if len(head) >= HEAD_BYTES and len(lines) > 1:
        lines = lines[:-1]  # cut by the prefix, not a record
    tried = 0
    for line in lines:
        if not line.strip():
            continue
        tried += 1
        if tried > _DETECT_RECORDS:
            break
        try:
            obj = parse_record(line.decode("utf-8", "replace").lstrip("\ufeff"))
        except ValueError:
            continue
        if isinstance(obj, dict):
            return {k for k in obj if isinstance(k, str)}
    return None


CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")
"""Bytes no text review holds (C0 controls but tab, line ends and form feed; DEL)."""


def looks_binary(data: bytes) -> bool:
    """Whether a file that starts with `data` is not text, judged on its first non-blank
    line (at most 4 KiB; a damaged tail further on is the parser's to report): a NUL
    byte (no UTF-8 review file holds one; UTF-16 files do), or more than 1 in 20 bytes
    control characters or invalid UTF-8."""
    data = data.lstrip()
    end = data.find(b"\n")
    sample = data[:4096 if end < 0 else min(end, 4096)]
    if not sample:
        return False
    if b"\x00" in sample:
        return True
    bad = len(CONTROL_BYTES.findall(sample))
    text = sample.decode("utf-8", "replace")
    bad += text.count("\ufffd") - sample.count("\ufffd".encode())
    return bad * 20 > len(sample)


def detect_layout(path: PathLike, fmt: str = "auto", columns: dict[str, str] | None = None) -> Layout:
    """Decide how to read `path` (local or a URI): from `fmt` when given, else from its
    name and content: its first records (not physical lines: a CSV record may hold a
    quoted newline) in a bounded prefix, after a byte order mark. A binary file is
    refused here, with the file named, rather than read as thousands of error rows."""
    loc = location(path)
    path = given_text(path)  # what messages name
    columns = columns or {}
    if fmt not in FORMATS:
        raise ValueError(f"unknown format '{fmt}' (formats: {', '.join(FORMATS)})")
    if not loc.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    name = loc.name.lower().removesuffix(".gz")
    if fmt == "auto":
        fmt = "parquet" if name.endswith(".parquet") else _sniff(loc, path, name, columns)
    if fmt == "amazon2014":
        return Layout("json", {**AMAZON2014_FIELDS, **columns})
    if fmt == "amazon2023":
        return Layout("json", {**AMAZON2023_FIELDS, **columns})
    if fmt == "kaggle_csv":
        return Layout("csv", {**KAGGLE_CSV_FIELDS, **columns}, tuple(KAGGLE_CSV_COLUMNS), False)
    if fmt == "csv":
        return _csv_layout(loc, path, columns)
    # parquet
    schema = _parquet_schema(loc)
    mapping = _default_mapping(columns, schema.names)
    _require_mapping(path, mapping, schema.names)
    _check_parquet_types(path, mapping, schema)
    return Layout("parquet", mapping)


def _sniff(loc: Location, path: str, name: str, columns: dict[str, str]) -> str:
    """The format of a text file, from its name and its first records."""
    head = read_head(loc)
    if looks_binary(head):
        raise ValueError(f"{path}: not a text file of reviews (binary data in its first line: "
                         "NUL or control characters, or not UTF-8); if it is one, pass --format "
                         "to read it row by row")
    if not head.strip():
        raise ValueError(f"{path}: no record to tell the layout from (an empty file, or a damaged "
                         "gzip file?); pass --format to read it anyway")
    if name.endswith((".csv", ".tsv")):
        return "csv" if columns else _sniff_csv(head, path)
    keys = _json_keys(head)
    if keys is not None:
        if "reviewerID" in keys or ("asin" in keys and "parent_asin" not in keys):
            return "amazon2014"
        if "parent_asin" in keys or {"user_id", "rating"} <= keys:
            return "amazon2023"
        raise ValueError(f"{path}: JSON lines with unknown keys {sorted(keys)[:12]}; pass --format")
    if head.lstrip(b" \t\r\n" + BOM).startswith(b"["):  # records as one array: not CSV, not lines
        raise ValueError(f"{path}: {JSON_ARRAY}")
    if head.lstrip(b" \t\r\n" + BOM).startswith(b"{"):  # a JSON line cut short is no CSV row
        raise ValueError(f"{path}: looks like JSON lines, but none of its first {_DETECT_RECORDS} "
                         "records decodes; pass --format amazon2014 or amazon2023 to read it "
                         "row by row")
    if b"\n" not in head and len(head) >= HEAD_BYTES:
        raise ValueError(f"{path}: no line end in its first {HEAD_BYTES:,} bytes: not a review "
                         "file of a known layout; pass --format to read it anyway")
    return "csv" if columns else _sniff_csv(head, path)


def _first_csv_row(head: bytes) -> list[str]:
    """The first record of CSV text (a quoted newline and CRLF line ends included; blank
    lines skipped), or [] when there is none or it is not CSV."""
    import csv

    rows = csv.reader(io.StringIO(head.decode("utf-8", "replace"), newline=""))
    limit = csv.field_size_limit(max(csv.field_size_limit(), len(head) + 1))  # a long review
    try:
        for row in rows:
            if row and not (len(row) == 1 and not row[0].strip()):
                return row
    except csv.Error:  # not CSV (a NUL byte in old Pythons, a lone CR in a field)
        pass
    finally:
        csv.field_size_limit(limit)
    return []


def _sniff_csv(head: bytes, path: str) -> str:
    row = _first_csv_row(head)
    if row and row[0].lstrip("\ufeff \t").startswith("{"):
        raise ValueError(f"{path}: looks like JSON lines, not CSV; pass --format amazon2014 or amazon2023")
    if len(row) == len(KAGGLE_CSV_COLUMNS) and row[0] != "reviewerID":
        return "kaggle_csv"
    if row[:2] == KAGGLE_CSV_COLUMNS[:2]:
        return "csv"
    raise ValueError(f"{path}: CSV layout not recognised (first row has {len(row)} fields); "
                     "pass --columns FIELD=COLUMN,... to map it")


def _csv_layout(loc: Location, path: str, columns: dict[str, str]) -> Layout:
    header = _first_csv_row(read_head(loc))
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


def _parquet_schema(path: PathLike):
    from rexeval.pipelines.core.io import parquet_schema

    return parquet_schema(path)


def _type_fits(field_name: str, typ) -> bool:
    """Whether a Parquet column of type `typ` can hold our field (its values are then
    checked row by row): text fields need strings, a timestamp numbers, dates or strings."""
    import pyarrow.types as t

    if t.is_dictionary(typ):
        typ = typ.value_type
    if t.is_null(typ) or t.is_string(typ) or t.is_large_string(typ):
        return True
    if field_name in ("user_id", "item_id"):
        return t.is_integer(typ)
    if field_name == "rating":
        return t.is_integer(typ) or t.is_floating(typ) or t.is_decimal(typ)
    if field_name == "timestamp":
        return t.is_integer(typ) or t.is_floating(typ) or t.is_timestamp(typ) or t.is_date(typ)
    if field_name == "helpful_votes":  # a count, or the 2014 [votes, total] pair
        return t.is_integer(typ) or ((t.is_list(typ) or t.is_large_list(typ)) and t.is_integer(typ.value_type))
    return False


def _check_parquet_types(path: str, mapping: dict[str, str], schema) -> None:
    """Refuse a column whose type cannot hold its field (a list of texts for `text`, a
    struct for `rating`): every row would be wrong the same way, so the file is named."""
    for fld, col in mapping.items():
        typ = schema.field(col).type
        if not _type_fits(fld, typ):
            raise ValueError(f"{path}: column '{col}' is {typ}, which cannot hold {fld}; map "
                             f"another column with --columns {fld}=COLUMN")


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
