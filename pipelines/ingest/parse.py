"""Parse one ingest task (`chunks.Chunk`): its bytes (or Parquet row groups) into raw
string columns with their lines (`parsed.ParsedChunk`), per layout: JSON lines here, CSV
in `csv_records.py`, Parquet here. Validation is `validate.normalise`; the job's steps
are in `steps.py`.

No input fault ends the job: a row that cannot be read is an error row naming its file,
line and field; a file that ends early (a truncated gzip file, an unclosed quote at the
end of a CSV file, a binary tail) keeps the rows read before the fault and adds one error
row saying where and why reading stopped.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rexeval.pipelines.ingest.chunks import Chunk, read_chunk
from rexeval.pipelines.ingest.csv_records import parse_csv
from rexeval.pipelines.ingest.formats import CONTROL_BYTES, parse_record, strip_bom
from rexeval.pipelines.ingest.parsed import ParsedChunk, has_lone_surrogate


def parse_chunk(chunk: Chunk, data: bytes | None = None) -> ParsedChunk:
    """Parse one task's bytes into raw string columns, per its layout.

    A byte order mark at the start of the file is dropped. Where reading ends early
    (a truncated or damaged gzip file, or a binary tail) the rows before are parsed and
    one error row names the line where reading stopped and why."""
    layout = chunk.layout
    if layout.format == "parquet":
        return _parse_parquet(chunk)
    ended: list[tuple[int, str]] = []
    if data is None:
        data, why = read_chunk(chunk)
        if why is not None:  # the cut line is no record: keep whole lines only
            keep = data.rfind(b"\n") + 1
            ended.append((chunk.first_line + data.count(b"\n", 0, keep), why))
            data = data[:keep]
    if chunk.start == 0:
        data = strip_bom(data)
    tail = _binary_tail(data)
    if tail is not None:
        at, lines = tail
        ended.append((chunk.first_line + data.count(b"\n", 0, at),
                      f"binary data (NUL or control bytes, not UTF-8) from there on ({lines:,} line(s))"))
        data = data[:at]
    out = parse_csv(data, chunk) if layout.format == "csv" else _parse_jsonl(data, chunk)
    for line, why in ended:
        out.stop(line, why)
    out.finish()
    return out


def _binary_line(line: bytes) -> bool:
    """A line no review file holds: a NUL byte, or control bytes in text that is not UTF-8."""
    if b"\x00" in line:
        return True
    if not CONTROL_BYTES.search(line):
        return False
    try:
        line.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def _binary_tail(data: bytes) -> tuple[int, int] | None:
    """Where the run of binary lines that ends `data` starts (a byte offset) and how many
    lines it has, or None: a damaged file's garbage tail is one error row, not one per
    line of noise. Walks back from the end, so a text file costs its last line only."""
    cut, lines = None, 0
    pos = len(data) - 1 if data.endswith(b"\n") else len(data)
    while pos >= 0:
        start = data.rfind(b"\n", 0, pos) + 1
        line = data[start:pos]
        if line.strip():
            if not _binary_line(line):
                break
            cut, lines = start, lines + 1
        pos = start - 1
    return None if cut is None else (cut, lines)


# -- JSON lines ----------------------------------------------------------------------


class _WrongType(ValueError):
    """A JSON value whose type cannot be its field's (a list for a text, a dict anywhere)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


# What each field accepts from a JSON line, and how a message says so.
_KIND = {"user_id": "id", "item_id": "id", "rating": "number", "timestamp": "time",
         "helpful_votes": "count"}  # all others: text
_EXPECTED = {"text": "a string", "id": "a string or an integer",
             "number": "a number or a numeric string",
             "time": "a number (seconds or milliseconds since 1970) or a date string",
             "count": "a whole number or the 2014 [votes, total] pair"}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _parse_jsonl(data: bytes, chunk: Chunk) -> ParsedChunk:
    out = ParsedChunk(chunk.path)
    fields = chunk.layout.fields
    values: dict[str, list] = {f: [] for f in fields}
    lines: list[int] = []
    raws: list[str] = []
    for i, raw in enumerate(data.split(b"\n")):
        if not raw.strip():
            continue
        line = chunk.first_line + i
        out.records += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            out.error(line, "invalid_utf8", f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                      raw.decode("utf-8", "replace"))
            continue
        try:  # a file joined from several may hold their byte order marks
            obj = parse_record(text.lstrip("\ufeff"))
        except ValueError as exc:
            out.error(line, "invalid_json", str(exc), text)
            continue
        if not isinstance(obj, dict):
            out.error(line, "invalid_record", f"expected an object, got {_type_name(obj)}", text)
            continue
        surrogates = _SURROGATE_ESCAPE.search(text) is not None
        try:
            row = [_json_value(f, src, obj, surrogates) for f, src in fields.items()]
        except _WrongType as exc:
            out.error(line, "invalid_type", str(exc), text, field=exc.field)
            continue
        for f, v in zip(fields, row):
            values[f].append(v)
        lines.append(line)
        raws.append(text)
    out.columns = {f: pa.array(v, type=pa.string()) for f, v in values.items()}
    out.lines = np.asarray(lines, dtype=np.int64)
    out.raw = raws
    return out


def _pick(obj: dict, src) -> tuple[str, object]:
    """(the key used, its value): the first key of `src` (one or a tuple) with a value."""
    if isinstance(src, tuple):
        for s in src:
            if obj.get(s) is not None:
                return s, obj[s]
        return src[0], None
    return src, obj.get(src)


def _json_value(fld: str, src, obj: dict, surrogates: bool) -> str | None:
    """A field's JSON value as the text `normalise` checks, or _WrongType naming the key
    when the value's type cannot be that field's. Lists are refused (only a text's first
    element would be kept, silently), except the 2014 `helpful: [votes, total]` pair."""
    key, v = _pick(obj, src)
    if v is None:
        return None
    kind = _KIND.get(fld, "text")
    if isinstance(v, str):
        if surrogates and has_lone_surrogate(v):
            raise _WrongType(fld, f"'{key}' holds an unpaired surrogate escape (\\ud800-\\udfff), "
                                  "which is not text")
        return v
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if number and kind in ("number", "time"):
        if isinstance(v, float) and not math.isfinite(v):
            raise _WrongType(fld, f"'{key}' is {v}, not a finite number")
        return str(v) if isinstance(v, int) else repr(v)
    if kind == "id" and isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if kind == "count":
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        if isinstance(v, list) and len(v) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in v):
            return str(v[0])
    raise _WrongType(fld, f"'{key}' must be {_EXPECTED[kind]} for {fld}, got {_type_name(v)}")


def _type_name(v) -> str:
    names = {dict: "an object", list: "a list", tuple: "a tuple", bool: "a boolean",
             int: "a number", float: "a number", str: "a string", type(None): "null"}
    return names.get(type(v), type(v).__name__)


def _parse_parquet(chunk: Chunk) -> ParsedChunk:
    out = ParsedChunk(chunk.path)
    srcs = sorted(set(chunk.layout.fields.values()))
    with chunk.file().open_input() as fh:
        table = pq.ParquetFile(fh).read_row_groups(list(chunk.row_groups), columns=srcs)
    out.records = table.num_rows
    out.columns = {f: _stringify(table.column(src)) for f, src in chunk.layout.fields.items()}
    out.lines = chunk.first_line + np.arange(table.num_rows, dtype=np.int64)
    out.raw = _RowRaw(table)
    return out


def _stringify(col: pa.ChunkedArray) -> pa.Array:
    """A Parquet column as the strings `normalise` checks: a time as whole seconds since
    1970 (floored; no unit cast, which refuses a time that is not whole seconds), a list
    (`detect_layout` lets one through for helpful votes only) as its first element."""
    col = col.combine_chunks()
    if pa.types.is_timestamp(col.type):
        per = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}[col.type.unit]
        ticks = pc.cast(col, pa.int64())
        floor_neg = pc.subtract(pc.divide(pc.add(ticks, 1), per), 1)
        col = pc.if_else(pc.less(ticks, 0), floor_neg, pc.divide(ticks, per))
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        col = pc.list_element(col, 0)
    return col.cast(pa.string())


class _RowRaw:
    def __init__(self, table: pa.Table):
        self.table = table

    def __getitem__(self, i: int) -> str:
        return json.dumps(self.table.slice(i, 1).to_pylist()[0], default=str)
