"""CSV ranges -> raw field columns, with each row's line: pyarrow's reader first, and
a record-by-record reader for a range pyarrow refuses or reads into other records than
the quote-parity record starts (`parse_csv`)."""
from __future__ import annotations

import csv
import io
import sys
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from rexeval.pipelines.ingest.chunks import Chunk
from rexeval.pipelines.ingest.parsed import ParsedChunk, has_lone_surrogate


# -- CSV -----------------------------------------------------------------------------


def parse_csv(data: bytes, chunk: Chunk) -> ParsedChunk:
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
            bad = next((src for src, k in index.items() if has_lone_surrogate(row[k])), None)
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
