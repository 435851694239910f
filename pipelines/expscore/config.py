"""Settings of `rexeval expscore train` and `rexeval expscore score` (seed 003)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rexeval.models.expscore import TrainSettings
from rexeval.pipelines.core.io import unset_fields
from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, REPORT_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPath, ReadPaths

# What `rexeval expscore score` writes in its folder, and `expscore train` besides its
# model (pipelines/core/outputs.py).
EXPSCORE_SCORE_OUTPUTS = Outputs(
    manifest=MANIFEST_OUTPUT,
    scores=Output("scores.parquet", "each explanation's factors and ExpScore"),
    errors=Output("errors.parquet", "rows that could not be scored, with the reason"),
    report=Output(REPORT_OUTPUT, "Pearson and Kendall of each head and each factor against the human ratings"),
    report_md=Output("report.md", "the same as Markdown (the seed's Tables 1-4 on this data)"),
)
EXPSCORE_TRAIN_OUTPUTS = EXPSCORE_SCORE_OUTPUTS | Outputs(
    report=Output(REPORT_OUTPUT, "Pearson and Kendall of each head, each factor and the BLEU-4, ROUGE-1/2/L and "
                  "METEOR baselines (against the item's reviews) against the human ratings (`baselines`)"),
    report_md=Output("report.md", "the same as Markdown (the seed's Tables 1-4 on this data; Table 1's "
                     "baselines in the heads' tables)"),
    model=Output("model", "the trained heads and factor settings (what `expscore score` reads)", folder=True),
)

ENCODER_ROLE = "sts"  # sentence similarity role: all-MiniLM-L6-v2 (sentence-BERT) in both profiles


class ExpScoreInputs(BaseModel):
    """Where explanations, reviews and the grammar checker come from."""

    model_config = ConfigDict(extra="forbid")

    inputs: ReadPaths = Field(description="explanation tables: Parquet, CSV, TSV or JSON lines, gzipped or not")
    out: str
    reviews: OptionalReadPath = Field(None, description="REVIEWS table (any of those formats) or `rexeval ingest` "
                                      "folder")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "explanation and reviews tables (e.g. {explanation: text, item_id: asin}); "
                                    "the explanations' own are the *_column settings")
    reviews_column: str | None = Field(None, description="input column with the item's reviews")
    text_column: str = "explanation"
    item_column: str = "item_id"
    rating_column: str = "rating"
    id_column: str = "example_id"
    features_column: str = "features"
    languagetool: OptionalReadPath = Field(None, description="LanguageTool server URL or folder")
    language: str = "en-US"
    max_reviews_per_item: int = Field(50, ge=1)
    profile: str = "local"
    embedder: str | None = Field(None, description=f"sentence encoder (default: the profile's {ENCODER_ROLE})")
    models: dict[str, str | None] = Field(default_factory=dict,
                                          description="profile role overrides (a study's `models:`)")
    device: str = "auto"
    ray: Literal["auto", "always", "never"] = Field(
        "auto", description="run on Ray workers (the driver holds no table): always, never, or auto: when the "
        "explanations or the reviews reach ray_min_rows rows")
    ray_min_rows: int = Field(20000, ge=1)
    batch_size: int = Field(512, ge=1)

    def recorded(self) -> dict:
        """The settings a job folder is keyed by; `models` and `columns` only when given,
        so folders written before those fields existed keep their hash."""
        return self.model_dump(exclude=unset_fields(self, "models", "columns"))


class ExpScoreTrainConfig(ExpScoreInputs):
    """Settings of `rexeval expscore train`."""

    head: Literal["linear", "logistic", "nn", "all"] = "all"
    test_fraction: float = Field(0.2, ge=0, lt=1)
    seed: int = 0
    l2: float = Field(0.01, ge=0)
    lr: float = Field(0.01, gt=0)
    max_epochs: int = Field(5000, ge=1)
    patience: int = Field(50, ge=1)
    rating_min: int = 1
    rating_max: int = 5
    repetition_n: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _rating_scale(self):
        """Training would refuse the scale only after scoring every explanation."""
        if self.rating_max <= self.rating_min:
            raise ValueError(f"rating_max ({self.rating_max}) must be above rating_min ({self.rating_min}): "
                             "they are the lowest and highest rating classes")
        return self

    def train_settings(self) -> TrainSettings:
        return TrainSettings(l2=self.l2, lr=self.lr, max_epochs=self.max_epochs, patience=self.patience,
                             seed=self.seed, rating_min=self.rating_min, rating_max=self.rating_max)


class ExpScoreScoreConfig(ExpScoreInputs):
    """Settings of `rexeval expscore score`."""

    model: ReadPath = Field(description="model folder written by `rexeval expscore train`")
    head: Literal["linear", "logistic", "nn", "all"] = "all"
