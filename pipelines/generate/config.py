"""Settings of the `rexeval generate` jobs: training (a Tune experiment) and decoding."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rexeval.models.generators.presets import PRESETS
from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.pipelines.core.outputs import Output, Outputs, table_outputs
from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPath
from rexeval.pipelines.core.stage import CPUS_PER_WORKER, MEMORY_PER_WORKER
from rexeval.pipelines.core.tune import MAX_FAILURES

# What `rexeval generate train` and `rexeval generate run` write in their folders
# (pipelines/core/outputs.py).
GENERATE_TRAIN_OUTPUTS = Outputs(
    data=Output("data", "the prepared examples, vocabulary and index", folder=True),
    tune=Output("tune", "the Ray Tune experiment", folder=True),
    best=Output("best", "the best checkpoint (what `generate run` decodes)", folder=True),
    profiles=Output("profiles", "XRec's user and item profiles", folder=True),
    report=Output("train.json", "settings, the best trial and epoch, its validation numbers, every trial"),
)
GENERATE_RUN_OUTPUTS = table_outputs("explanations", "ratings", "errors")

Target = Literal["explanation", "review"]


class TrainJob(LLMJobSettings):
    """`rexeval generate train`: data preparation and the Tune experiment around the
    model settings (`pipelines.generate.settings.resolve_settings`). The LLM settings
    (profile, model overrides, backend, cache) choose PEPLER's and XRec's backbones
    (roles generator_lm, generator_llm) and the LLM that writes XRec's profiles (llm)."""

    model_config = ConfigDict(extra="forbid")

    data: ReadPath = Field(description="`rexeval split` output (train/, valid/, test/)")
    out: str
    model: str = Field("peter", description="nrt, att2seq, peter, cer, pepler or xrec")
    preset: Literal[tuple(PRESETS)] = Field(  # type: ignore[valid-type]
        "paper", description="settings table the model starts from (models/generators/presets.py): paper "
                             "(each original paper) or seed000 (what seed 000 ran); `settings` override it")
    target: Target = Field("explanation", description="explanation: the ground-truth explanations "
                                                      "(seed 000 Tables III-VI); review: the review text (Table VII)")
    truth: OptionalReadPath = Field(None, description="`rexeval ground-truth` output (needed for --target explanation)")
    settings: dict = Field(default_factory=dict, description="hyperparameters over the preset's")
    grid: dict[str, list] = Field(default_factory=dict, description="setting -> values to grid-search")
    num_samples: int = Field(1, ge=1)
    asha: bool = True
    grace_period: int = Field(5, ge=1)
    cpus_per_trial: float | None = Field(None, gt=0, description="default: all CPUs for one trial, else 1")
    gpus_per_trial: float = Field(0, ge=0)
    max_concurrent: int | None = Field(None, ge=1)
    max_failures: int = Field(MAX_FAILURES, ge=-1, description="retries of a failed trial (its node lost, a "
                              "spot GPU taken back) from its last checkpoint; -1: without limit")
    overwrite: bool = False

    @model_validator(mode="after")
    def _known_settings(self):
        """The model, its settings and the grid, as the job resolves them."""
        from rexeval.pipelines.generate.settings import check_grid, resolve_settings

        check_grid(resolve_settings(self.model, self.settings, self.preset)["model"], self.grid)
        return self

    def experiment_name(self) -> str:
        return f"{self.model}-{self.target}"


class RunConfig(BaseModel):
    """`rexeval generate run`: decode one split with a trained checkpoint."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: ReadPath = Field(description="a `generate train` output folder, or one epoch checkpoint folder in it")
    out: str
    split: Literal["train", "valid", "test"] = "test"
    system: str | None = Field(None, description="system name in the explanations table (default: the model)")
    beam_size: int = Field(1, ge=1, description="1: greedy decoding; more: beam search")
    batch_size: int = Field(256, ge=1, description="examples decoded together")
    shard_size: int = Field(2048, ge=1, description="examples per output shard (resume unit)")
    max_words: int | None = Field(None, ge=1, description="longest output (default: the training length)")
    limit: int | None = Field(None, ge=1, description="decode only the first N examples")
    workers: int | None = Field(None, ge=1, description="the most decoding actors (each loads the model "
                                "once; default: one per shard on a cluster, as many as fit on one machine)")
    min_workers: int = Field(1, ge=1, description="the fewest decoding actors")
    cpus_per_worker: float | None = Field(None, gt=0, description=CPUS_PER_WORKER)
    gpus_per_worker: float = Field(0, ge=0)
    memory_per_worker: float | None = Field(None, gt=0, description=MEMORY_PER_WORKER)
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each worker actor asks for, e.g. "
        "{accel: 1} for a node type of the cluster's own; an autoscaler starts that type for them")
