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
from rexeval.pipelines.ingest.parse import ParseStage, drop_duplicates, find_duplicates
from rexeval.pipelines.ingest.chunks import plan_chunks
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.ingest.metadata import load_titles
from rexeval.pipelines.core.sharded import ShardedJob


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
    final = ShardedJob(ShardedOutput(root, "ingest", conf, ["reviews", "errors"]), len(chunks),
                       overwrite=overwrite, progress=progress)
    if (manifest := final.finished("ingest")) is not None:
        return manifest
    # Chunks are parsed into a staging output first; duplicates are then judged across
    # all chunks and each chunk is committed to the final output.
    parse = ShardedJob(ShardedOutput(root / "_stage" / "parse", "ingest-parse", conf, ["reviews", "errors"]),
                       len(chunks), overwrite=True, progress=progress, skip=final.done)
    progress(f"ingest: {len(cfg.inputs)} file(s), {len(chunks)} chunk(s) -> {root}")
    if len(parse.todo) < len(chunks):
        progress(f"  resuming: {len(chunks) - len(parse.todo)} of {len(chunks)} chunk(s) already done")
    titles_ref = None
    if cfg.meta and parse.todo:
        import ray

        titles = load_titles(cfg.meta)
        progress(f"  metadata: {titles.num_rows:,} item title(s)")
        titles_ref = ray.put(titles)
    stage = ParseStage(parse.output, {c.shard: c for c in chunks}, cfg.min_rating, cfg.max_rating,
                       cfg.category, titles_ref)
    parse.run(stage, workers=cfg.workers, report=lambda row, k, n: (
        f"  parse: chunk {row['shard']} done ({k}/{n}): in={row['in']} out={row['out']} errors={row['errors']}"))
    parsed, final_done, need = parse.output, final.done, [c for c in chunks if c.shard in final.todo]

    # Duplicates are judged over all shards at once, reading ids and positions only.
    # Finished shards are read from the final output: the duplicates they lost had their
    # first occurrence in the same or an earlier shard, so the decision is unchanged.
    ids = []
    for c in chunks:
        src = final.output if c.shard in final_done else parsed
        t = pq.read_table(src.shard_path("reviews", c.shard), columns=["review_id", "source", "line"])
        ids.append(t.append_column("shard", pa.array(np.full(t.num_rows, c.shard), pa.int64()))
                    .append_column("row", pa.array(np.arange(t.num_rows), pa.int64())))
    dups = find_duplicates(pa.concat_tables(ids)) if ids else None
    for c in need:
        mine = dups.filter(pc.equal(dups.column("shard"), c.shard)) if dups is not None and dups.num_rows else None
        counts = parsed.shard_counts(c.shard)
        if mine is None or not mine.num_rows:
            for table in ("reviews", "errors"):
                _link(parsed.shard_path(table, c.shard), final.output.shard_path(table, c.shard))
            final.output.mark_done(c.shard, counts)
            continue
        reviews, errors = drop_duplicates(pq.read_table(parsed.shard_path("reviews", c.shard)),
                                          pq.read_table(parsed.shard_path("errors", c.shard)), mine)
        counts = {**counts, "out": reviews.num_rows, "errors": errors.num_rows}
        final.output.write_shard(c.shard, {"reviews": reviews, "errors": errors}, counts)
        progress(f"  dedup: chunk {c.shard}: {mine.num_rows} duplicate review(s) moved to errors")

    manifest = final.finish()
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
