"""Settings of `rexeval evaluate` (seed 000's metric suite)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, REPORT_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPaths
from rexeval.pipelines.core.schema import SCORE_AGGREGATES
from rexeval.pipelines.evaluate.families import ALL, select_families
from rexeval.serve.common import default_serve_port

# What `rexeval evaluate` writes in its folder (pipelines/core/outputs.py): the job writes
# these names, the study report reads them.
EVALUATE_OUTPUTS = Outputs(
    manifest=MANIFEST_OUTPUT,
    examples=Output("examples.parquet", "the examples scored: explanation, reference, statements"),
    errors=Output("errors.parquet", "explanations that could not be scored, with the reason"),
    scores=Output("scores.parquet", "one value per example, system and metric"),
    aggregates=Output("aggregates.parquet", "mean, std and bootstrap interval per system and metric",
                      columns=SCORE_AGGREGATES.names),
    tables_md=Output("tables.md", "seed 000's Tables III-VI (Table VII for review generation)"),
    tables_csv=Output("tables.csv", "the tables' numbers, with spreads and intervals"),
    figure2=Output("figure2.png", "seed 000's Figure 2 (StEnt-bin P/R/F1), when computed"),
    figure2_svg=Output("figure2.svg", "Figure 2 as SVG"),
    report=Output(REPORT_OUTPUT, "counts, task, families run and skipped, models"),
    correlations=Output("metric_correlations.parquet", "Kendall tau between every pair of metrics"),
    correlations_csv=Output("metric_correlations.csv", "the same as CSV"),
    correlations_md=Output("metric_correlations.md", "the same as lower-triangle Markdown tables"),
    correlation_figures=Output("metric_correlations_{dataset}_{over}.png", "one heat map per dataset and level"),
    families=Output("families", "each metric family's resumable shards", folder=True),
    extract=Output("extract", "statements extracted with `extract: true`", folder=True),
)
# What the study's `flip_benchmark` job writes (`inputs.write_flip_benchmark`).
FLIP_OUTPUTS = Outputs(
    references=Output("ground_truth", "a ground-truth folder (explanations/, sentences/)", folder=True),
    explanations=Output("explanations.parquet", "the ground truth and its sentiment-flipped copy"),
    statements=Output("statements.parquet", "the statements of both systems"),
    manifest=MANIFEST_OUTPUT,
)



class EvaluateConfig(LLMJobSettings):
    """Settings of `rexeval evaluate` (YAML or flags)."""

    explanations: ReadPaths = Field(description="EXPLANATIONS tables: Parquet, CSV, TSV or JSON-lines files "
                                                "(gzipped or not), folders of Parquet parts, or job folders")
    columns: dict[str, str] = Field(default_factory=dict,
                                    description="our column name -> yours, for the explanation and "
                                                "statements tables, each taking its own columns' entries "
                                                "(e.g. {explanation: text, system: model})")
    out: str
    references: OptionalReadPath = Field(None, description="ground-truth job folder (texts + statement sentences)")
    statements: ReadPaths = Field(default_factory=list,
                                  description="statements of the generated explanations (Parquet, CSV, TSV or "
                                              "JSON lines, gzipped or not)")
    extract: bool = Field(False, description="extract statements for systems that came without them")
    domain: str | None = Field(None, description="topic table for --extract (default: generic)")
    metrics: list[str] = Field(default_factory=lambda: [ALL], description="families or metric names")
    skip: list[str] = Field(default_factory=list, description="families or metric names to leave out")
    systems: list[str] | None = None
    limit: int | None = Field(None, ge=1, description="first N examples of each system")
    empty: Literal["skip", "zero"] = "skip"
    unparseable: Literal["zero", "skip"] = "zero"
    st2exp_population: Literal["both", "each"] = Field(
        "both", description="examples St2Exp-P/R average over: with statements on both sides (seed 000's "
                            "released code) or each side's own (P: with generated statements, R: with "
                            "reference statements); metrics/st2exp.py")
    nli_service: str = Field("auto", description="auto | none | serve:APP | http://host:port/route")
    nli_scorer: str = "rexeval.models.encoders.nli:NLIScorer"
    nli_replicas: int = Field(1, ge=1)
    nli_gpus: float = Field(0.0, ge=0)
    serve_port: int = Field(default_factory=default_serve_port, ge=1, le=65535)
    device: str = "auto"
    chunk_size: int = Field(512, ge=1)
    bootstrap: int = Field(1000, ge=0)
    confidence: float = Field(0.95, gt=0, lt=1)
    seed: int = 0
    dataset: str = ""
    task: Literal["auto", "explanation", "review"] = Field(
        "auto", description="what the references are: ground-truth explanations (seed 000 Tables III-VI) or "
                            "the reviews themselves (review generation, Table VII); auto: review when every "
                            "`generate run` folder among the explanations was trained on the review text and "
                            "no --references are given")

    @field_validator("metrics", "skip")
    @classmethod
    def _known_names(cls, names: list[str]) -> list[str]:
        """Family and metric names the job knows (the job's own expansion of them)."""
        select_families(names, [])
        return names

    @field_validator("nli_service")
    @classmethod
    def _service(cls, s: str) -> str:
        if not (s in ("auto", "none") or s.startswith(("http://", "https://", "serve:"))):
            raise ValueError(f"nli_service must be auto, none, serve:APP or an http(s) URL, got {s!r}")
        return s

    @model_validator(mode="after")
    def _extract_needs_domain(self):
        from rexeval.prompts import list_domains

        if self.extract and not self.domain:
            raise ValueError("extract needs a domain (--domain): the topic table the extraction prompt uses for "
                             f"the explanations (one of {', '.join(list_domains())})")
        return self
