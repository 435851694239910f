"""Settings of `rexeval ingest` and `rexeval split`."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rexeval.pipelines.core.inputs import file_record, reviews_path
from rexeval.pipelines.core.outputs import table_outputs
from rexeval.pipelines.core.read_paths import ReadPath, ReadPaths
from rexeval.pipelines.core.schema import SPLIT_NAMES
from rexeval.pipelines.ingest.formats import FORMATS, parse_columns

# What `rexeval ingest` and `rexeval split` write in their folders (pipelines/core/outputs.py).
INGEST_OUTPUTS = table_outputs("reviews", "errors")
SPLIT_OUTPUTS = table_outputs(*SPLIT_NAMES)



class IngestConfig(BaseModel):
    """Settings of `rexeval ingest`; every field can come from YAML or a flag."""

    model_config = ConfigDict(extra="forbid")

    inputs: ReadPaths = Field(min_length=1, description="review files")
    out: str = Field(description="output folder")
    format: str = "auto"
    columns: dict[str, str] = Field(default_factory=dict, description="our field -> source column")
    meta: ReadPaths = Field(default_factory=list, description="item metadata files (titles)")
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
        return parse_columns(v) if isinstance(v, (str, dict)) else v

    def output_config(self) -> dict:
        """What decides the output (not where it goes, nor how many workers)."""
        files = [file_record(p) for p in self.inputs]
        meta = [file_record(p) for p in self.meta]
        return {"inputs": files, "format": self.format, "columns": self.columns, "meta": meta,
                "category": self.category, "min_rating": self.min_rating,
                "max_rating": self.max_rating, "chunk_mb": self.chunk_mb}


METHODS = ("temporal", "leave-last-two")



class SplitConfig(BaseModel):
    """Settings of `rexeval split`."""

    model_config = ConfigDict(extra="forbid")

    input: ReadPath = Field(description="an ingest output folder, or a reviews Parquet file/folder")
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
        files = src.glob("*.parquet") if src.is_dir() else [src]
        return {**self.model_dump(exclude={"out", "input"}), "input": [file_record(f) for f in files]}
