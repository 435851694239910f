"""Settings of `rexeval meta-evaluate` (seeds 001 and 004)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rexeval.metrics.agreement import LEVELS, METHODS
from rexeval.pipelines.core.outputs import REPORT_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPath

# What `rexeval meta-evaluate` writes in its folder (pipelines/core/outputs.py).
META_EVALUATE_OUTPUTS = Outputs(
    results=Output("meta_evaluation.parquet", "one row per cell: evaluator, aspect, level, method, value, interval"),
    table=Output("meta_evaluation.md", "seed 001's Table 1 / seed 004's Table 2, and every cell"),
    report=Output(REPORT_OUTPUT, "mode, inputs, settings, counts"),
    errors=Output("errors.parquet", "rows or values that could not be used, with the reason"),
    sweep=Output("ensemble_sweep.parquet", "`ensemble_sweep`: mean [min, max] correlation per ensemble size"),
    sweep_csv=Output("ensemble_sweep.csv", "the same as CSV"),
    sweep_table=Output("ensemble_sweep.md", "the same as Markdown (Figure 4 as a table)"),
    sweep_figure=Output("ensemble_sweep.png", "seed 001's Figure 4"),
    subsets=Output("ensemble_subsets.parquet", "every ensemble subset's correlation"),
)


Method = Literal["pearson", "spearman", "kendall"]


Level = Literal["dataset", "user", "pair"]



class MetaEvaluateConfig(BaseModel):
    """Settings of `rexeval meta-evaluate` (YAML keys = the flags' names)."""

    model_config = ConfigDict(extra="forbid")

    scores: ReadPath = Field(description="evaluator table, or the one table with both sides")
    human: OptionalReadPath = Field(None, description="human table joined to `scores` on the keys")
    columns: dict[str, str] = Field(default_factory=dict,
                                    description="our column name -> yours, for both tables (e.g. "
                                                "{user_id: uid, human_persuasiveness: persuasive})")
    out: str
    mode: Literal["scores", "pairwise"] = "scores"
    aspects: list[str] = Field(default_factory=list, description="default: every aspect found")
    judge_prefixes: list[str] = Field(default_factory=lambda: ["judge_"])
    human_prefix: str = "human_"
    judge_cols: list[str] = Field(default_factory=list, description="explicit pairs, with human_cols")
    human_cols: list[str] = Field(default_factory=list)
    evaluator: str | None = Field(None, description="evaluator name for a single prefix or column pairs")
    user_col: str = "user_id"
    item_col: str = "item_id"
    key: str = Field("auto", description="explanation key; auto: system, explanation_id, pair_id")
    methods: list[Method] = Field(default_factory=lambda: list(METHODS))
    levels: list[Level] = Field(default_factory=lambda: list(LEVELS))
    table_method: Method | None = Field(None, description="method of the Markdown table (default: first)")
    human_null: float | Literal["drop"] = 3.0
    judge_null: float | Literal["drop"] = 0.0
    bootstrap: int = Field(1000, ge=0, description="resamples for the 95% interval (0: none)")
    confidence: float = Field(0.95, gt=0, lt=1)
    seed: int = 0
    random_baseline: bool = Field(False, description="add seed 001's Random row (uniform 1-5)")
    ensemble_sweep: bool = Field(False, description="seed 001's Figure 4: correlation of the mean of N "
                                                    "evaluators, N = 1..K, per aspect")
    ensemble_cap: int = Field(200, ge=1, description="most subsets of one size in the sweep (a seeded sample "
                                                     "past it)")

    @model_validator(mode="after")
    def _check(self) -> MetaEvaluateConfig:
        if len(self.judge_cols) != len(self.human_cols):
            raise ValueError(f"give one human column per judge column ({len(self.judge_cols)} judge, "
                             f"{len(self.human_cols)} human)")
        if self.judge_cols and self.aspects:
            raise ValueError("give either column pairs (judge_cols/human_cols) or aspects, not both")
        if not self.methods or not self.levels:
            raise ValueError("methods and levels must not be empty")
        if self.ensemble_sweep and self.mode != "scores":
            raise ValueError("ensemble_sweep averages ratings: it needs mode scores, not pairwise verdicts")
        if self.table_method is not None and self.table_method not in self.methods:
            raise ValueError(f"table_method {self.table_method!r} is not among methods {self.methods}")
        return self

    @property
    def shown_method(self) -> str:
        return self.table_method or self.methods[0]

    def recorded_settings(self) -> dict:
        """The settings a run records and hashes: without `out`, and without the
        ensemble sweep's fields while it is off, so a run without it keeps the hash
        (and report) it had before the sweep existed."""
        skip = {"out"} | (set() if self.ensemble_sweep else set(ENSEMBLE_FIELDS))
        return self.model_dump(exclude=skip)


ENSEMBLE_FIELDS = ("ensemble_sweep", "ensemble_cap")
