"""Settings of the `rexeval star` jobs: build, baselines and evaluation, training."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPath
from rexeval.pipelines.core.tune import MAX_FAILURES


KS = (1, 3, 5, 10, 20)
"""The cutoffs every ranking is measured at (P, R, NDCG@k), in the results and the settings."""


MODEL_DEFAULTS = {
    # Seed 002, section 5.1.2: BPER+ d=20, gamma (L2) = 1e-5, mu=0.7; ExpGCN d=128, gamma=1e-3,
    # L=4 on the user-statement and item-statement graphs, 2 on the user-item graph; 500
    # epochs at most, the best epoch by validation NDCG@10, the mean of 3 runs.
    # Our choices, which the paper does not state (it runs the models' official code,
    # footnotes 2-3, without naming these): Adam's learning rate, 0.01 for BPER+'s small
    # embeddings and 0.001 for ExpGCN's deeper, larger model (the usual Adam range for
    # each size); TrainSettings' patience of 20 epochs, so the 500-epoch cap is not spent
    # after the validation score stopped improving; its batch of 1,024 triplets.
    "bper+": {"dim": 20, "reg": 1e-5, "lr": 0.01},
    "expgcn": {"dim": 128, "reg": 1e-3, "lr": 0.001},
}


class TrainSettings(BaseModel):
    """One trial's settings (what the Tune param space varies)."""

    model_config = ConfigDict(extra="forbid")

    model: Literal["bper+", "expgcn"] = "expgcn"
    dim: int | None = Field(None, ge=1, description="embedding size (default: 20 BPER+, 128 ExpGCN)")
    mu: float = Field(0.7, ge=0, le=1, description="BPER+: weight of the user score")
    layers_us: int = Field(4, ge=0, description="ExpGCN: layers on the user-statement graph")
    layers_is: int = Field(4, ge=0, description="ExpGCN: layers on the item-statement graph")
    layers_ui: int = Field(2, ge=0, description="ExpGCN: layers on the user-item graph")
    layers: int | None = Field(None, ge=0, description="ExpGCN: sets layers_us and layers_is together "
                               "(the L of seed 002's Figure 3b)")
    reg: float | None = Field(None, ge=0, description="L2 weight (default 1e-5 BPER+, 1e-3 ExpGCN)")
    rec_weight: float = Field(1.0, ge=0, description="ExpGCN: weight of the item-recommendation loss")
    lr: float | None = Field(None, gt=0, description="Adam learning rate (default 0.01 / 0.001)")
    batch_size: int = Field(1024, ge=1)
    epochs: int = Field(500, ge=1)
    patience: int = Field(20, ge=1, description="stop after this many epochs without improvement")
    seed: int = 0
    select_level: Literal["global", "item", "user"] = "global"
    select_metric: str = "ndcg@10"
    valid_rows: int | None = Field(None, ge=1, description="rank at most this many validation "
                                   "interactions per epoch (seeded sample); default all")

    def resolved(self) -> dict[str, Any]:
        d = self.model_dump()
        for k, v in MODEL_DEFAULTS[self.model].items():
            if d[k] is None:
                d[k] = v
        if d["layers"] is not None:
            d["layers_us"] = d["layers_is"] = d["layers"]
        return d

    @property
    def metric_key(self) -> str:
        return f"val_{self.select_metric}"


class BuildConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    statements: ReadPath = Field(description="`rexeval extract` output, a statements table (Parquet, CSV, TSV, or "
                                             "gzipped JSON lines), or a .jsonl of hand-written statements per review")
    out: str
    clusters: OptionalReadPath = Field(None, description="`rexeval cluster` output; none: no clustering")
    reviews: OptionalReadPath = Field(None, description="reviews (ingest output, or a reviews table in any format); "
                                                        "default: the extract's input")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "statements and reviews tables (e.g. {statement: text, review_id: rid})")
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
    """`rexeval star train`: the Tune experiment around `TrainSettings`."""

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
