"""Settings of the `alert_curate` study job (seed 004 §3.1) and what it writes."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import ReadPath

CURATE_OUTPUTS = Outputs(
    reviews=Output("reviews", "the curated purchases: a reviews table (read as an ingest folder)", folder=True),
    categories=Output("categories.csv", "per category: qualifying users, sampled users, kept purchases "
                      "(seed 004's Figure 2 statistics)"),
    table=Output("curate.md", "rows dropped per rule, users per status, and the per-category counts"),
    manifest=MANIFEST_OUTPUT,
)


class CurateConfig(BaseModel):
    """Seed 004's values are the defaults (section 3.1)."""

    model_config = ConfigDict(extra="forbid")

    input: ReadPath = Field(description="an `rexeval ingest` folder (with item titles from --meta) or a reviews table "
                            "(Parquet, CSV, TSV or JSON lines, gzipped or not)")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "reviews table (e.g. {user_id: reviewer, title: name})")
    out: str
    rating: float = Field(5.0, allow_inf_nan=False, description="keep purchases rated exactly this (seed 004: 5 stars)")
    min_title_letters: int = Field(6, ge=0, description="keep items whose title has this many letters (seed 004: 6)")
    min_purchases: int = Field(5, ge=1, description="fewest purchases a kept user has (seed 004: 5)")
    max_purchases: int = Field(20, ge=1, description="most purchases a kept user has (seed 004: 20)")
    per_category: int | None = Field(200, ge=1, description="users sampled per category (seed 004: 200; "
                                     "null: every qualifying user)")
    seed: int = Field(0, description="seed of the per-category sample")

    @model_validator(mode="after")
    def _range(self):
        if self.min_purchases > self.max_purchases:
            raise ValueError(f"min_purchases ({self.min_purchases}) is above max_purchases ({self.max_purchases})")
        return self
