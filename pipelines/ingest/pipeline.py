"""The ingest job's configuration and its wiring on Ray Data (see pipelines.ingest.parse)."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from typing import Callable

import pyarrow as pa

from rexeval.pipelines.ingest.config import IngestConfig
from rexeval.pipelines.ingest.formats import detect_layout
from rexeval.pipelines.ingest.parse import ParseStage, drop_duplicates, find_duplicates, plan_chunks
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.ingest.metadata import load_titles
from rexeval.pipelines.core.runtime import run_tasks


def run_ingest(cfg: IngestConfig, overwrite: bool = False,
               progress: Callable[[str], None] = print) -> dict:
    """Run ingest end to end (resuming finished shards) and return the manifest."""
    t0 = time.time()
    for p in cfg.inputs + cfg.meta:
        if not Path(p).exists():
            raise FileNotFoundError(f"input file not found: {p}")
    layouts = [(p, detect_layout(p, cfg.format, cfg.columns)) for p in cfg.inputs]
    chunks = plan_chunks(layouts, int(cfg.chunk_mb * 1024 * 1024))
    conf = cfg.output_config()
    root = Path(cfg.out)
    final = ShardedOutput(root, "ingest", conf, ["reviews", "errors"])
    final.open(overwrite=overwrite)
    manifest = final.read_manifest()
    if manifest and manifest.get("status") == "complete":
        progress(f"ingest: {root} is already complete for these settings")
        return manifest
    stage_dir = root / "_stage" / "parse"
    parsed = ShardedOutput(stage_dir, "ingest-parse", conf, ["reviews", "errors"]).open(overwrite=True)
    progress(f"ingest: {len(cfg.inputs)} file(s), {len(chunks)} chunk(s) -> {root}")

    final_done = final.done_shards()
    need = [c for c in chunks if c.shard not in final_done]
    parsed_done = parsed.done_shards()
    todo = [{"shard": c.shard} for c in need if c.shard not in parsed_done]
    if len(todo) < len(chunks):
        progress(f"  resuming: {len(chunks) - len(todo)} of {len(chunks)} chunk(s) already done")
    titles_ref = None
    if cfg.meta and todo:
        import ray

        titles = load_titles(cfg.meta)
        progress(f"  metadata: {titles.num_rows:,} item title(s)")
        titles_ref = ray.put(titles)
    stage = ParseStage(parsed, {c.shard: c for c in chunks}, cfg.min_rating, cfg.max_rating,
                       cfg.category, titles_ref)
    n = 0
    for row in run_tasks(todo, stage, cfg.workers):
        n += 1
        progress(f"  parse: chunk {row['shard']} done ({n}/{len(todo)}): in={row['in']} "
                 f"out={row['out']} errors={row['errors']}")

    # Duplicates are judged over all shards at once, reading ids and positions only.
    # Finished shards are read from the final output: the duplicates they lost had their
    # first occurrence in the same or an earlier shard, so the decision is unchanged.
    ids = []
    for c in chunks:
        src = final if c.shard in final_done else parsed
        t = pq.read_table(src.shard_path("reviews", c.shard), columns=["review_id", "source", "line"])
        ids.append(t.append_column("shard", pa.array(np.full(t.num_rows, c.shard), pa.int64()))
                    .append_column("row", pa.array(np.arange(t.num_rows), pa.int64())))
    dups = find_duplicates(pa.concat_tables(ids)) if ids else None
    for c in need:
        mine = dups.filter(pc.equal(dups.column("shard"), c.shard)) if dups is not None and dups.num_rows else None
        counts = parsed.shard_counts(c.shard)
        if mine is None or not mine.num_rows:
            for table in ("reviews", "errors"):
                _link(parsed.shard_path(table, c.shard), final.shard_path(table, c.shard))
            final.mark_done(c.shard, counts)
            continue
        reviews, errors = drop_duplicates(pq.read_table(parsed.shard_path("reviews", c.shard)),
                                          pq.read_table(parsed.shard_path("errors", c.shard)), mine)
        counts = {**counts, "out": reviews.num_rows, "errors": errors.num_rows}
        final.write_shard(c.shard, {"reviews": reviews, "errors": errors}, counts)
        progress(f"  dedup: chunk {c.shard}: {mine.num_rows} duplicate review(s) moved to errors")

    manifest = final.finish(len(chunks))
    shutil.rmtree(root / "_stage", ignore_errors=True)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _link(src: Path, dst: Path) -> None:
    """Place a finished file at `dst` without copying it (hard link; copy if impossible)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
