"""The split job: reviews -> optional k-core -> train/valid/test, written with a manifest."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from rexeval.pipelines.core.io import ShardedOutput, read_table
from rexeval.pipelines.ingest.split import kcore, leave_last_two, temporal_split

METHODS = ("temporal", "leave-last-two")


class SplitConfig(BaseModel):
    """Settings of `rexeval split`."""

    model_config = ConfigDict(extra="forbid")

    input: str = Field(description="an ingest output folder, or a reviews Parquet file/folder")
    out: str
    method: Literal["temporal", "leave-last-two"] = "temporal"
    kcore_user: int = Field(0, ge=0, description="k-core: minimum reviews per user (0: off)")
    kcore_item: int = Field(0, ge=0, description="k-core: minimum reviews per item (0: off)")
    train: float = 0.8
    valid: float = 0.1
    min_interactions: int | None = Field(None, description="default 5 (temporal) or 3 (leave-last-two)")
    drop_cold_start_items: bool | None = Field(None, description="default on (temporal), off (leave-last-two)")

    def output_config(self) -> dict:
        src = reviews_path(self.input)
        files = sorted(src.glob("*.parquet")) if src.is_dir() else [src]
        return {**self.model_dump(exclude={"out", "input"}),
                "input": [{"path": str(f.resolve()), "size": f.stat().st_size} for f in files]}


def reviews_path(path: str | Path) -> Path:
    """Accept an ingest output folder (its reviews/) or a reviews table directly."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such input: {p}")
    return p / "reviews" if (p / "reviews").is_dir() else p


def run_split(cfg: SplitConfig, overwrite: bool = False,
              progress: Callable[[str], None] = print) -> dict:
    t0 = time.time()
    out = ShardedOutput(cfg.out, "split", cfg.output_config(), ["train", "valid", "test"])
    out.open(overwrite=overwrite)
    if 0 in out.done_shards():
        progress(f"split: {cfg.out} is already complete for these settings")
        return out.finish(1)
    reviews = read_table(reviews_path(cfg.input), "reviews")
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
    out.write_shard(0, res.as_dict(), counts)
    manifest = out.finish(1, counts)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest

