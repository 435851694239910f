"""The split job: reviews -> optional k-core -> train/valid/test, written with a manifest.

Input and output may be local paths or URIs (read and written through the storage module).
"""
from __future__ import annotations

import time
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from rexeval.pipelines.ingest.config import SPLIT_OUTPUTS, SplitConfig
from rexeval.pipelines.core.inputs import given_text, reviews_path
from rexeval.pipelines.core.io import ShardedOutput, read_table, table_files
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.storage import Location, PathLike, location
from rexeval.pipelines.ingest.split import kcore, leave_last_two, temporal_split

EXPECTED = "an `rexeval ingest` output folder (with reviews/) or a reviews Parquet file or folder of parts"


def table_rows(files: list[Location]) -> int | None:
    """Rows of a table's Parquet parts from their footers (no data read); None when a
    part is unreadable, which reading the table then reports with its file."""
    total = 0
    for f in files:
        try:
            with f.open_input() as fh:
                total += pq.read_metadata(fh).num_rows
        except (pa.ArrowInvalid, OSError):
            return None
    return total


def reviews_input(path: PathLike) -> Location:
    """The reviews table `path` names (an ingest folder's reviews/, or the table itself),
    refused when it holds no review: a split or a statistics table of nothing would
    look like a result. Raises FileNotFoundError (no table there) or ValueError (no rows)."""
    src = reviews_path(path)
    files = table_files(src)
    if not files:
        raise FileNotFoundError(f"{given_text(path)} holds no reviews table (no *.parquet files): "
                                f"expected {EXPECTED}")
    if table_rows(files) == 0:
        errors = location(path) / "errors"
        if src != location(path) and errors.is_dir():
            bad = table_rows(table_files(errors))
            raise ValueError(f"{given_text(path)}: the ingest kept no reviews (reviews/ has 0 rows"
                             + (f", errors/ has {bad:,}" if bad else "") + f"); see {errors} for why each "
                             "row was refused, fix the input or the ingest settings and ingest again")
        raise ValueError(f"{given_text(src)}: the reviews table has 0 rows; expected {EXPECTED} with reviews")
    return src


def run_split(cfg: SplitConfig, overwrite: bool = False,
              progress: Callable[[str], None] = print) -> dict:
    t0 = time.time()
    source = reviews_input(cfg.input)  # before the output folder is made
    # Read (and so validated) before the output is opened: --overwrite removes an earlier
    # split only once this one can be made. (The settings' hash reads the files anyway.)
    reviews = read_table(source, "reviews")
    tables = [SPLIT_OUTPUTS.train, SPLIT_OUTPUTS.valid, SPLIT_OUTPUTS.test]
    job = ShardedJob(ShardedOutput(cfg.out, "split", cfg.output_config(), tables), 1,
                     overwrite=overwrite, progress=progress)
    if not job.todo:
        progress(f"split: {cfg.out} is already complete for these settings")
        return job.finish()
    progress(f"split: {reviews.num_rows:,} reviews, method {cfg.method}")
    counts: dict[str, int] = {"reviews_in": reviews.num_rows}
    if cfg.kcore_user > 1 or cfg.kcore_item > 1:
        reviews, info = kcore(reviews, cfg.kcore_user, cfg.kcore_item)
        counts["dropped_kcore"] = counts["reviews_in"] - reviews.num_rows
        progress(f"  k-core ({cfg.kcore_user}, {cfg.kcore_item}): {info.get('rounds', 0)} round(s), "
                 f"{counts['dropped_kcore']:,} rows dropped")
    if cfg.method == "temporal":
        res = temporal_split(reviews, cfg.train, cfg.valid,
                             5 if cfg.min_interactions is None else cfg.min_interactions,
                             True if cfg.drop_cold_start_items is None else cfg.drop_cold_start_items)
    else:
        res = leave_last_two(reviews, 3 if cfg.min_interactions is None else cfg.min_interactions,
                             bool(cfg.drop_cold_start_items))
    counts.update({k: v for k, v in res.counts.items() if k != "input"})
    warnings = []
    if not sum(t.num_rows for t in res.as_dict().values()):
        warnings.append(f"the split kept none of the {counts['reviews_in']:,} reviews: every user has fewer "
                        f"than the reviews the settings need (min_interactions, k-core); see the manifest's "
                        "counts for what dropped them")
        progress(f"  warning: {warnings[-1]}")
    job.output.write_shard(0, res.as_dict(), counts)
    manifest = job.finish(counts=counts, **({"warnings": warnings} if warnings else {}))
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest

