"""The ingest job's wiring on Ray (see pipelines.ingest.steps for its three steps).

Every step runs in workers that read the inputs and write the output through the storage
module, so inputs and output may be local paths or URIs: planning (one task per input
file), item titles (one task, staged as a Parquet file the parse actors read), parsing
(an actor pool, one shard per chunk, staged under `_stage/parse/`), finding duplicates
(one task over the id columns) and committing (one task per shard: its files at their
final keys, then its marker). The driver handles plans, markers and counts only. A task
that reads a local input file runs on the driver's node, where that file is
(`runtime.reads_here`).
"""
from __future__ import annotations

import time
from typing import Callable

from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.runtime import reads_here
from rexeval.pipelines.core.io import ShardedOutput, read_parquet, write_parquet_atomic
from rexeval.pipelines.core.sharded import ShardedJob, shard_line
from rexeval.storage import as_text, location
from rexeval.pipelines.ingest.chunks import number_chunks, plan_file
from rexeval.pipelines.ingest.config import INGEST_OUTPUTS, IngestConfig
from rexeval.pipelines.ingest.formats import detect_layout
from rexeval.pipelines.ingest.metadata import load_titles
from rexeval.pipelines.ingest.steps import ParseStage, commit_shard, find_shard_duplicates

TABLES = [INGEST_OUTPUTS.reviews, INGEST_OUTPUTS.errors]


def run_ingest(cfg: IngestConfig, overwrite: bool = False,
               progress: Callable[[str], None] = print) -> dict:
    """Run ingest end to end (resuming finished shards) and return the manifest."""
    from rexeval.pipelines.core.runtime import init_ray

    t0 = time.time()
    for p in cfg.inputs + cfg.meta:
        if not location(p).exists():
            raise FileNotFoundError(f"input file not found: {given_text(p)}")
    init_ray()
    conf = cfg.output_config()
    root = location(cfg.out)
    layouts = [(p, detect_layout(p, cfg.format, cfg.columns)) for p in cfg.inputs]
    chunks = number_chunks(_run_all([(plan_file, [p], (as_text(p), layout, int(cfg.chunk_mb * 1024 * 1024),
                                                       given_text(p))) for p, layout in layouts]))
    final = ShardedJob(ShardedOutput(root, "ingest", conf, TABLES), len(chunks),
                       overwrite=overwrite, progress=progress)
    if (manifest := final.finished("ingest")) is not None:
        return manifest
    # Chunks are parsed into a staging output first; duplicates are then judged across
    # all chunks and each chunk is committed to the final output.
    stage_root = root / "_stage"
    parse = ShardedJob(ShardedOutput(stage_root / "parse", "ingest-parse", conf, TABLES),
                       len(chunks), overwrite=True, progress=progress, skip=final.done)
    progress(f"ingest: {len(cfg.inputs)} file(s), {len(chunks)} chunk(s) -> {given_text(cfg.out)}")
    if len(parse.todo) < len(chunks):
        progress(f"  resuming: {len(chunks) - len(parse.todo)} of {len(chunks)} chunk(s) already done")
    titles = None
    if cfg.meta and parse.todo:
        titles = stage_root / "titles.parquet"
        n = _run_all([(_stage_titles, cfg.meta, ([as_text(m) for m in cfg.meta], titles))])[0]
        progress(f"  metadata: {n:,} item title(s)")
    stage = ParseStage(parse.output, {c.shard: c for c in chunks}, cfg.min_rating, cfg.max_rating,
                       cfg.category, titles, reads_here(c.file() for c in chunks))
    parse.run(stage, workers=cfg.workers, report=lambda row, k, n: shard_line(
        row["shard"], k, n, f"in={row['in']} out={row['out']} errors={row['errors']}", unit="chunk", label="parse"))

    # Duplicates are judged over all shards at once, from their id columns. Finished
    # shards are read from the final output: the duplicates they lost had their first
    # occurrence in the same or an earlier shard, so the decision is unchanged.
    if final.todo:
        staged, done = parse.output, final.done
        shards = {c.shard: (final.output if c.shard in done else staged).shard_path("reviews", c.shard)
                  for c in chunks}
        dups = stage_root / "duplicates"
        found = _run_all([(find_shard_duplicates, [], (shards, final.todo, dups))])[0]
        _run_all([(commit_shard, [], (staged, final.output, dups, s, found[s])) for s in final.todo])
        for shard in sorted(s for s, n in found.items() if n):
            progress(f"  dedup: chunk {shard}: {found[shard]} duplicate review(s) moved to errors")

    manifest = final.finish()
    stage_root.rmtree()
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _stage_titles(meta: list[str], at) -> int:
    """Item titles from the metadata files, staged at `at` for the parse actors (kept from
    an earlier run of the same job); returns how many."""
    at = location(at)
    if not at.exists():
        write_parquet_atomic(at, load_titles(meta))
    return read_parquet(at, columns=["item_id"]).num_rows


def _run_all(calls: list[tuple[Callable, list, tuple]]) -> list:
    """Run each (function, input files it reads, arguments) as one Ray task placed where
    those files can be read (`runtime.reads_here`); their results, in order (small values)."""
    import ray

    remote = {fn: ray.remote(fn) for fn, _, _ in calls}
    placed = {_key(paths): reads_here(paths) for _, paths, _ in calls}
    return ray.get([remote[fn].options(num_cpus=1, **placed[_key(paths)]).remote(*args)
                    for fn, paths, args in calls])


def _key(paths: list) -> tuple[str, ...]:
    return tuple(str(p) for p in paths)
