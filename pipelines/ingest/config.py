"""Settings of `rexeval ingest` and `rexeval split`."""
from __future__ import annotations

from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rexeval.pipelines.core.inputs import file_record, reviews_path
from rexeval.pipelines.core.io import unset_fields
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
    min_rating: float = Field(1.0, allow_inf_nan=False, description="lowest valid rating (rows below are errors)")
    max_rating: float = Field(5.0, allow_inf_nan=False, description="highest valid rating (rows above are errors)")
    chunk_mb: float = Field(32.0, gt=0, allow_inf_nan=False, description="size of one parse task")
    workers: int | None = Field(None, ge=1, description="actors per stage (default: one per CPU)")

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

    @model_validator(mode="after")
    def _rating_range(self):
        """A reversed scale would turn every row into an error row without a word."""
        if self.min_rating > self.max_rating:
            raise ValueError(f"min_rating ({self.min_rating:g}) is above max_rating ({self.max_rating:g}): "
                             "give the lowest valid rating as min_rating and the highest as max_rating")
        return self

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

    input: ReadPath = Field(description="an ingest output folder, a folder of reviews Parquet parts, or a "
                                        "reviews file (Parquet, CSV, TSV or JSON lines, gzipped or not)")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "reviews table (e.g. {user_id: reviewer, timestamp: time})")
    out: str
    method: Literal["temporal", "leave-last-two"] = "temporal"
    kcore_user: int = Field(0, ge=0, description="k-core: minimum reviews per user (0: off)")
    kcore_item: int = Field(0, ge=0, description="k-core: minimum reviews per item (0: off)")
    train: float = Field(0.8, gt=0, lt=1, allow_inf_nan=False, description="temporal: share of each user's "
                         "reviews in train, between 0 and 1")
    valid: float = Field(0.1, gt=0, lt=1, allow_inf_nan=False, description="temporal: share in validation; "
                         "train + valid < 1 (the rest is test)")
    min_interactions: int | None = Field(None, ge=1, description="default 5 (temporal) or 3 (leave-last-two)")
    drop_cold_start_items: bool | None = Field(None, description="default on (temporal), off (leave-last-two)")

    @model_validator(mode="after")
    def _method_settings(self):
        """What the split function would refuse after reading every review, refused now."""
        if self.method == "temporal" and Fraction(repr(self.train)) + Fraction(repr(self.valid)) >= 1:
            raise ValueError(f"train + valid must be below 1 so that test keeps rows, got train {self.train:g} "
                             f"+ valid {self.valid:g}")
        if self.method == "leave-last-two" and self.min_interactions is not None and self.min_interactions < 3:
            raise ValueError(f"min_interactions must be at least 3 for leave-last-two (one train, one valid and "
                             f"one test review per user), got {self.min_interactions}")
        return self

    def output_config(self) -> dict:
        src = reviews_path(self.input)
        files = src.glob("*.parquet") if src.is_dir() else [src]
        exclude = {"out", "input"} | unset_fields(self, "columns")
        return {**self.model_dump(exclude=exclude), "input": [file_record(f) for f in files]}
