"""Settings of the `rexeval star` jobs: build, baselines and evaluation, training."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPath
from rexeval.pipelines.core.tune import MAX_FAILURES
from rexeval.pipelines.star.evaluate import KS



class BuildConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    statements: ReadPath = Field(description="`rexeval extract` output, statements Parquet, or a JSONL of "
                                             "hand-written statements per review")
    out: str
    clusters: OptionalReadPath = Field(None, description="`rexeval cluster` output; none: no clustering")
    reviews: OptionalReadPath = Field(None, description="reviews (ingest output); default: the extract's input")
    stage: str = Field("auto", description="statement stage: auto (verified, else triplet), verified, ...")
    min_user_interactions: int = Field(3, ge=3)
    name: str = Field("STAR", description="dataset name in the statistics table")



class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: ReadPath = Field(description="`rexeval star build` output")
    out: str = Field(description="run folder: results/<method>/ are written here")
    levels: list[Literal["global", "item", "user"]] = Field(["global", "item"], min_length=1)
    split: Literal["valid", "test"] = "test"
    ks: list[Annotated[int, Field(ge=1)]] = Field(list(KS), min_length=1, description="cut-offs k of the "
                                                  "ranking metrics (each at least 1)")
    ndcg_norm: Literal["ideal", "k"] = "ideal"
    device: str = "cpu"
    seed: int = 0
    batch_size: int | None = Field(None, ge=1, description="interactions per ranking step")



class TrainJob(BaseModel):
    """`rexeval star train`: the Tune experiment around `star.train.TrainSettings`."""

    model_config = ConfigDict(extra="forbid")

    data: ReadPath
    out: str
    settings: dict = Field(default_factory=dict, description="TrainSettings values (model, dim, mu, ...)")
    grid: dict[str, list] = Field(default_factory=dict, description="setting -> values to grid-search")
    sweep: str | None = Field(None, description="the one grid setting to plot (sensitivity, Figure 3)")
    seeds: int = Field(1, ge=1, description="independent runs (seed 002 reports the mean of 3): seeds "
                                           "seed, seed+1, ... become one more grid dimension")
    num_samples: int = Field(1, ge=1)
    asha: bool = True
    grace_period: int = Field(5, ge=1)
    cpus_per_trial: float = Field(1, gt=0)
    gpus_per_trial: float = Field(0, ge=0)
    max_concurrent: int | None = Field(None, ge=1)
    max_failures: int = Field(MAX_FAILURES, ge=-1, description="retries of a failed trial (its node lost, a "
                              "spot GPU taken back) from its last checkpoint; -1: without limit")
    profile: str = "local"
    models: dict[str, str] = Field(default_factory=dict)
    levels: list[Literal["global", "item", "user"]] = Field(["global", "item"], min_length=1)
    ndcg_norm: Literal["ideal", "k"] = "ideal"

    @model_validator(mode="after")
    def _checked(self):
        """The training settings, the grid, the sweep and the seeds, as the job reads them."""
        from rexeval.pipelines.star.train import TrainSettings

        settings = TrainSettings(**self.settings)
        if self.sweep and self.sweep not in self.grid:
            raise ValueError(f"sweep {self.sweep}: give its values with grid {self.sweep}=v1,v2,...")
        for key in self.grid:
            if key not in TrainSettings.model_fields:
                raise ValueError(f"cannot search {key!r}: not a training setting "
                                 f"({', '.join(TrainSettings.model_fields)})")
        if self.seeds > 1 and "seed" in self.grid:
            raise ValueError(f"seeds {self.seeds} trains seeds {self.seed_list(settings.seed)}; give either "
                             "seeds or a grid of seed")
        return self

    def seed_list(self, base: int) -> list[int]:
        """The runs' seeds: `base` alone for one run, else base, base+1, ..."""
        return [base + i for i in range(self.seeds)]

    def experiment_name(self, model: str) -> str:
        base = model.replace("+", "plus")
        return f"{base}-sweep-{self.sweep}" if self.sweep else base
