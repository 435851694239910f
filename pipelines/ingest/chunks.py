"""Ingest's plan: input files cut into parse tasks of about a given size.

Each task is a byte range that starts and ends on a record boundary (quote-aware for
CSV, so a newline inside a quoted review does not cut it), with the line it starts on,
so every parsed row keeps its file and line. A gzip file is one task; a Parquet file is
cut by row groups. Files are read through the storage module (a local path or a URI),
in ranges, so planning a file on an object store never holds more than a task's bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow.parquet as pq

from rexeval.pipelines.core.inputs import given_text
from rexeval.storage import Location, PathLike, location
from rexeval.pipelines.ingest.formats import READ_BLOCK, Layout, gunzip, is_gzip



@dataclass(frozen=True)
class Chunk:
    """One parse task: a byte range of a file and the line it starts on.

    `path` is the file as the user named it (what rows record as their source); `where`
    is where to read it (an absolute path or a URI: a worker's working folder is not the
    driver's)."""

    shard: int
    path: str
    layout: Layout
    start: int
    end: int  # -1: to the end (gzip, parquet)
    first_line: int
    row_groups: tuple[int, ...] = ()
    where: str = ""

    def file(self) -> Location:
        """Where this task's bytes are read from."""
        return location(self.where or self.path)



def plan_chunks(files: list[tuple[str, Layout]], chunk_bytes: int) -> list[Chunk]:
    """Cut inputs into parse tasks of about `chunk_bytes` each, numbered in file order."""
    return number_chunks([plan_file(path, layout, chunk_bytes) for path, layout in files])


def number_chunks(per_file: list[list[Chunk]]) -> list[Chunk]:
    """The chunks of every file (each file's planned alone) numbered 0.. in file order."""
    chunks = [c for planned in per_file for c in planned]
    return [replace(c, shard=i) for i, c in enumerate(chunks)]


def plan_file(path: PathLike, layout: Layout, chunk_bytes: int, source: str | None = None) -> list[Chunk]:
    """One file's parse tasks (numbered from 0; `number_chunks` numbers them for good).
    A text file is read once, whole, in ranges: a job plans it where it can read it.
    `source`: the name rows record (default: `path` as given)."""
    p = location(path)
    source, where = source or given_text(path), str(p)
    chunks: list[Chunk] = []
    if layout.format == "parquet":
        with p.open_input() as fh:
            meta = pq.ParquetFile(fh).metadata
        groups, size, first = [], 0, 1
        line = 1
        for g in range(meta.num_row_groups):
            groups.append(g)
            size += meta.row_group(g).total_byte_size
            if size >= chunk_bytes or g == meta.num_row_groups - 1:
                chunks.append(Chunk(len(chunks), source, layout, 0, -1, first, tuple(groups), where))
                line += sum(meta.row_group(x).num_rows for x in groups)
                first, groups, size = line, [], 0
        return chunks
    if is_gzip(p):
        return [Chunk(0, source, layout, 0, -1, 1, (), where)]
    for start, end, first in _byte_ranges(p, chunk_bytes, quote_aware=layout.format == "csv"):
        chunks.append(Chunk(len(chunks), source, layout, start, end, first, (), where))
    return chunks



def _byte_ranges(path: PathLike, chunk_bytes: int, quote_aware: bool):
    """(start, end, first line) of each range: about `chunk_bytes`, then on to the end of
    a line; for CSV, to a line end outside any quoted field (an even number of quote
    characters since the file began)."""
    with location(path).open_input() as fh:
        size = fh.size()
        start, line, quotes = 0, 1, 0
        while start < size:
            end = min(size, start + max(1, chunk_bytes))
            body = fh.read_at(end - start, start)
            q = quotes + (body.count(b'"') if quote_aware else 0)
            lines = body.count(b"\n")
            if end < size:
                end, q, more = _to_record_end(fh, size, end, q, quote_aware)
                lines += more
                quotes = q
            yield start, end, line
            line += lines
            start = end


QUOTE_SCAN_BYTES = 16 << 20
"""How far past a range's end planning looks for a line end outside quotes. One stray
quote (`5" speaker`) leaves the count odd for the rest of the file, which would make
the rest of a 10 GB file one range; past this many bytes (no review is that long) the
range ends at the next line end and the count starts even again. The parser reads a
range with an odd count record by record, so the stray quote costs its own row."""


def _to_record_end(fh, size: int, end: int, quotes: int, quote_aware: bool) -> tuple[int, int, int]:
    """From `end`, the position just past the next line end that closes a record, the
    quote count there, and the newlines passed on the way (reading forward in blocks)."""
    newlines, pos = 0, end
    while pos < size:
        block = fh.read_at(min(READ_BLOCK, size - pos), pos)
        i = 0
        while True:
            nl = block.find(b"\n", i)
            if nl < 0:
                if quote_aware:
                    quotes += block.count(b'"', i)
                break
            if quote_aware:
                quotes += block.count(b'"', i, nl + 1)
            newlines += 1
            i = nl + 1
            if not quote_aware or quotes % 2 == 0:
                return pos + i, quotes, newlines
            if pos + i - end > QUOTE_SCAN_BYTES:
                return pos + i, 0, newlines
        pos += len(block)
    return size, quotes, newlines



def read_chunk(chunk: Chunk) -> tuple[bytes, str | None]:
    """A task's bytes (a whole gzip file decompressed), local or by URI, and why reading
    stopped early (a truncated or damaged gzip file), or None: the bytes read before a
    fault are kept, so a cut download loses its tail, not its rows."""
    if chunk.end < 0:
        loc = chunk.file()
        with loc.fs.open_input_stream(loc.path, compression=None, buffer_size=READ_BLOCK) as raw:
            return gunzip(raw)
    with chunk.file().open_input() as fh:
        return fh.read_at(chunk.end - chunk.start, chunk.start), None

