"""Ingest's plan: input files cut into parse tasks of about a given size.

Each task is a byte range that starts and ends on a record boundary (quote-aware for
CSV, so a newline inside a quoted review does not cut it), with the line it starts on,
so every parsed row keeps its file and line. A gzip file is one task; a Parquet file is
cut by row groups.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from rexeval.pipelines.ingest.formats import Layout, is_gzip, open_bytes



@dataclass(frozen=True)
class Chunk:
    """One parse task: a byte range of a file and the line it starts on."""

    shard: int
    path: str
    layout: Layout
    start: int
    end: int  # -1: to the end (gzip, parquet)
    first_line: int
    row_groups: tuple[int, ...] = ()



def plan_chunks(files: list[tuple[str, Layout]], chunk_bytes: int) -> list[Chunk]:
    """Cut inputs into parse tasks of about `chunk_bytes` each."""
    chunks: list[Chunk] = []
    for path, layout in files:
        p = Path(path)
        if layout.format == "parquet":
            meta = pq.ParquetFile(p).metadata
            groups, size, first = [], 0, 1
            line = 1
            for g in range(meta.num_row_groups):
                groups.append(g)
                size += meta.row_group(g).total_byte_size
                if size >= chunk_bytes or g == meta.num_row_groups - 1:
                    chunks.append(Chunk(len(chunks), str(p), layout, 0, -1, first, tuple(groups)))
                    line += sum(meta.row_group(x).num_rows for x in groups)
                    first, groups, size = line, [], 0
            continue
        if is_gzip(p):
            chunks.append(Chunk(len(chunks), str(p), layout, 0, -1, 1))
            continue
        for start, end, first in _byte_ranges(p, chunk_bytes, quote_aware=layout.format == "csv"):
            chunks.append(Chunk(len(chunks), str(p), layout, start, end, first))
    return chunks



def _byte_ranges(path: Path, chunk_bytes: int, quote_aware: bool):
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        start, line, quotes = 0, 1, 0
        while start < size:
            end = min(size, start + max(1, chunk_bytes))
            if end < size:
                # Move to the end of a line; for CSV, to a line end outside any quoted
                # field (an even number of quote characters since the file began).
                q = quotes + (mm[start:end].count(b'"') if quote_aware else 0)
                while end < size:
                    nl = mm.find(b"\n", end)
                    if nl < 0:
                        end = size
                        break
                    if quote_aware:
                        q += mm[end:nl + 1].count(b'"')
                    end = nl + 1
                    if not quote_aware or q % 2 == 0:
                        break
                quotes = q
            yield start, end, line
            line += mm[start:end].count(b"\n")
            start = end



def read_chunk_bytes(chunk: Chunk) -> bytes:
    if chunk.end < 0:
        with open_bytes(Path(chunk.path)) as fh:
            return fh.read()
    with open(chunk.path, "rb") as fh:
        fh.seek(chunk.start)
        return fh.read(chunk.end - chunk.start)
