"""Settings of `rexeval extract`, `rexeval extract-quality` and `rexeval ground-truth`."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rexeval.models.llm.base import SamplingParams
from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.pipelines.core.outputs import REPORT_OUTPUT, Output, Outputs, table_outputs
from rexeval.pipelines.core.read_paths import ReadPath

# What the jobs write in their folders (pipelines/core/outputs.py).
EXTRACT_OUTPUTS = table_outputs("statements", "errors")
QUALITY_OUTPUTS = table_outputs("judgements", "errors") | Outputs(
    report_md=Output("report.md", "seed 002's Table 2: explanatory and atomic shares"),
    report=Output(REPORT_OUTPUT, "the same numbers, the label and the settings"),
)
GROUND_TRUTH_OUTPUTS = table_outputs("explanations", "sentences", "errors")



class ExtractConfig(LLMJobSettings):
    """Settings of `rexeval extract`; every field can come from YAML or a flag."""

    input: ReadPath = Field(description="ingest output folder, or a reviews Parquet file/folder")
    out: str
    method: Literal["triplets", "star"] = "triplets"
    verify_model: str | None = Field(None, description="star: verifier model (default: llm)")
    domain: str | None = Field(None, description="topic table for every review (default: its category)")
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(512, ge=16)
    seed: int = 0
    max_review_words: int = Field(384, ge=16)
    constrained: bool = True
    limit: int | None = Field(None, ge=1, description="only the first N reviews")
    shard_size: int = Field(32, ge=1)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              max_tokens=self.max_tokens, seed=self.seed)



class QualityConfig(LLMJobSettings):
    """Settings of `rexeval extract-quality`."""

    input: ReadPath = Field(description="an `rexeval extract` output folder")
    out: str
    sample: int = Field(200, ge=1, description="interactions (reviews) to judge")
    seed: int = 0
    label: str | None = Field(None, description="row name in the report (default: input folder)")
    with_review: bool = Field(False, description="show the judge the review as context")
    max_tokens: int = Field(64, ge=8)
    shard_size: int = Field(64, ge=1)



class GroundTruthConfig(BaseModel):
    """Settings of `rexeval ground-truth`."""

    model_config = ConfigDict(extra="forbid")

    input: ReadPath = Field(description="an `rexeval extract` output folder, or a statements table (Parquet, CSV, "
                            "TSV or JSON lines, gzipped or not)")
    out: str = Field(description="output folder")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "statements table (e.g. {statement: text, review_id: rid})")
    stage: Literal["auto", "triplet", "candidate", "verified"] = Field(
        "auto", description="statements to use; auto: verified if any exist, else triplet")
    workers: int | None = Field(None, ge=1, description="actors (default: one per CPU)")
