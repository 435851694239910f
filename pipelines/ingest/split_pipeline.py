"""The split job: reviews -> optional k-core -> train/valid/test, written with a manifest.

Input and output may be local paths or URIs (read and written through the storage module).
"""
from __future__ import annotations

import time
from typing import Callable

from rexeval.pipelines.ingest.config import SPLIT_OUTPUTS, SplitConfig
from rexeval.pipelines.core.inputs import reviews_input
from rexeval.pipelines.core.io import ShardedOutput, read_table
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.ingest.split import kcore, leave_last_two, temporal_split


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

