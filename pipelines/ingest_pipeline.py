"""The ingest job's configuration and its wiring on Ray Data (see pipelines.ingest)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipelines.formats import FORMATS, detect_layout, parse_columns
from pipelines.ingest import FinaliseStage, ParseStage, find_duplicates, plan_chunks
from pipelines.io import ShardedOutput
from pipelines.metadata import load_titles
from pipelines.ray_runtime import run_tasks


class IngestConfig(BaseModel):
    """Settings of `rexeval ingest`; every field can come from YAML or a flag."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str] = Field(min_length=1, description="review files")
    out: str = Field(description="output folder")
    format: str = "auto"
    columns: dict[str, str] = Field(default_factory=dict, description="our field -> source column")
    meta: list[str] = Field(default_factory=list, description="item metadata files (titles)")
    category: str | None = Field(None, description="domain name for rows that carry none")
    min_rating: float = 1.0
    max_rating: float = 5.0
    chunk_mb: float = Field(32.0, gt=0, description="size of one parse task")
    workers: int | None = Field(None, description="actors per stage (default: one per CPU)")

    @field_validator("format")
    @classmethod
    def _fmt(cls, v: str) -> str:
        if v not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")
        return v

    @field_validator("columns", mode="before")
    @classmethod
    def _cols(cls, v):
        return parse_columns(v) if isinstance(v, str) else v

    def output_config(self) -> dict:
        """What decides the output (not where it goes, nor how many workers)."""
        files = [{"path": str(Path(p).resolve()), "size": Path(p).stat().st_size} for p in self.inputs]
        meta = [{"path": str(Path(p).resolve()), "size": Path(p).stat().st_size} for p in self.meta]
        return {"inputs": files, "format": self.format, "columns": self.columns, "meta": meta,
                "category": self.category, "min_rating": self.min_rating,
                "max_rating": self.max_rating, "chunk_mb": self.chunk_mb}


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
    parsed = ShardedOutput(root / "_stage" / "parse", "ingest-parse", conf, ["reviews", "errors"]).open()
    progress(f"ingest: {len(cfg.inputs)} file(s), {len(chunks)} chunk(s) -> {root}")

    import ray

    done = parsed.done_shards()
    todo = [{"shard": c.shard} for c in chunks if c.shard not in done]
    if done:
        progress(f"  parse: resuming, {len(done)} of {len(chunks)} chunk(s) already done")
    stage = ParseStage(parsed, {c.shard: c for c in chunks}, cfg.min_rating, cfg.max_rating, cfg.category)
    _drive(run_tasks(todo, stage, cfg.workers), len(todo), "parse", progress)

    # Duplicates are found over all shards at once: only ids and positions are read.
    ids = []
    for c in chunks:
        t = pa.parquet.read_table(parsed.shard_path("reviews", c.shard),
                                  columns=["review_id", "item_id", "source", "line"])
        ids.append(t.append_column("shard", pa.array([c.shard] * t.num_rows, pa.int64()))
                    .append_column("row", pa.array(range(t.num_rows), pa.int64())))
    allids = pa.concat_tables(ids) if ids else None
    dup_by_shard: dict[int, pa.Table] = {}
    if allids is not None and allids.num_rows:
        dups = find_duplicates(allids.drop_columns(["item_id"]))
        if dups.num_rows:
            for shard in set(dups.column("shard").to_pylist()):
                dup_by_shard[shard] = dups.filter(pa.compute.equal(dups.column("shard"), shard))
    titles = None
    if cfg.meta:
        items = allids.column("item_id").unique() if allids is not None else pa.array([], pa.string())
        titles = load_titles(cfg.meta, items)
        progress(f"  metadata: titles for {titles.num_rows} of {len(items)} item(s)")

    fin_done = final.done_shards()
    todo = [{"shard": c.shard} for c in chunks if c.shard not in fin_done]
    stage = FinaliseStage(parsed, final, ray.put(dup_by_shard), ray.put(titles) if titles is not None else None)
    _drive(run_tasks(todo, stage, cfg.workers), len(todo), "finalise", progress)

    counts = final.total_counts()
    manifest = final.finish(len(chunks), counts)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


def _drive(results, total: int, what: str, progress: Callable[[str], None]) -> None:
    n = 0
    for row in results:
        n += 1
        progress(f"  {what}: chunk {row['shard']} done ({n}/{total}): in={row['in']} "
                 f"out={row['out']} errors={row['errors']}")
