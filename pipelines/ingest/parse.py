"""Ingest: review files of any supported layout -> validated REVIEWS shards + errors.

Three steps, each resumable, each run by workers that read and write through the
storage module (local paths or URIs), so the driver handles only plans and counts:
1. plan (`pipelines/ingest/chunks.py`): cut every input file into byte ranges at record
   boundaries (quote-aware for CSV), remembering the line each range starts at;
2. parse (Ray Data actor pool, one task per range): parse, map fields, validate with
   vectorised pyarrow kernels; every bad row becomes an error row with its line; each
   shard is staged under the output's `_stage/parse/`;
3. finalise: drop duplicate reviews (same user, item and time; the first one in file
   order is kept and the others become error rows). One task finds them from the id
   columns of all shards (`find_shard_duplicates`); then each shard is committed to
   the output (`commit_shard`): copied as it is, or rewritten when it holds duplicates.
So every input row ends either in `reviews/` or in `errors/`: in = out + errors.

No input fault ends the job: a row that cannot be read or converted is an error row
naming its file, line and field; a file that ends early (a truncated gzip file, an
unclosed quote at the end of a CSV file, a binary tail) keeps the rows read before the
fault and adds one error row saying where and why reading stopped.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from rexeval.pipelines.ingest.formats import REQUIRED_FIELDS, parse_record, strip_bom
from rexeval.pipelines.core.ids import review_ids
from rexeval.pipelines.ingest.chunks import Chunk, read_chunk
from rexeval.pipelines.core.io import read_parquet, write_parquet_atomic
from rexeval.pipelines.core.schema import REVIEWS, error_rows
from rexeval.pipelines.core.stage import Resources, Stage
from rexeval.pipelines.core.storage import Location, PathLike, location

STAGE = "ingest"
_NUMBER = r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$"
# Timestamps above this are milliseconds (the 2023 dump); seconds stay below it until 5138.
_MS_THRESHOLD = 100_000_000_000
# The latest plausible review time, 2100-01-01 UTC. A fixed bound rather than "a few years
# after now", so that re-running a job years later makes the same decisions.
_LATEST = 4_102_444_800
_LATEST_TEXT = "2100-01-01"
_RAW_LIMIT = 65_536
"""Characters of an input row kept in an error row's `raw` (a 5 MB line is named, not copied)."""


# -- parsing -------------------------------------------------------------------------


class ParsedChunk:
    """Raw field columns (strings) with their lines and raw text, plus early errors."""

    def __init__(self, source: str):
        self.source = source
        self.errors: list[dict] = []
        self.columns: dict[str, pa.Array] = {}
        self.lines = np.zeros(0, dtype=np.int64)
        self.raw: list[str] | None = None  # raw row text, aligned with lines
        self.records = 0  # rows seen (blank lines excluded)
        self.stopped: list[tuple[int, str]] = []  # (line, why) where reading ended early

    def error(self, line: int | None, error_type: str, message: str, raw: str | None = None,
              field: str | None = None) -> None:
        self.errors.append({"source": self.source, "line": line, "field": field,
                            "error_type": error_type, "message": _one_line(message), "raw": clip(raw)})

    def stop(self, line: int, why: str) -> None:
        """Note that reading ended early at `line` (the first line not read as rows)."""
        self.stopped.append((line, why))

    def finish(self) -> None:
        """Turn the early ends noted into ONE error row at the first of them (it counts
        as one row in), so in = out + errors holds for a damaged file too."""
        if not self.stopped:
            return
        line = min(at for at, _ in self.stopped)
        whys = "; ".join(why for _, why in sorted(self.stopped))
        self.records += 1
        self.error(line, "read_stopped",
                   f"{self.source}: reading stopped at line {line}: {whys}; the rows before it "
                   "were kept (repair or re-download the file, then ingest it again to read the rest)")
        self.stopped = []


def _one_line(message) -> str:
    """An error message on one line (an exception's text may hold line ends)."""
    text = str(message)
    return " ".join(text.split()) if "\n" in text or "\r" in text else text


def clip(raw: str | None) -> str | None:
    """`raw` cut to `_RAW_LIMIT` characters, saying how long it was."""
    if raw is None or len(raw) <= _RAW_LIMIT:
        return raw
    return f"{raw[:_RAW_LIMIT]}... [{len(raw):,} characters in all]"


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
    out = _parse_csv(data, chunk) if layout.format == "csv" else _parse_jsonl(data, chunk)
    for line, why in ended:
        out.stop(line, why)
    out.finish()
    return out


_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")


def _binary_line(line: bytes) -> bool:
    """A line no review file holds: a NUL byte, or control bytes in text that is not UTF-8."""
    if b"\x00" in line:
        return True
    if not _CONTROL.search(line):
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
        if surrogates and _has_lone_surrogate(v):
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


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _type_name(v) -> str:
    names = {dict: "an object", list: "a list", tuple: "a tuple", bool: "a boolean",
             int: "a number", float: "a number", str: "a string", type(None): "null"}
    return names.get(type(v), type(v).__name__)


# -- CSV -----------------------------------------------------------------------------


def _parse_csv(data: bytes, chunk: Chunk) -> ParsedChunk:
    """Parse a CSV range with pyarrow; a range pyarrow refuses (an unterminated quote) or
    reads into other records than the quote-parity record starts say (a stray quote
    inside a field, a lone CR) is read again record by record (`_parse_csv_records`), so
    one bad record costs its own line, not its whole range."""
    try:
        out = _parse_csv_fast(data, chunk)
    except pa.ArrowException:
        out = None
    return out if out is not None else _parse_csv_records(data, chunk)


def _parse_csv_fast(data: bytes, chunk: Chunk) -> ParsedChunk | None:
    """pyarrow's reader over the whole range; None when its records are not the ones our
    quote-parity record starts found (then lines could not be matched to rows)."""
    out = ParsedChunk(chunk.path)
    layout = chunk.layout
    skip_header = layout.has_header and chunk.start == 0
    # Where each record starts: a line start with an even number of quotes before it.
    arr = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(data)]))
    keep = starts < len(data)
    starts, ends = starts[keep], ends[keep]
    quotes = np.flatnonzero(arr == 34)
    if len(quotes) % 2:  # a quote left open (at the end, or a stray one): read record by record
        return None
    even = np.searchsorted(quotes, starts) % 2 == 0
    width = ends - starts - (ends > starts) * (arr[np.maximum(ends - 1, 0)] == 13)
    is_record = even & (width > 0)
    rec_idx = np.flatnonzero(is_record)
    rec_lines = chunk.first_line + rec_idx
    rec_starts = starts[rec_idx]
    rec_ends = np.concatenate((rec_starts[1:], [len(data)]))  # a record runs to the next one
    base = 0
    if skip_header and len(rec_idx):
        base = int(rec_starts[1]) if len(rec_idx) > 1 else len(data)
        rec_lines, rec_starts, rec_ends = rec_lines[1:], rec_starts[1:], rec_ends[1:]
    data_view = data[base:]
    out.records = len(rec_lines)
    bad: list = []

    def on_invalid(row):
        bad.append(row)
        return "skip"

    names = list(layout.csv_columns)
    wanted = {src for src in layout.fields.values() if src in names}
    with _quiet_bad_utf8_rows(on_invalid):
        table = pacsv.read_csv(
            io.BytesIO(data_view),
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False,
                                           block_size=max(1 << 20, len(data_view) + 1)),
            parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.binary() for n in names},
                                                 include_columns=[n for n in names if n in wanted],
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    if table.num_rows + len(bad) != len(rec_lines) or any(not 0 < r.number <= len(rec_lines) for r in bad):
        return None
    valid = np.ones(len(rec_lines), dtype=bool)
    for row in bad:
        k = row.number - 1  # 1-based among non-empty records of what we parsed
        valid[k] = False
        out.error(int(rec_lines[k]), "invalid_csv",
                  f"expected {row.expected_columns} fields, found {row.actual_columns}",
                  row.text)
    lines = rec_lines[valid]
    raw_bounds = np.stack([rec_starts[valid] - base, rec_ends[valid] - base], axis=1)
    table, lines, raw_bounds = _drop_bad_utf8(table, lines, raw_bounds, data_view, out)
    out.columns = {f: table.column(src).combine_chunks() if src in table.column_names else pa.nulls(table.num_rows, pa.string())
                   for f, src in layout.fields.items()}
    out.lines = lines
    out.raw = _LazyRaw(data_view, raw_bounds)
    return out


@contextmanager
def _quiet_bad_utf8_rows(handler):
    """pyarrow decodes an invalid row's text before calling `handler`; when that text is
    not UTF-8 the decoding fails inside pyarrow, which prints the traceback as an
    "exception ignored" and then refuses the range (read again record by record). Only
    that traceback is kept out of the job's log; any other goes to the usual hook."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not (isinstance(unraisable.exc_value, UnicodeDecodeError) and unraisable.object is handler):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


class _Lines:
    """Physical lines (split at LF only, as chunk line numbers count them) fed to
    csv.reader one at a time; `at` is the index of the next line it will take."""

    def __init__(self, pieces: list[bytes], at: int = 0):
        self.pieces, self.at = pieces, at

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.at >= len(self.pieces):
            raise StopIteration
        piece = self.pieces[self.at]
        self.at += 1
        # Bytes that are not UTF-8 survive as lone surrogates, found per field below.
        return piece.decode("utf-8", "surrogateescape") + ("\n" if self.at < len(self.pieces) else "")


def _parse_csv_records(data: bytes, chunk: Chunk) -> ParsedChunk:
    """Python's csv module, one record at a time, for a range pyarrow cannot read.

    pyarrow gives up on a whole range at one unterminated quote, and reads a stray quote
    inside a field differently from our record starts; here every record is read alone
    (strict quoting: a closing quote must end its field). A record that raises is an
    error row at its first line, and reading goes on at the next line. A quote left open
    to the end of the range is either a stray one (the lines after it still hold whole
    records: they are read) or a cut file (they do not: reading stopped at that record,
    one error row)."""
    out = ParsedChunk(chunk.path)
    layout = chunk.layout
    names = list(layout.csv_columns)
    index = {src: names.index(src) for src in layout.fields.values() if src in names}
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()  # the line end of the last line
    offsets = np.concatenate(([0], np.cumsum([len(p) + 1 for p in pieces], dtype=np.int64)))
    rows: list[list[str]] = []
    spans: list[tuple[int, int]] = []  # (first piece, end piece) of each kept record
    open_at: list[tuple[int, int, int, int, int]] = []  # checkpoints at quotes left open
    header = layout.has_header and chunk.start == 0
    feed = _Lines(pieces)
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, len(data) + 1))
    try:
        reader = csv.reader(feed, strict=True)
        while True:
            first = feed.at
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                if header:  # a damaged header is still the header
                    header = False
                elif feed.at >= len(pieces) and "end of data" in str(exc):
                    open_at.append((first, len(rows), len(out.errors), out.records, len(spans)))
                    out.records += 1
                    out.error(chunk.first_line + first, "invalid_csv",
                              f"a quote opened in this record is never closed ({exc}); read as one line",
                              _text(pieces, first, first + 1))
                else:
                    out.records += 1
                    out.error(chunk.first_line + first, "invalid_csv", f"not a CSV record: {exc}",
                              _text(pieces, first, feed.at))
                feed.at = first + 1
                reader = csv.reader(feed, strict=True)
                continue
            if not row:
                continue  # a blank line
            if header:
                header = False
                continue
            out.records += 1
            line = chunk.first_line + first
            if len(row) != len(names):
                out.error(line, "invalid_csv", f"expected {len(names)} fields, found {len(row)}",
                          _text(pieces, first, feed.at))
                continue
            bad = next((src for src, k in index.items() if _has_lone_surrogate(row[k])), None)
            if bad is not None:
                out.error(line, "invalid_utf8", f"field '{bad}' is not valid UTF-8",
                          _text(pieces, first, feed.at), field=bad)
                continue
            rows.append([row[k] for k in index.values()])  # in the order of `index`
            spans.append((first, feed.at))
    finally:
        csv.field_size_limit(limit)
    _close_open_quotes(out, rows, spans, open_at, chunk)
    at = {src: i for i, src in enumerate(index)}
    out.columns = {f: pa.array([r[at[src]] for r in rows], pa.string()) if src in at
                   else pa.nulls(len(rows), pa.string()) for f, src in layout.fields.items()}
    first_pieces = np.asarray([s for s, _ in spans], dtype=np.int64)
    out.lines = chunk.first_line + first_pieces
    bounds = np.asarray([(offsets[s], offsets[e]) for s, e in spans], dtype=np.int64).reshape(-1, 2)
    out.raw = _LazyRaw(data, bounds)
    return out


def _close_open_quotes(out: ParsedChunk, rows: list, spans: list, open_at: list, chunk: Chunk) -> None:
    """Decide, from the last open quote back, whether each was a stray quote or a cut
    file: when no whole record was read after it, the file ends inside that quote; the
    rows after it are dropped again and reading is said to stop there (one error row)."""
    for first, n_rows, n_errors, n_records, n_spans in reversed(open_at):
        if len(rows) > n_rows:
            break  # whole records follow: a stray quote, its line already an error row
        del rows[n_rows:], spans[n_spans:], out.errors[n_errors:]
        out.records = n_records
        out.stopped = [s for s in out.stopped if s[0] < chunk.first_line + first]
        out.stop(chunk.first_line + first, "a quoted field opened in this record is never closed "
                                           "(a cut file, or a missing closing quote)")


def _text(pieces: list[bytes], start: int, end: int) -> str:
    return b"\n".join(pieces[start:max(end, start + 1)]).decode("utf-8", "replace").rstrip("\r\n")


class _LazyRaw:
    """Raw CSV record text, decoded only for rows that end up as errors."""

    def __init__(self, data: bytes, bounds: np.ndarray):
        self.data, self.bounds = data, bounds

    def __getitem__(self, i: int) -> str:
        s, e = self.bounds[i]
        return self.data[int(s):int(e)].decode("utf-8", "replace").rstrip("\r\n")


def _drop_bad_utf8(table: pa.Table, lines, bounds, data: bytes, out: ParsedChunk):
    """Cast binary columns to UTF-8; rows with invalid bytes become error rows."""
    cols, bad = {}, np.zeros(table.num_rows, dtype=bool)
    for name in table.column_names:
        col = table.column(name)
        try:
            cols[name] = col.cast(pa.string())
        except pa.ArrowInvalid:
            flags = np.array([_bad_utf8(v) for v in col.to_pylist()], dtype=bool)
            for i in np.flatnonzero(flags & ~bad):
                out.error(int(lines[i]), "invalid_utf8", f"field '{name}' is not valid UTF-8",
                          data[int(bounds[i][0]):int(bounds[i][1])].decode("utf-8", "replace").rstrip("\r\n"),
                          field=name)
            bad |= flags
            cols[name] = None
    if bad.any():
        keep = pa.array(~bad)
        table = table.filter(keep)
        lines, bounds = lines[~bad], bounds[~bad]
        cols = {n: table.column(n).cast(pa.string()) for n in table.column_names}
    return pa.table(cols), lines, bounds


def _bad_utf8(v: bytes | None) -> bool:
    if v is None:
        return False
    try:
        v.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


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


# -- validation ----------------------------------------------------------------------


def normalise(parsed: ParsedChunk, min_rating: float = 1.0, max_rating: float = 5.0,
              category: str | None = None) -> tuple[pa.Table, pa.Table]:
    """Validate raw string columns; return (reviews, errors) for one chunk.

    Checks run as vectorised kernels over the whole chunk; a row fails on its first
    problem, in the order: missing required field, empty text, bad rating (not a finite
    number, or out of range), bad timestamp (not a time, negative, after 2100), bad
    helpful votes. No value reaches a conversion that could fail on it.
    """
    cols = parsed.columns
    n = len(parsed.lines)
    problem = np.full(n, None, dtype=object)
    field_of = np.full(n, None, dtype=object)

    def flag(mask, fld: str, message: str):
        mask = np.asarray(mask, dtype=bool) & (problem == None)  # noqa: E711
        problem[mask] = message
        field_of[mask] = fld

    for f in REQUIRED_FIELDS:
        col = cols.get(f)
        if col is None:
            flag(np.ones(n, bool), f, f"missing field '{f}'")
            continue
        stripped = pc.utf8_trim_whitespace(col)
        empty_ = pc.fill_null(pc.equal(pc.utf8_length(stripped), 0), True)
        flag(empty_.to_numpy(zero_copy_only=False),
             f, "empty text" if f == "text" else f"missing field '{f}'")

    rating, why = _ratings(cols["rating"], min_rating, max_rating)
    for message in _messages(why):
        flag(why == message, "rating", message)

    ts, why = _epoch_seconds(cols["timestamp"], problem == None)  # noqa: E711
    for message in _messages(why):
        flag(why == message, "timestamp", message)

    helpful = cols.get("helpful_votes")
    if helpful is not None:
        helpful, bad = _counts(helpful)
        flag(bad, "helpful_votes", "helpful_votes is not a count (a whole number below 10^9, "
                                   "or the 2014 [votes, total] pair)")

    good = problem == None  # noqa: E711
    err_idx = np.flatnonzero(~good)
    errors = [{"source": parsed.source, "line": int(parsed.lines[i]), "field": field_of[i],
               "error_type": "invalid_field", "message": problem[i],
               "raw": clip(parsed.raw[int(i)]) if parsed.raw is not None else None} for i in err_idx]
    errors = parsed.errors + errors

    keep = pa.array(good)
    g = {f: pc.filter(c, keep) for f, c in cols.items() if c is not None}
    m = int(good.sum())
    users, items = g["user_id"], g["item_id"]
    ts_g = ts[good]
    cat = g.get("category")
    if category is not None:
        cat = pa.array([category] * m, pa.string()) if cat is None else pc.fill_null(cat, category)
    reviews = pa.table({
        "review_id": pa.array(review_ids(users.to_pylist(), items.to_pylist(), ts_g.tolist()), pa.string()),
        "user_id": users,
        "item_id": items,
        "rating": pc.cast(pc.filter(rating, keep), pa.float32()),
        "timestamp": pa.array(ts_g, pa.int64()),
        "text": g["text"],
        "summary": g.get("summary", pa.nulls(m, pa.string())),
        "user_name": g.get("user_name", pa.nulls(m, pa.string())),
        "item_title": pa.nulls(m, pa.string()),
        "category": cat if cat is not None else pa.nulls(m, pa.string()),
        "helpful_votes": pc.filter(helpful, keep) if helpful is not None else pa.nulls(m, pa.int32()),
        "source": pa.array([parsed.source] * m, pa.string()),
        "line": pa.array(parsed.lines[good], pa.int64()),
    })
    return reviews.cast(REVIEWS), error_rows(STAGE, errors)


def _messages(why: np.ndarray) -> list[str]:
    """The distinct problems flagged in `why` (None: no problem), in a stable order."""
    return sorted({w for w in why if w is not None})


def _numbers(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(is a number, its value) per row of a string column; only strings that match
    `_NUMBER` are converted, so no value can make the cast fail (huge ones are inf)."""
    numeric = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
    values = pc.cast(pc.if_else(numeric, pc.utf8_trim_whitespace(col), "0"), pa.float64())
    return numeric.to_numpy(zero_copy_only=False), np.array(values.to_numpy(zero_copy_only=False))


def _ratings(col: pa.Array, lo: float, hi: float) -> tuple[pa.Array, np.ndarray]:
    """Ratings as float64 and per row its problem (None when fine): not a number, not
    finite, or outside [lo, hi]."""
    numeric, r = _numbers(col)
    why = np.full(len(r), None, dtype=object)
    why[numeric & (np.isnan(r) | np.isinf(r))] = "rating is not a finite number"
    why[numeric & np.isfinite(r) & ((r < lo) | (r > hi))] = f"rating out of range [{lo:g}, {hi:g}]"
    why[~numeric] = "rating is not a number"
    return pa.array(np.where(numeric & np.isfinite(r), r, 0.0), pa.float64()), why


def _epoch_seconds(col: pa.Array, todo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whole seconds since 1970 per row, and per row its problem (None when fine).

    Numbers are seconds, or milliseconds from 10^11 on (the 2023 dump); other text is
    parsed as a date (only where `todo`: the rare path, row by row). A time must be
    finite, not before 1970 and not after 2100: 9.3e18 or -5 is a broken value, not a
    review time, and converting it to int64 would overflow."""
    numeric, x = _numbers(col)
    n = len(x)
    why = np.full(n, None, dtype=object)
    dates = ~numeric & todo
    if dates.any():
        idx = np.flatnonzero(dates)
        x[idx] = _date_seconds(pc.take(col, pa.array(idx)).to_pylist())
        why[idx[np.isnan(x[idx])]] = "timestamp is neither seconds/milliseconds since 1970 nor a date"
    known = numeric | (dates & ~np.isnan(x))
    why[numeric & ~np.isfinite(x)] = "timestamp is not a finite number"
    x = np.where(known & np.isfinite(x), x, 0.0)
    secs = np.where(numeric & (x >= _MS_THRESHOLD), x / 1000.0, x)
    why[known & (x < 0)] = "timestamp is before 1970 (negative)"
    why[known & (secs >= _LATEST)] = (f"timestamp is after {_LATEST_TEXT} (expected seconds or "
                                      "milliseconds since 1970)")
    ok = known & (x >= 0) & (secs < _LATEST)
    whole = np.where(ok, x, 0.0).astype(np.int64)  # exact: below 2^53 here
    ts = np.where(numeric & (whole >= _MS_THRESHOLD), whole // 1000, whole)
    return ts, why


def _date_seconds(texts: list) -> np.ndarray:
    """Seconds since 1970 (floored) of date strings; NaN where one is not a date."""
    import pandas as pd

    texts = [t if t is not None and len(t) <= 64 else None for t in texts]  # no date is longer
    try:
        return _seconds(pd.to_datetime(pd.Series(texts, dtype=object), errors="coerce", utc=True,
                                       format="mixed"))
    except (ValueError, TypeError, OverflowError):  # pandas refuses the batch: one by one
        return np.concatenate([_date_seconds_one(t) for t in texts]) if texts else np.zeros(0)


def _date_seconds_one(text) -> np.ndarray:
    import pandas as pd

    try:
        return _seconds(pd.to_datetime(pd.Series([text], dtype=object), errors="coerce", utc=True))
    except (ValueError, TypeError, OverflowError):
        return np.array([np.nan])


def _seconds(dt) -> np.ndarray:
    """Whole seconds of a datetime Series in its own resolution (pandas picks one coarse
    enough for year 1 or 9999: no arithmetic in nanoseconds, which would overflow)."""
    out = np.full(len(dt), np.nan)
    ok = dt.notna().to_numpy()
    if ok.any():
        per = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[dt.dt.unit]
        out[ok] = dt[ok].astype("int64").to_numpy() // per
    return out


def _counts(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Helpful votes as int32 (null where absent or blank) and per row whether a value
    is given but is no count: "12", "1,234" (2018 "vote") or "[12, 15]" (2014 "helpful":
    votes, total)."""
    first = pc.struct_field(pc.extract_regex(col, r"^\s*\[?\s*(?P<n>\d[\d,]{0,11})"), [0])
    digits = pc.replace_substring(first, ",", "")
    ok = pc.fill_null(pc.match_substring_regex(digits, r"^\d{1,9}$"), False)
    blank = pc.fill_null(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0), True)
    bad = ~(ok.to_numpy(zero_copy_only=False) | blank.to_numpy(zero_copy_only=False))
    return pc.cast(pc.if_else(ok, digits, pa.scalar(None, pa.string())), pa.int32()), bad


# -- stages --------------------------------------------------------------------------


class ParseStage(Stage):
    """Parse and validate one chunk per call (joining item titles), writing one shard."""

    name = "ingest-parse"
    resources = Resources(cpus=1)
    batch_size = 1

    def __init__(self, output, chunks: dict[int, Chunk], min_rating: float, max_rating: float,
                 category: str | None, titles: PathLike | None = None, ray_remote_args: dict | None = None):
        """`titles`: a Parquet (item_id, item_title) table every actor reads in `setup`;
        `ray_remote_args`: where the actors may run (`inputs.reads_here`)."""
        self.output, self.chunks = output, chunks
        self.min_rating, self.max_rating, self.category = min_rating, max_rating, category
        self.titles_at = None if titles is None else str(titles)
        self.titles = None
        self.ray_remote_args = ray_remote_args or {}

    def setup(self) -> None:
        if self.titles_at is not None:
            self.titles = read_parquet(self.titles_at)

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            chunk = self.chunks[shard]
            parsed = parse_chunk(chunk)
            reviews, errors = normalise(parsed, self.min_rating, self.max_rating, self.category)
            reviews = join_titles(reviews, self.titles)
            counts = {"in": parsed.records, "out": reviews.num_rows, "errors": errors.num_rows}
            self.output.write_shard(shard, {"reviews": reviews, "errors": errors}, counts)
            rows.append({"shard": shard, **counts})
        return pa.Table.from_pylist(rows)


def join_titles(reviews: pa.Table, titles: pa.Table | None) -> pa.Table:
    """Fill item_title from a (item_id, item_title) table where the review has none."""
    if titles is None or not titles.num_rows or not reviews.num_rows:
        return reviews
    idx = pc.index_in(reviews.column("item_id"), value_set=titles.column("item_id"))
    found = pc.take(titles.column("item_title"), idx)
    return reviews.set_column(reviews.schema.get_field_index("item_title"), "item_title",
                              pc.coalesce(reviews.column("item_title"), found))


def find_duplicates(ids: pa.Table) -> pa.Table:
    """Rows whose review id appeared earlier in (shard, row) order, with that first place.

    Input columns: review_id, source, line, shard, row (in shard, row order). Returns
    shard, row, review_id, source, line, first_source, first_line for every duplicate.
    """
    df = ids.to_pandas()
    dup = df.duplicated("review_id", keep="first").to_numpy()
    if not dup.any():
        return pa.table({"shard": pa.array([], pa.int64()), "row": pa.array([], pa.int64())})
    first = df.loc[~dup, ["review_id", "source", "line"]].rename(
        columns={"source": "first_source", "line": "first_line"})
    dups = df.loc[dup].merge(first, on="review_id", how="left")
    return pa.Table.from_pandas(dups, preserve_index=False)


def drop_duplicates(reviews: pa.Table, errors: pa.Table, dups: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Move a shard's duplicate rows (from `find_duplicates`) into its errors table."""
    if dups is None or not dups.num_rows:
        return reviews, errors
    rows = dups.column("row").to_numpy()
    mask = np.ones(reviews.num_rows, dtype=bool)
    mask[rows] = False
    dup_rows = reviews.take(pa.array(rows)).to_pylist()
    extra = [{"source": x["source"], "line": x["line"], "row_id": x["review_id"],
              "field": None, "error_type": "duplicate",
              "message": f"duplicate review (same user, item and time) of {x['first_source']} "
                         f"line {x['first_line']}",
              "raw": json.dumps({k: r[k] for k in ("user_id", "item_id", "timestamp", "rating", "text")})}
             for x, r in zip(dups.to_pylist(), dup_rows)]
    return (reviews.filter(pa.array(mask)),
            pa.concat_tables([errors, error_rows(STAGE, extra)]))


def find_shard_duplicates(shards: dict[int, PathLike], todo: list[int], out: PathLike) -> dict[int, int]:
    """Find duplicates across all shards and write each shard's to `out`/part-NNNNN.parquet.

    `shards`: every shard's reviews file, by shard number; only the id columns (review_id,
    source, line) are read. `todo`: the shards still to commit; only theirs are written.
    Returns how many duplicates each of them holds. Runs as one Ray task, so the driver
    reads no table.
    """
    ids = []
    for shard in sorted(shards):
        t = read_parquet(shards[shard], columns=["review_id", "source", "line"])
        ids.append(t.append_column("shard", pa.array(np.full(t.num_rows, shard), pa.int64()))
                    .append_column("row", pa.array(np.arange(t.num_rows), pa.int64())))
    dups = find_duplicates(pa.concat_tables(ids)) if ids else None
    found: dict[int, int] = {}
    for shard in todo:
        mine = dups.filter(pc.equal(dups.column("shard"), shard)) if dups is not None and dups.num_rows else None
        found[shard] = 0 if mine is None else mine.num_rows
        if found[shard]:
            write_parquet_atomic(dup_path(out, shard), mine)
    return found


def dup_path(root: PathLike, shard: int) -> Location:
    return location(root) / f"part-{shard:05d}.parquet"


def commit_shard(staged, output, dups: PathLike, shard: int, duplicates: int) -> None:
    """Commit one staged shard to the final output: its files copied as they are (no
    duplicates) or rewritten without its `duplicates` (listed under `dups`), then its
    marker. Only I/O: a plain task, no actor to start."""
    counts = staged.shard_counts(shard)
    if not duplicates:
        for table in ("reviews", "errors"):
            copy_file(staged.shard_path(table, shard), output.shard_path(table, shard))
        output.mark_done(shard, counts)
        return
    reviews, errors = drop_duplicates(read_parquet(staged.shard_path("reviews", shard)),
                                      read_parquet(staged.shard_path("errors", shard)),
                                      read_parquet(dup_path(dups, shard)))
    counts = {**counts, "out": reviews.num_rows, "errors": errors.num_rows}
    output.write_shard(shard, {"reviews": reviews, "errors": errors}, counts)


def copy_file(src: PathLike, dst: PathLike) -> None:
    """Put `src`'s bytes at `dst` whole or not at all: inside one object store the store
    copies it (no bytes through this worker); else read here and written there."""
    src, dst = location(src), location(dst)
    if not dst.is_local and src.fs is dst.fs:
        dst.fs.copy_file(src.path, dst.path)
    else:
        dst.write_bytes(src.read_bytes())
