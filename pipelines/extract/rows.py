"""A table's rows read where they are used: by position or by review, from any node.

A sharded job must not hand its whole input to its workers through the driver (a
`ray.put` of the table would hold all of it in the driver and the object store). The
driver reads only the Parquet footers (how many rows each part holds) and gives each
worker that small description; the worker reads the rows of its own shard from the
parts, local or by URI, reading only the row groups that hold them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rexeval.pipelines.core.io import table_files
from rexeval.pipelines.core.schema import TABLES, SchemaError, validate_table
from rexeval.storage import PathLike, location


def _footer(path: str) -> pq.FileMetaData:
    with location(path).open_input() as fh:
        return pq.ParquetFile(fh).metadata


@dataclass(frozen=True)
class TableParts:
    """The Parquet parts of a table (their text paths) and the rows each holds; small
    enough to ship to every worker."""

    table: str  # its schema's name (pipelines.core.schema.TABLES)
    files: tuple[str, ...]
    rows: tuple[int, ...]

    @classmethod
    def of(cls, path: PathLike, table: str) -> "TableParts":
        """The parts of the table at `path` (a file or a folder of parts), from their
        footers only; a part whose columns do not fit the schema raises SchemaError."""
        files, rows = [], []
        for f in table_files(path):
            try:
                meta = _footer(str(f))
            except (pa.ArrowInvalid, OSError) as exc:
                raise SchemaError(table, str(f), None, None, f"not a readable Parquet file: {exc}") from None
            validate_table(meta.schema.to_arrow_schema().empty_table(), table, source=str(f))
            files.append(str(f))
            rows.append(meta.num_rows)
        return cls(table, tuple(files), tuple(rows))

    @property
    def num_rows(self) -> int:
        return sum(self.rows)

    def _read(self, path: str, lo: int, hi: int) -> pa.Table:
        """Rows [lo, hi) of one part, reading only the row groups that hold them,
        validated against the schema (an error names the row within the part)."""
        with location(path).open_input() as fh:
            pf = pq.ParquetFile(fh)
            groups, first, start = [], None, 0
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if start < hi and start + n > lo:
                    groups.append(g)
                    first = start if first is None else first
                start += n
            part = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
        part = part.slice(lo - (first or 0), hi - lo)
        try:
            return validate_table(part, self.table, source=path)
        except SchemaError as exc:
            raise dataclasses.replace(exc, row=None if exc.row is None else exc.row + lo) from None

    def read(self, start: int, stop: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows [start, stop) of the whole table (its parts in order)."""
        out, offset = [], 0
        for path, n in zip(self.files, self.rows):
            lo, hi = max(start, offset), min(stop, offset + n)
            if lo < hi:
                out.append(self._read(path, lo - offset, hi - offset))
            offset += n
        table = pa.concat_tables(out) if out else TABLES[self.table].empty_table()
        return table.select(list(columns)) if columns is not None else table

    def read_where(self, column: str, values: Sequence, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows whose `column` is one of `values`, in the table's order (each part
        filtered as it is read)."""
        want = pa.array(list(values), TABLES[self.table].field(column).type)
        out = []
        for path in self.files:
            loc = location(path)
            part = pq.read_table(loc.path, filesystem=loc.fs, filters=pc.field(column).isin(want))
            out.append(validate_table(part, self.table, source=path))
        table = pa.concat_tables(out) if out else TABLES[self.table].empty_table()
        return table.select(list(columns)) if columns is not None else table
