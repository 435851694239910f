"""Settings of the judge jobs: `rexeval judge likert|pairwise|detect` (seeds 001, 004)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rexeval.models.profiles import answer_caps
from rexeval.pipelines.core.llm.job import ChunkedLLMSettings
from rexeval.pipelines.core.outputs import REPORT_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPaths

# What the judge jobs write in their folders (pipelines/core/outputs.py); report.json is
# written by `core.llm.chunks.write_report`.
JUDGE_REPORT = Output(REPORT_OUTPUT, "counts, LLM usage and cost, the settings")
LIKERT_OUTPUTS = Outputs(
    scores=Output("likert_scores.parquet", "one 1-5 score per explanation, judge and aspect"),
    table=Output("likert.md", "mean score per judge, system and aspect"),
    report=JUDGE_REPORT,
    judges=Output("judges", "each judge's resumable LLM chunks (judge-<k>/)", folder=True),
    inputs=Output("_inputs", "the one-shot pool, staged beside a URI output", folder=True),
)
PAIRWISE_OUTPUTS = Outputs(
    errors=Output("errors.parquet", "explanations without a baseline to pair with"),
    verdicts=Output("verdicts.parquet", "the LLM judge's verdict per pair (read by `judge winrate`)"),
    calls=Output("calls.parquet", "each LLM call: order, raw answer, parsed verdict"),
    verdicts_disc=Output("verdicts_disc.parquet", "the reward model's verdict per pair (read by `judge winrate`)"),
    table=Output("pairwise.md", "win / tie / loss rates per evaluator, position bias, cost"),
    report=JUDGE_REPORT,
    chunks=Output("calls", "the LLM judge's resumable chunks", folder=True),
)
DETECT_OUTPUTS = Outputs(
    verdicts=Output("verdicts_{evaluator}.parquet", "each evaluator's verdict per pair"),
    pairs=Output("pairs.parquet", "the generated good / inferior explanation pairs",
                 columns=("pair_id", "condition", "original_prompt_version", "inferior_prompt_version")),
    errors=Output("errors.parquet", "pairs that could not be generated"),
    table=Output("detection.md", "seed 004's Table 1: accuracy per condition"),
    report=JUDGE_REPORT,
    generate=Output("generate", "the generator's resumable LLM chunks", folder=True),
    judge_gen=Output("judge_gen", "the LLM judge's resumable chunks", folder=True),
)


_JUDGE_TOKENS = ("tokens per verdict, reasoning included; unset: the profile's answer_caps.judge_tokens "
                 "(2048 with `paper`, seed 004's appendix A; 512 with `local`)")
_JUDGE_TEMPERATURE = "the judge's sampling temperature (0: greedy and cached; seed 004, appendix A: 0.7)"


class JudgeJobSettings(ChunkedLLMSettings):
    """What every judge job shares: the inputs' context, and (from ChunkedLLMSettings)
    the judge service, cost and chunks."""

    contexts: OptionalReadPath = Field(None, description="file with user_id, item_id, user_profile, item_description")
    reviews: ReadPaths = Field(default_factory=list, description="ingested reviews to build contexts from")
    max_history: int = Field(10, ge=0)
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "explanation, contexts, interactions, reviews and one-shot examples tables (e.g. "
                                    "{explanation: text, user_id: uid}); each table takes the entries for its "
                                    "own columns")



class LikertJobConfig(JudgeJobSettings):
    explanations: ReadPaths = Field(description="EXPLANATIONS tables (Parquet, CSV, TSV or JSON lines, or folders)")
    systems: list[str] | None = None
    limit: int | None = Field(None, ge=1, description="first N examples of each system")
    judges: list[str] = Field(default_factory=list, description="judge model refs (default: the profile's "
                              "judge_llm); two or more also give their ensemble")
    aspects: list[str] | None = None
    mode: Literal["single", "multi"] = "multi"
    shots: Literal["zero", "one", "personalised"] = "zero"
    examples: str | None = Field(None, description="human-rated examples for one-shot prompts (any table "
                                 "format; `columns` maps theirs)")
    ensemble_missing: Literal["skip", "zero"] = "skip"
    max_tokens: int = Field(64, ge=4)
    constrained: bool = Field(True, description="JSON-schema-constrained answers where the backend can")

    @model_validator(mode="after")
    def _shots_need_examples(self):
        if self.shots != "zero" and not self.examples:
            raise ValueError(f"shots {self.shots!r} needs examples: a file of human-rated explanations "
                             "(--examples)")
        return self


def _known_rubric(ref: str) -> str:
    """A rubric name or .yaml file the job can read, checked with the settings (the chunks
    read it on the workers, after the job has started its models); a URI is read there."""
    from rexeval.storage import is_uri
    from rexeval.prompts.rubrics import load_rubric

    if not is_uri(ref):
        load_rubric(ref)  # PromptError (a ValueError) names what is wrong and the known rubrics
    return ref


class VerdictJobSettings(JudgeJobSettings):
    """What the pairwise judge and the hallucination detector share: the rubric and how
    each pair's verdict is asked (per criterion or all at once, both orders, what a
    disagreement gives), the judge's caps and sampling, and which evaluators answer."""

    criteria: str = "alert_criteria"
    divide: bool = True
    both_orders: bool = True
    disagreement: Literal["tie", "first"] = "tie"
    max_tokens: int | None = Field(None, ge=8, description=_JUDGE_TOKENS)
    temperature: float = Field(0.0, ge=0, description=_JUDGE_TEMPERATURE)
    constrained: bool = True
    evaluators: list[str] = Field(
        default_factory=lambda: ["gen"], min_length=1,
        description="who judges each pair (pipelines/judge/evaluators/): gen, the LLM judge (ALERT-Gen, "
                    "verdicts.parquet); disc, a reward model (ALERT-Disc, verdicts_disc.parquet); or one of your own")
    reward_model: str | None = Field(None, description="sequence-classification reward model (for disc)")

    _criteria = field_validator("criteria")(_known_rubric)

    @field_validator("evaluators")
    @classmethod
    def _known_evaluators(cls, names: list[str]) -> list[str]:
        from rexeval.pipelines.judge.evaluators import EVALUATORS

        for name in names:
            EVALUATORS.lookup(name)  # a ValueError lists the known evaluators
        return names


class PairwiseJobConfig(VerdictJobSettings):
    explanations: ReadPaths = Field(description="EXPLANATIONS tables (Parquet, CSV, TSV or JSON lines, or folders)")
    baseline: str = Field(description="the system every other system is compared with")
    systems: list[str] | None = None
    limit: int | None = Field(None, ge=1)
    only: list[str] | None = None

    @model_validator(mode="after")
    def _disc_needs_a_reward_model(self):
        return _check_evaluators(_capped(self))


class DetectJobConfig(VerdictJobSettings):
    interactions: OptionalReadPath = Field(None, description="file of user_id, item_id to explain (default: "
                                           "each context row)")
    limit: int | None = Field(None, ge=1, description="first N interactions")
    conditions: list[str] | None = None
    generator: str | None = Field(None, description="model that writes the explanations (default: llm role)")
    generation_max_tokens: int | None = Field(
        None, ge=8, description="tokens per generated explanation; unset: the profile's answer_caps.explain_tokens "
        "(2048 with `paper`, seed 004's appendix A; 96 with `local`)")
    generation_max_words: int | None = Field(
        60, ge=5, description="the longest explanation kept (a longer one keeps its leading whole sentences); "
        "null keeps answers whole; unset: the profile's answer_caps.explain_words (null with `paper`: seed 004 "
        "caps no words; 60 with `local`)")
    generation_temperature: float = Field(0.0, ge=0, description="sampling temperature of the generator (0: "
                                          "greedy and cached; seed 004 names 0.7 for its judge only)")

    @model_validator(mode="after")
    def _checked(self):
        from rexeval.pipelines.judge.detect import ALL_CONDITIONS, DetectSuiteConfig, check_conditions

        if not (self.contexts or self.reviews):
            raise ValueError("detect needs contexts (--contexts FILE) or reviews (--reviews PATH): where the "
                             "interactions come from")
        check_conditions(DetectSuiteConfig(conditions=self.conditions or list(ALL_CONDITIONS)))
        if "generation_max_words" not in self.model_fields_set:  # None is a setting: "keep answers whole"
            self.generation_max_words = answer_caps(self.profile).explain_words
        if self.generation_max_tokens is None:
            self.generation_max_tokens = answer_caps(self.profile).explain_tokens
        return _check_evaluators(_capped(self))


def _capped(cfg):
    """The judge's token cap from the profile when the settings give none."""
    if cfg.max_tokens is None:
        cfg.max_tokens = answer_caps(cfg.profile).judge_tokens
    return cfg


def _check_evaluators(cfg):
    """Each evaluator's own check of the settings (disc: a reward model is given)."""
    from rexeval.pipelines.judge.evaluators import evaluator

    for name in dict.fromkeys(cfg.evaluators):
        evaluator(name).check(cfg)
    return cfg
