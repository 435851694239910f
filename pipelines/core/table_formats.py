"""Tables in the formats people keep: Parquet, CSV, TSV and JSON lines, gzipped or not,
local or by URI, and their column names mapped to ours.

A researcher's own system writes its explanations as CSV or JSON lines as often as
Parquet, under its own column names. `table_format` tells the format from the file's name
(`.parquet`, `.csv`, `.tsv`, `.jsonl`/`.ndjson`/`.json`, each optionally `.gz`) and checks
it against the first bytes (Parquet's magic, a JSON object's brace, a JSON array's
bracket), so a mislabelled file is named rather than misread; `read_any` reads it with Arrow's own readers
(pyarrow.csv, pyarrow.json: no parser of ours), and `renamed` maps `ours=theirs` column
names. Schema checks stay with the readers (`io.read_part`, `schema.validate_table`).
"""
from __future__ import annotations

import pyarrow as pa

from rexeval.storage import PathLike, location

FORMATS = ("parquet", "csv", "tsv", "jsonl")
_SUFFIXES = {"parquet": "parquet", "pq": "parquet", "csv": "csv", "tsv": "tsv", "tab": "tsv",
             "jsonl": "jsonl", "ndjson": "jsonl", "json": "jsonl"}
PARQUET_MAGIC = b"PAR1"
JSON_ARRAY = ("holds one JSON array, not JSON lines; rexeval reads one JSON object per line "
              "(`jq -c '.[]'` writes the array's objects so)")
"""What a file of one JSON array of records is told (here, and by ingest's layout detection)."""


class UnknownTableFormat(ValueError):
    """A file whose name or bytes are none of FORMATS, or disagree with each other."""


def _suffix_format(name: str) -> tuple[str | None, bool]:
    name = name.lower()
    gz = name.endswith(".gz")
    stem = name[:-3] if gz else name
    return (_SUFFIXES.get(stem.rpartition(".")[2]) if "." in stem else None), gz


def _head(path: PathLike, gz: bool, n: int = 512) -> bytes:
    """The first `n` bytes of the file's content (decompressed when it is named .gz)."""
    loc = location(path)
    with loc.open_input() as fh:
        try:
            return (pa.CompressedInputStream(fh, "gzip") if gz else fh).read(n)
        except (OSError, pa.ArrowInvalid) as exc:
            raise UnknownTableFormat(f"{path}: named .gz but not gzip ({exc})") from None


def table_format(path: PathLike) -> str:
    """The file's format (one of FORMATS): its name says which, its first bytes must
    agree; a name that says none is told by the bytes (Parquet's magic, a JSON object)."""
    named, gz = _suffix_format(location(path).name)
    head = _head(path, gz)
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if named == "parquet":
        raise UnknownTableFormat(f"{path}: not a readable Parquet file (named .parquet, but its bytes do not "
                                 "start with Parquet's magic number)")
    if text.startswith(b"[") and named in ("jsonl", None):
        # One JSON array of records (pandas' `to_json(orient="records")`): Arrow reads JSON
        # lines only, so say how to get them rather than misread it.
        raise UnknownTableFormat(f"{path}: {JSON_ARRAY}")
    if named == "jsonl" or (named is None and text.startswith(b"{")):
        if text and not text.startswith(b"{"):
            raise UnknownTableFormat(f"{path}: named as JSON lines but its first line is not a JSON object")
        return "jsonl"
    if named in ("csv", "tsv"):
        if text.startswith(b'{"'):  # no header of ours starts so: JSON lines under a CSV name
            raise UnknownTableFormat(f"{path}: named .{named} but holds JSON lines (its first line is a JSON "
                                     "object); name it .jsonl")
        return named
    raise UnknownTableFormat(f"{path}: not a table in a format rexeval reads ({', '.join(FORMATS)}, "
                             "optionally .gz); name it by its format, e.g. explanations.csv")


def _parse_options(fmt: str):
    import pyarrow.csv as pcsv

    return pcsv.ParseOptions(delimiter="," if fmt == "csv" else "\t", newlines_in_values=True)


def _typed(table: pa.Table, types: dict[str, pa.DataType] | None) -> pa.Table:
    """A JSON table's columns named in `types` cast to text where `types` says so (an id
    written as a number reads as its digits)."""
    for name, typ in (types or {}).items():
        i = table.schema.get_field_index(name)
        if i >= 0 and not table.schema.field(i).type.equals(typ) and pa.types.is_string(typ):
            table = table.set_column(i, name, table.column(i).cast(typ))
    return table


def read_any(path: PathLike, fmt: str, types: dict[str, pa.DataType] | None = None,
             text: bool = False) -> pa.Table:
    """A CSV, TSV or JSON-lines file (gzipped or not) as an Arrow table. `types` fixes
    the columns named there (ids stay strings: "007" is not 7); others are inferred.
    `text`: every CSV or TSV column as text, as written (for readers that judge each
    value themselves); JSON values keep their JSON types."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    if fmt not in ("csv", "tsv", "jsonl"):
        raise UnknownTableFormat(f"{path}: format {fmt!r} is none of {', '.join(FORMATS)}")
    if text and fmt != "jsonl":
        types = {**{n: pa.string() for n in read_head(path, fmt).column_names}, **(types or {})}
    loc = location(path)
    _, gz = _suffix_format(loc.name)
    with loc.open_input() as fh:
        stream = pa.CompressedInputStream(fh, "gzip") if gz else fh
        if fmt == "jsonl":
            return _typed(pjson.read_json(stream), types)
        return pcsv.read_csv(stream, parse_options=_parse_options(fmt),
                             convert_options=pcsv.ConvertOptions(column_types=types or {}))


def read_head(path: PathLike, fmt: str, types: dict[str, pa.DataType] | None = None) -> pa.Table:
    """The first block of rows of a CSV, TSV or JSON-lines file (Arrow's streaming
    readers), typed as `read_any` types them: its columns, read without reading the
    whole file (a driver checks a table so before tasks read it)."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    if fmt not in ("csv", "tsv", "jsonl"):
        raise UnknownTableFormat(f"{path}: format {fmt!r} is none of {', '.join(FORMATS)}")
    loc = location(path)
    _, gz = _suffix_format(loc.name)
    with loc.open_input() as fh:
        stream = pa.CompressedInputStream(fh, "gzip") if gz else fh
        if fmt == "jsonl":
            if not hasattr(pjson, "open_json"):  # pyarrow < 19: no streaming JSON reader
                return _typed(pjson.read_json(stream), types)
            reader = pjson.open_json(stream)
        else:
            reader = pcsv.open_csv(stream, parse_options=_parse_options(fmt),
                                   convert_options=pcsv.ConvertOptions(column_types=types or {}))
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return _typed(reader.schema.empty_table(), types)
        return _typed(pa.Table.from_batches([batch]), types)


def count_rows(path: PathLike, fmt: str) -> int:
    """Rows of a CSV, TSV or JSON-lines file (gzipped or not), read block by block with
    Arrow's streaming readers, never held whole (every CSV column read as text, so a
    later block cannot disagree with the first's types)."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    if fmt not in ("csv", "tsv", "jsonl"):
        raise UnknownTableFormat(f"{path}: format {fmt!r} is none of {', '.join(FORMATS)}")
    names = [] if fmt == "jsonl" else read_head(path, fmt, None).column_names
    loc = location(path)
    _, gz = _suffix_format(loc.name)
    with loc.open_input() as fh:
        stream = pa.CompressedInputStream(fh, "gzip") if gz else fh
        if fmt == "jsonl":
            if not hasattr(pjson, "open_json"):
                return pjson.read_json(stream).num_rows
            reader = pjson.open_json(stream)
        else:
            if not names:
                return 0
            reader = pcsv.open_csv(stream, parse_options=_parse_options(fmt), convert_options=pcsv.ConvertOptions(
                column_types={names[0]: pa.string()}, include_columns=names[:1]))
        return sum(batch.num_rows for batch in reader)


def renamed(table: pa.Table, columns: dict[str, str] | None) -> pa.Table:
    """`table` with each of its columns named in `columns` (ours -> theirs) renamed to ours."""
    if not columns:
        return table
    back = {theirs: ours for ours, theirs in columns.items()}
    return table.rename_columns([back.get(c, c) for c in table.column_names])


def their_types(schema: pa.Schema, columns: dict[str, str] | None) -> dict[str, pa.DataType]:
    """Our schema's types under the file's own column names (for `read_any`)."""
    columns = columns or {}
    return {columns.get(f.name, f.name): f.type for f in schema}


def parse_columns(items: list[str] | tuple[str, ...] | str | None) -> dict[str, str]:
    """`--columns example_id=id,explanation=text` (repeatable or comma-separated) as
    {ours: theirs}; a malformed item is a ValueError naming it."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    out: dict[str, str] = {}
    for item in (p for it in items for p in it.split(",") if p.strip()):
        ours, sep, theirs = item.partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise ValueError(f"--columns {item!r}: write OURS=THEIRS, e.g. explanation=text")
        out[ours.strip()] = theirs.strip()
    return out
