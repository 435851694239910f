"""Ingest's steps: review files of any supported layout -> validated REVIEWS shards + errors.

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

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.io import read_parquet, write_parquet_atomic
from rexeval.pipelines.core.schema import error_rows
from rexeval.pipelines.core.stage import Resources, Stage
from rexeval.storage import Location, PathLike, location
from rexeval.pipelines.ingest.chunks import Chunk
from rexeval.pipelines.ingest.parse import parse_chunk
from rexeval.pipelines.ingest.parsed import STAGE
from rexeval.pipelines.ingest.validate import normalise


# -- stages --------------------------------------------------------------------------


class ParseStage(Stage):
    """Parse and validate one chunk per call (joining item titles), writing one shard."""

    name = "ingest-parse"
    resources = Resources(cpus=1)
    batch_size = 1

    def __init__(self, output, chunks: dict[int, Chunk], min_rating: float, max_rating: float,
                 category: str | None, titles: PathLike | None = None, ray_remote_args: dict | None = None):
        """`titles`: a Parquet (item_id, item_title) table every actor reads in `setup`;
        `ray_remote_args`: where the actors may run (`runtime.reads_here`)."""
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
