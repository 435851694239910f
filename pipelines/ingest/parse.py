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
"""
from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from rexeval.pipelines.ingest.formats import REQUIRED_FIELDS, parse_record
from rexeval.pipelines.core.ids import review_ids
from rexeval.pipelines.ingest.chunks import Chunk, read_chunk_bytes
from rexeval.pipelines.core.io import read_parquet, write_parquet_atomic
from rexeval.pipelines.core.schema import REVIEWS, error_rows
from rexeval.pipelines.core.stage import Resources, Stage
from rexeval.pipelines.core.storage import Location, PathLike, location

STAGE = "ingest"
_NUMBER = r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$"
_INTEGER = r"^\s*\d+(\.0*)?\s*$"
# Timestamps above this are milliseconds (the 2023 dump); seconds stay below it until 5138.
_MS_THRESHOLD = 100_000_000_000


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

    def error(self, line: int | None, error_type: str, message: str, raw: str | None = None,
              field: str | None = None) -> None:
        self.errors.append({"source": self.source, "line": line, "field": field,
                            "error_type": error_type, "message": message, "raw": raw})


def parse_chunk(chunk: Chunk, data: bytes | None = None) -> ParsedChunk:
    """Parse one task's bytes into raw string columns, per its layout."""
    layout = chunk.layout
    if layout.format == "parquet":
        return _parse_parquet(chunk)
    if data is None:
        data = read_chunk_bytes(chunk)
    if layout.format == "csv":
        return _parse_csv(data, chunk)
    return _parse_jsonl(data, chunk)


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
        try:
            obj = parse_record(text)
        except ValueError as exc:
            out.error(line, "invalid_json", str(exc), text)
            continue
        if not isinstance(obj, dict):
            out.error(line, "invalid_record", f"expected an object, got {type(obj).__name__}", text)
            continue
        for f, src in fields.items():
            values[f].append(_pick(obj, src))
        lines.append(line)
        raws.append(text)
    out.columns = {f: _to_string_array(v) for f, v in values.items()}
    out.lines = np.asarray(lines, dtype=np.int64)
    out.raw = raws
    return out


def _pick(obj: dict, src):
    if isinstance(src, tuple):
        for s in src:
            if obj.get(s) is not None:
                return obj[s]
        return None
    return obj.get(src)


def _to_string_array(values: list) -> pa.Array:
    out = []
    for v in values:
        if v is None or isinstance(v, str):
            out.append(v)
        elif isinstance(v, (list, tuple)):  # "helpful": [votes, total]
            out.append(str(v[0]) if v else None)
        elif isinstance(v, float) and v.is_integer():
            out.append(str(int(v)) if abs(v) > 1e6 else str(v))
        else:
            out.append(str(v))
    return pa.array(out, type=pa.string())


def _parse_csv(data: bytes, chunk: Chunk) -> ParsedChunk:
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
    try:
        table = pacsv.read_csv(
            io.BytesIO(data_view),
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False,
                                           block_size=max(1 << 20, len(data_view) + 1)),
            parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.binary() for n in names},
                                                 include_columns=[n for n in names if n in wanted],
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except pa.ArrowInvalid as exc:  # e.g. an unterminated quote at the end of the file
        for line, s, e in zip(rec_lines, rec_starts, rec_ends):
            out.error(int(line), "invalid_csv", f"CSV parse failed for this block: {exc}",
                      data[int(s):int(e)].decode("utf-8", "replace").rstrip("\r\n"))
        return out
    valid = np.ones(len(rec_lines), dtype=bool)
    for row in bad:
        k = row.number - 1  # 1-based among non-empty records of what we parsed
        valid[k] = False
        out.error(int(rec_lines[k]), "invalid_csv",
                  f"expected {row.expected_columns} fields, found {row.actual_columns}",
                  row.text)
    lines = rec_lines[valid]
    if table.num_rows != len(lines):
        raise RuntimeError(f"{chunk.path}: CSV record count mismatch in lines "
                           f"{chunk.first_line}..; please report this file")
    raw_bounds = np.stack([rec_starts[valid] - base, rec_ends[valid] - base], axis=1)
    table, lines, raw_bounds = _drop_bad_utf8(table, lines, raw_bounds, data_view, out)
    out.columns = {f: table.column(src).combine_chunks() if src in table.column_names else pa.nulls(table.num_rows, pa.string())
                   for f, src in layout.fields.items()}
    out.lines = lines
    out.raw = _LazyRaw(data_view, raw_bounds)
    return out


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
    col = col.combine_chunks()
    if pa.types.is_timestamp(col.type):
        col = pc.cast(col.cast(pa.timestamp("s")), pa.int64())
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
    problem, in the order: missing required field, empty text, bad rating, rating out
    of range, bad timestamp.
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

    rating_ok = pc.fill_null(pc.match_substring_regex(cols["rating"], _NUMBER), False).to_numpy(zero_copy_only=False)
    flag(~rating_ok, "rating", "rating is not a number")
    rating = pc.cast(pc.if_else(pa.array(rating_ok), pc.utf8_trim_whitespace(cols["rating"]), "0"), pa.float64())
    r = rating.to_numpy(zero_copy_only=False)
    flag((r < min_rating) | (r > max_rating) | np.isnan(r), "rating",
         f"rating out of range [{min_rating:g}, {max_rating:g}]")

    ts_int = pc.fill_null(pc.match_substring_regex(cols["timestamp"], _INTEGER), False).to_numpy(zero_copy_only=False)
    ts = np.zeros(n, dtype=np.int64)
    if ts_int.any():
        digits = pc.utf8_trim_whitespace(pc.replace_substring_regex(cols["timestamp"], r"\.0*\s*$", ""))
        parsed_ts = pc.cast(pc.if_else(pa.array(ts_int), digits, "0"), pa.int64()).to_numpy(zero_copy_only=False)
        ts = np.where(ts_int, parsed_ts, 0)
        ts = np.where(ts >= _MS_THRESHOLD, ts // 1000, ts)
    other = ~ts_int & (problem == None)  # noqa: E711
    if other.any():  # dates as text: the rare path, parsed row by row
        import pandas as pd

        idx = np.flatnonzero(other)
        raw_ts = pc.take(cols["timestamp"], pa.array(idx)).to_pylist()
        dt = pd.to_datetime(pd.Series(raw_ts, dtype=object), errors="coerce", utc=True, format="mixed")
        ok = dt.notna().to_numpy()
        if ok.any():  # whole seconds, whatever resolution pandas picked
            ts[idx[ok]] = ((dt[ok] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)).to_numpy()
        bad = np.zeros(n, bool)
        bad[idx[~ok]] = True
        flag(bad, "timestamp", "timestamp is neither epoch seconds/milliseconds nor a date")

    good = problem == None  # noqa: E711
    err_idx = np.flatnonzero(~good)
    errors = [{"source": parsed.source, "line": int(parsed.lines[i]), "field": field_of[i],
               "error_type": "invalid_field", "message": problem[i],
               "raw": parsed.raw[int(i)] if parsed.raw is not None else None} for i in err_idx]
    errors = parsed.errors + errors

    keep = pa.array(good)
    g = {f: pc.filter(c, keep) for f, c in cols.items() if c is not None}
    m = int(good.sum())
    users, items = g["user_id"], g["item_id"]
    ts_g = ts[good]
    helpful = g.get("helpful_votes")
    if helpful is not None:
        # "12", "1,234" (2018 "vote") or "[12, 15]" (2014 "helpful": votes, total).
        first = pc.struct_field(pc.extract_regex(helpful, r"^\s*\[?\s*(?P<n>\d[\d,]{0,11})"), [0])
        digits = pc.replace_substring(first, ",", "")
        ok = pc.fill_null(pc.match_substring_regex(digits, r"^\d{1,9}$"), False)
        helpful = pc.cast(pc.if_else(ok, digits, pa.scalar(None, pa.string())), pa.int32())
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
        "helpful_votes": helpful if helpful is not None else pa.nulls(m, pa.int32()),
        "source": pa.array([parsed.source] * m, pa.string()),
        "line": pa.array(parsed.lines[good], pa.int64()),
    })
    return reviews.cast(REVIEWS), error_rows(STAGE, errors)


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
