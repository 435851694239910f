"""The jobs a study step can run: each is the existing job's config class and run
function, called exactly as its command calls it (no second implementation of any
step), the model roles it cannot run without, and what it writes (`outputs`).

`STUDY_JOBS` is a registry (name -> StudyJob, `pipelines/core/study_registry.py`). The jobs
here are the built-in ones; a new job is one file of its own, a module
`rexeval.pipelines.<capability>.study_job` that registers it with `@register_study_job`
(the registry finds every such module). A job's settings are its config class's fields
(the YAML keys of `--config FILE` for that command), with `out` filled in by the study;
fields typed `ReadPath`/`OptionalReadPath`/`ReadPaths` (`pipelines/core/read_paths.py`)
are the files and folders it reads, checked for existence when the plan is built; its
`outputs` (`pipelines/core/outputs.py`) are the files it writes, which the study report
reads and the plan checks a downstream step's paths against.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import ReadPath  # noqa: E402
from rexeval.pipelines.core.study_registry import ServeNeed, add_study_job, register_study_job, write_manifest


# -- the jobs ---------------------------------------------------------------------------
# Imports are inside the functions: building a study plan must not import torch & co.

from rexeval.pipelines.ingest.config import INGEST_OUTPUTS, SPLIT_OUTPUTS, IngestConfig, SplitConfig  # noqa: E402
from rexeval.pipelines.extract.config import (EXTRACT_OUTPUTS, GROUND_TRUTH_OUTPUTS, QUALITY_OUTPUTS,  # noqa: E402
                                              ExtractConfig, GroundTruthConfig, QualityConfig)
from rexeval.pipelines.paraphrase.config import CLUSTER_OUTPUTS, ClusterConfig  # noqa: E402
from rexeval.pipelines.star.config import BuildConfig, EvalSettings, TrainJob as StarTrainJob  # noqa: E402
from rexeval.pipelines.star.outputs import (STAR_BASELINES_OUTPUTS, STAR_BUILD_OUTPUTS,  # noqa: E402
                                            STAR_TRAIN_OUTPUTS)
from rexeval.pipelines.generate.config import (GENERATE_RUN_OUTPUTS, GENERATE_TRAIN_OUTPUTS, RunConfig,  # noqa: E402
                                               TrainJob as GenerateTrainJob)
from rexeval.pipelines.generate.prompted.config import PROMPTED_OUTPUTS, PromptedJob  # noqa: E402
from rexeval.pipelines.evaluate.config import EVALUATE_OUTPUTS, FLIP_OUTPUTS, EvaluateConfig  # noqa: E402
from rexeval.pipelines.judge.config import (DETECT_OUTPUTS, LIKERT_OUTPUTS, PAIRWISE_OUTPUTS,  # noqa: E402
                                            DetectJobConfig, LikertJobConfig, PairwiseJobConfig)
from rexeval.pipelines.judge.winrate import WINRATE_OUTPUTS, WinrateConfig  # noqa: E402
from rexeval.pipelines.meta_evaluate.config import META_EVALUATE_OUTPUTS, MetaEvaluateConfig  # noqa: E402
from rexeval.pipelines.expscore.config import (ENCODER_ROLE, EXPSCORE_SCORE_OUTPUTS,  # noqa: E402
                                               EXPSCORE_TRAIN_OUTPUTS, ExpScoreScoreConfig, ExpScoreTrainConfig)


def _llm(role: str) -> Callable[[Any], list[str]]:
    return lambda cfg: [] if getattr(cfg, "backend", None) == "openai" else [role]


def _served_llms(models: Callable[[Any], list[tuple[str, str | None]]]) -> Callable[[Any], list[ServeNeed]]:
    """The judge application(s) of a job whose LLM calls go through it: one per (role,
    model) in `models(cfg)`, exactly as the job builds them (`llm.chunks.JudgeService`).
    None when the job calls a given service or runs its LLM in-process; one shared
    application when every call wants the same; the job's own otherwise."""
    def serves(cfg) -> list[ServeNeed]:
        if cfg.judge_service != "auto":
            return []
        from rexeval.models.profiles import load_profile
        from rexeval.pipelines.core.llm.chunks import JudgeService, llm_spec

        profile = load_profile(cfg.profile, cfg.models)
        needs: dict[tuple[str, str], ServeNeed] = {}
        for role, model in models(cfg):
            spec = llm_spec(cfg, profile, role=role, model=model)
            app, key = JudgeService(cfg, spec, lambda _: None).app()
            needs[(app, key)] = ServeNeed(app, key, "shared", functools.partial(open_judge, cfg, spec))
        if len({app for app, _ in needs}) < len(needs):  # several models under one name
            return [ServeNeed(app, mode="own") for app in sorted({app for app, _ in needs})]
        return list(needs.values())
    return serves


def open_judge(cfg, spec: dict, progress: Callable[[str], None]) -> Callable[[], None]:
    """Start (or join) the judge application a job with `cfg` would call for `spec`;
    its release. Module-level: the study holds it in a process of its own."""
    from rexeval.pipelines.core.llm.chunks import JudgeService

    service = JudgeService(cfg, spec, progress)
    service.address()
    return service.stop


def _evaluate_serves(cfg) -> list[ServeNeed]:
    """The NLI application an evaluate job starts for its last families (its own)."""
    if cfg.nli_service != "auto":
        return []
    from rexeval.models.profiles import load_profile
    from rexeval.serve.nli import APP_NAME

    return [ServeNeed(APP_NAME, mode="own")] if load_profile(cfg.profile, cfg.models).ref("nli") else []


def _prompted_llm_methods(cfg) -> list[tuple[str, str | None]]:
    from rexeval.pipelines.generate.prompted.methods import METHODS

    return [("llm", None)] if any(METHODS.lookup(m).uses_llm for m in cfg.methods) else []


def _evaluator_roles(cfg) -> list[str]:
    """The profile's LLM roles the job's pairwise evaluators start (gen: judge_llm)."""
    from rexeval.pipelines.judge.evaluators import evaluator, in_order

    return list(dict.fromkeys(r for r in (evaluator(n).serves for n in in_order(cfg.evaluators)) if r))


def _expscore_roles(cfg) -> list[str]:
    """ExpScore's relevance factor encodes with the profile's sentence encoder unless the
    settings name one (`embedder`)."""
    return [] if cfg.embedder else [ENCODER_ROLE]


# Jobs whose run function takes (cfg, [overwrite,] progress): name, settings, function,
# the model roles they need, what they do, what they write.
P = "rexeval.pipelines."
SERVES = {
    "generate_llm": _served_llms(_prompted_llm_methods),
    "judge_likert": _served_llms(lambda cfg: [("judge_llm", m) for m in cfg.judges or [None]]),
    "judge_pairwise": _served_llms(lambda cfg: [(role, None) for role in _evaluator_roles(cfg)]),
    "judge_detect": _served_llms(lambda cfg: [("llm", cfg.generator)]
                                 + [(role, None) for role in _evaluator_roles(cfg)]),
}
for _name, _config, _target, _roles, _what, _outputs in [
    ("ingest", IngestConfig, "ingest.pipeline:run_ingest", None,
     "review files -> reviews/ + errors/ (`rexeval ingest`)", INGEST_OUTPUTS),
    ("split", SplitConfig, "ingest.split_pipeline:run_split", None,
     "k-core and temporal / leave-last-two split (`rexeval split`)", SPLIT_OUTPUTS),
    ("extract", ExtractConfig, "extract.pipeline:run_extract", _llm("llm"),
     "reviews -> statements with an LLM (`rexeval extract`)", EXTRACT_OUTPUTS),
    ("extract_quality", QualityConfig, "extract.quality:run_quality", _llm("judge_llm"),
     "explanatoriness and atomicity of statements (`rexeval extract-quality`)", QUALITY_OUTPUTS),
    ("ground_truth", GroundTruthConfig, "extract.ground_truth_pipeline:run_ground_truth", None,
     "rule-based explanations (`rexeval ground-truth`)", GROUND_TRUTH_OUTPUTS),
    ("cluster", ClusterConfig, "paraphrase.pipeline:run_cluster", lambda cfg: ["embedder"] if cfg.method == "star" else [],
     "paraphrase clusters or EXTRA (`rexeval cluster`)", CLUSTER_OUTPUTS),
    ("star_build", BuildConfig, "star.pipeline:run_build", None,
     "the STAR ranking benchmark (`rexeval star build`)", STAR_BUILD_OUTPUTS),
    ("star_train", StarTrainJob, "star.pipeline:run_train", None,
     "BPER+ / ExpGCN on Ray Tune (`rexeval star train`)", STAR_TRAIN_OUTPUTS),
    ("generate_run", RunConfig, "generate.decode:run_generate", None,
     "a trained generator decodes a split (`rexeval generate run`)", GENERATE_RUN_OUTPUTS),
    ("generate_llm", PromptedJob, "generate.prompted.job:run_prompted", _llm("llm"),
     "seed 004's prompted generators (`rexeval generate llm`)", PROMPTED_OUTPUTS),
    ("judge_likert", LikertJobConfig, "judge.jobs:run_likert", lambda cfg: [] if cfg.judges else ["judge_llm"],
     "Likert ratings (`rexeval judge likert`)", LIKERT_OUTPUTS),
    ("judge_pairwise", PairwiseJobConfig, "judge.jobs:run_pairwise", _evaluator_roles,
     "pairwise verdicts against a baseline (`rexeval judge pairwise`)", PAIRWISE_OUTPUTS),
    ("judge_detect", DetectJobConfig, "judge.jobs:run_detect", _llm("judge_llm"),
     "inferior-explanation detection (`rexeval judge detect`)", DETECT_OUTPUTS),
    ("judge_winrate", WinrateConfig, "judge.winrate:run_winrate", None,
     "win rates, Table 4, Figure 5 (`rexeval judge winrate`)", WINRATE_OUTPUTS),
    ("meta_evaluate", MetaEvaluateConfig, "meta_evaluate.pipeline:run_meta_evaluate", None,
     "agreement with humans (`rexeval meta-evaluate`)", META_EVALUATE_OUTPUTS),
    ("expscore_train", ExpScoreTrainConfig, "expscore.pipeline:run_train", _expscore_roles,
     "seed 003's ExpScore heads trained on human ratings (`rexeval expscore train`)", EXPSCORE_TRAIN_OUTPUTS),
    ("expscore_score", ExpScoreScoreConfig, "expscore.pipeline:run_score", _expscore_roles,
     "explanations scored with a trained ExpScore model (`rexeval expscore score`)", EXPSCORE_SCORE_OUTPUTS),
]:
    add_study_job(_name, _config, P + _target, roles=_roles, description=_what, serves=SERVES.get(_name),
                  outputs=_outputs)


class StatsConfig(BaseModel):
    """Seed 000's Table II of a split (what `rexeval info` prints), written to `out`."""

    input: ReadPath
    out: str
    name: str = "all"


STATS_OUTPUTS = Outputs(
    stats=Output("stats.json", "its manifest, with `stats`: Table II's numbers per dataset and category"),
    table=Output("table2.md", "Table II as `rexeval info` prints it"),
)


@register_study_job("stats", StatsConfig, outputs=STATS_OUTPUTS,
                    description="seed 000 Table II of a split (`rexeval info`)")
def _stats(cfg, progress):
    from rexeval.pipelines.core.io import write_bytes_atomic
    from rexeval.storage import location
    from rexeval.pipelines.ingest.stats import format_table, split_stats

    stats = split_stats(cfg.input, cfg.name)  # counted by Ray workers: this driver holds no table
    table = format_table(stats)
    progress(table)
    write_bytes_atomic(location(cfg.out) / STATS_OUTPUTS.table, (table + "\n").encode())
    return write_manifest(cfg, "stats", {"datasets": len(stats)}, file=STATS_OUTPUTS.stats, stats=stats)


class AnnotationsConfig(BaseModel):
    """Hand-written statements (JSON lines, pipelines/sample/statements.jsonl's format) as
    a statements folder, for the jobs that read `rexeval extract` output."""

    input: ReadPath
    out: str
    stage: str = "verified"


ANNOTATIONS_OUTPUTS = Outputs(statements=EXTRACT_OUTPUTS.statements, manifest=MANIFEST_OUTPUT)


@register_study_job("annotations", AnnotationsConfig, outputs=ANNOTATIONS_OUTPUTS,
                    description="hand-written statements (JSON lines) -> a statements folder")
def _annotations(cfg, progress):
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.core.io import write_parquet_atomic
    from rexeval.storage import location

    table = statements_from_annotations(cfg.input, stage=cfg.stage)
    write_parquet_atomic(location(cfg.out) / EXTRACT_OUTPUTS.statements / "part-00000.parquet", table)
    progress(f"annotations: {table.num_rows} statement(s) from {cfg.input}")
    return write_manifest(cfg, "annotations", {"statements": table.num_rows})


class FlipConfig(BaseModel):
    """Seed 000's sanity benchmark: rule-built ground truth from hand-written statements
    and a copy with every sentiment flipped (`evaluate.inputs.write_flip_benchmark`):
    OUT/ground_truth (references), OUT/explanations.parquet, OUT/statements.parquet."""

    input: ReadPath
    out: str
    system: str = "flipped"


@register_study_job("flip_benchmark", FlipConfig, outputs=FLIP_OUTPUTS,
                    description="ground truth and a sentiment-flipped copy from hand-written statements")
def _flip(cfg, progress):
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.evaluate.inputs import write_flip_benchmark

    paths = write_flip_benchmark(statements_from_annotations(cfg.input, stage="triplet"), cfg.out, cfg.system)
    progress(f"flip benchmark: {', '.join(f'{k} {v}' for k, v in paths.items())}")
    return write_manifest(cfg, "flip_benchmark", {"systems": 2}, paths=paths)


class StarBaselinesConfig(EvalSettings):
    """`rexeval star baselines`: the popularity baselines ranked and scored."""

    methods: list[str] = ["random", "userpop", "itempop", "globalpop"]


@register_study_job("star_baselines", StarBaselinesConfig, outputs=STAR_BASELINES_OUTPUTS,
                    description="ranking baselines (`rexeval star baselines`)")
def _star_baselines(cfg, progress):
    from rexeval.pipelines.star.pipeline import run_baselines

    return run_baselines(EvalSettings(**cfg.model_dump(exclude={"methods"})), list(cfg.methods), progress=progress)


@register_study_job("generate_train", GenerateTrainJob, outputs=GENERATE_TRAIN_OUTPUTS,
                    roles=lambda cfg: ["generator_lm"] if cfg.model in ("pepler", "xrec") else [],
                    description="seed 000's generators on Ray Tune (`rexeval generate train`)")
def _generate_train(cfg, overwrite, progress):
    from rexeval.pipelines.generate.pipeline import run_train

    # The study's overwrite is the job's own flag here.
    return run_train(cfg.model_copy(update={"overwrite": True}) if overwrite else cfg, progress=progress)


@register_study_job("evaluate", EvaluateConfig, keeps_changed_settings=True, serves=_evaluate_serves,
                    outputs=EVALUATE_OUTPUTS,
                    description="seed 000's metrics (`rexeval evaluate`)")
def _evaluate(cfg, progress):
    from rexeval.pipelines.evaluate.pipeline import run_evaluate

    # Never overwrite: the job recomputes the metric families whose settings changed.
    return run_evaluate(cfg, overwrite=False, progress=progress)
