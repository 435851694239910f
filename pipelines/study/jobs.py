"""The jobs a study stage can run: each is the existing job's config class and run
function, called exactly as its command calls it (no second implementation of any
stage), and the model roles it cannot run without.

`STUDY_JOBS` is a registry (name -> StudyJob); adding a job to studies is one
`@register_study_job` here. A job's settings are its config class's fields (the YAML
keys of `--config FILE` for that command), with `out` filled in by the study; fields typed
`ReadPath`/`OptionalReadPath`/`ReadPaths` (`pipelines/core/read_paths.py`) are the files
and folders it reads, checked for existence when the plan is built.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from rexeval.pipelines.core.read_paths import ReadPath  # noqa: E402
from rexeval.registry import Registry, load_object

STUDY_JOBS: Registry[StudyJob] = Registry("study job", name_attr=None)


@dataclass(frozen=True)
class ServeNeed:
    """A Serve application a stage's job would start for itself (and stop at its end).

    mode "shared": the study starts it once, before the first stage that needs it, and
    keeps it for every stage that needs the same one (`key`, a hash of what it serves);
    the jobs find it running and use it. `open(progress)` starts it (or joins one that
    runs) and returns its release; it must pickle (a partial of a module-level function):
    the study runs it in a process that holds the application. Mode "own": the job
    starts and stops it itself (the
    NLI service, which the evaluate job brings up only for its last families; several
    judges in one job); no other stage that needs the application runs meanwhile, since
    the first to finish would stop it under the other."""

    app: str
    key: str = ""
    mode: Literal["shared", "own"] = "shared"
    open: Callable[[Callable[[str], None]], Callable[[], None]] | None = None


@dataclass(frozen=True)
class StudyJob:
    """One kind of stage. `config` builds the job's config from the settings; `target` is
    the job's run function (or "module:function", imported when it runs), called with the
    config, `overwrite` where it takes it, and `progress`; `roles(cfg)` are
    the model roles it needs from the profile; `serves(cfg)` the Serve applications it
    would start (see ServeNeed); `keeps_changed_settings`: the job itself recomputes only
    what a changed setting touches (so the study never wipes its folder)."""

    name: str
    config: type[BaseModel]
    target: Callable[..., dict] | str
    roles: Callable[[Any], list[str]] = field(default=lambda cfg: [])
    keeps_changed_settings: bool = False
    description: str = ""
    serves: Callable[[Any], list[ServeNeed]] = field(default=lambda cfg: [])

    def run(self, cfg, overwrite: bool, progress: Callable[[str], None]) -> dict:
        fn = load_object(self.target) if isinstance(self.target, str) else self.target
        params = inspect.signature(fn).parameters
        kwargs: dict[str, Any] = {"progress": progress}
        if "overwrite" in params:
            kwargs["overwrite"] = overwrite
        return fn(cfg, **kwargs)


def add_study_job(name: str, config: type[BaseModel], target: str, *,
                  roles: Callable[[Any], list[str]] | None = None, description: str = "",
                  serves: Callable[[Any], list[ServeNeed]] | None = None) -> None:
    """Make the job whose run function is `target` ("module:function") a study job."""
    STUDY_JOBS.add(name, StudyJob(name, config, target, roles or (lambda cfg: []), False, description,
                                  serves or (lambda cfg: [])))


def register_study_job(name: str, config: type[BaseModel], *, roles: Callable[[Any], list[str]] | None = None,
                       keeps_changed_settings: bool = False, description: str = "",
                       serves: Callable[[Any], list[ServeNeed]] | None = None):
    """Register `fn(cfg, [overwrite,] progress) -> dict` as the study job `name`. The
    function must be importable by name (module level): each stage runs in a process of
    its own (`pipelines.study.stage_process`)."""
    def wrap(fn):
        STUDY_JOBS.add(name, StudyJob(name, config, fn, roles or (lambda cfg: []), keeps_changed_settings,
                                      description, serves or (lambda cfg: [])))
        return fn
    return wrap


def build_config(job: StudyJob, settings: dict[str, Any]) -> BaseModel:
    return job.config.model_validate(settings)


def has_field(config: type[BaseModel], name: str) -> bool:
    return name in config.model_fields


# -- the jobs ---------------------------------------------------------------------------
# Imports are inside the functions: building a study plan must not import torch & co.

from rexeval.pipelines.ingest.config import IngestConfig, SplitConfig  # noqa: E402
from rexeval.pipelines.extract.config import ExtractConfig, GroundTruthConfig, QualityConfig  # noqa: E402
from rexeval.pipelines.cluster.config import ClusterConfig  # noqa: E402
from rexeval.pipelines.star.config import BuildConfig, EvalSettings, TrainJob as StarTrainJob  # noqa: E402
from rexeval.pipelines.generate.config import RunConfig, TrainJob as GenerateTrainJob  # noqa: E402
from rexeval.pipelines.generate.prompted.config import PromptedJob  # noqa: E402
from rexeval.pipelines.evaluate.config import EvaluateConfig  # noqa: E402
from rexeval.pipelines.judge.config import DetectJobConfig, LikertJobConfig, PairwiseJobConfig  # noqa: E402
from rexeval.pipelines.judge.winrate import WinrateConfig  # noqa: E402
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig  # noqa: E402
from rexeval.pipelines.expscore.config import ENCODER_ROLE, ExpScoreScoreConfig, ExpScoreTrainConfig  # noqa: E402


def _llm(role: str) -> Callable[[Any], list[str]]:
    return lambda cfg: [] if getattr(cfg, "backend", None) == "openai" else [role]


def _served_llms(models: Callable[[Any], list[tuple[str, str | None]]]) -> Callable[[Any], list[ServeNeed]]:
    """The judge application(s) of a job whose LLM calls go through it: one per (role,
    model) in `models(cfg)`, exactly as the job builds them (`llm_chunks.JudgeService`).
    None when the job calls a given service or runs its LLM in-process; one shared
    application when every call wants the same; the job's own otherwise."""
    def serves(cfg) -> list[ServeNeed]:
        if cfg.judge_service != "auto":
            return []
        from rexeval.models.profiles import load_profile
        from rexeval.pipelines.core.llm_chunks import JudgeService, llm_spec

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
    from rexeval.pipelines.core.llm_chunks import JudgeService

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


def _expscore_roles(cfg) -> list[str]:
    """ExpScore's relevance factor encodes with the profile's sentence encoder unless the
    settings name one (`embedder`)."""
    return [] if cfg.embedder else [ENCODER_ROLE]


# Jobs whose run function takes (cfg, [overwrite,] progress): name, settings, function,
# the model roles they need, what they do.
P = "rexeval.pipelines."
SERVES = {
    "generate_llm": _served_llms(_prompted_llm_methods),
    "judge_likert": _served_llms(lambda cfg: [("judge_llm", m) for m in cfg.judges or [None]]),
    "judge_pairwise": _served_llms(lambda cfg: [("judge_llm", None)] if "gen" in cfg.evaluators else []),
    "judge_detect": _served_llms(lambda cfg: [("llm", cfg.generator)]
                                 + ([("judge_llm", None)] if "gen" in cfg.evaluators else [])),
}
for _name, _config, _target, _roles, _what in [
    ("ingest", IngestConfig, "ingest.pipeline:run_ingest", None,
     "review files -> reviews/ + errors/ (`rexeval ingest`)"),
    ("split", SplitConfig, "ingest.split_pipeline:run_split", None,
     "k-core and temporal / leave-last-two split (`rexeval split`)"),
    ("extract", ExtractConfig, "extract.pipeline:run_extract", _llm("llm"),
     "reviews -> statements with an LLM (`rexeval extract`)"),
    ("extract_quality", QualityConfig, "extract.quality:run_quality", _llm("judge_llm"),
     "explanatoriness and atomicity of statements (`rexeval extract-quality`)"),
    ("ground_truth", GroundTruthConfig, "extract.ground_truth_pipeline:run_ground_truth", None,
     "rule-based explanations (`rexeval ground-truth`)"),
    ("cluster", ClusterConfig, "cluster.pipeline:run_cluster", lambda cfg: ["embedder"] if cfg.method == "star" else [],
     "paraphrase clusters or EXTRA (`rexeval cluster`)"),
    ("star_build", BuildConfig, "star.pipeline:run_build", None,
     "the STAR ranking benchmark (`rexeval star build`)"),
    ("star_train", StarTrainJob, "star.pipeline:run_train", None,
     "BPER+ / ExpGCN on Ray Tune (`rexeval star train`)"),
    ("generate_run", RunConfig, "generate.decode:run_generate", None,
     "a trained generator decodes a split (`rexeval generate run`)"),
    ("generate_llm", PromptedJob, "generate.prompted.job:run_prompted", _llm("llm"),
     "seed 004's prompted generators (`rexeval generate llm`)"),
    ("judge_likert", LikertJobConfig, "judge.jobs:run_likert", lambda cfg: [] if cfg.judges else ["judge_llm"],
     "Likert ratings (`rexeval judge likert`)"),
    ("judge_pairwise", PairwiseJobConfig, "judge.jobs:run_pairwise", lambda cfg: ["judge_llm"] if "gen" in cfg.evaluators else [],
     "pairwise verdicts against a baseline (`rexeval judge pairwise`)"),
    ("judge_detect", DetectJobConfig, "judge.jobs:run_detect", _llm("judge_llm"),
     "inferior-explanation detection (`rexeval judge detect`)"),
    ("judge_winrate", WinrateConfig, "judge.winrate:run_winrate", None,
     "win rates, Table 4, Figure 5 (`rexeval judge winrate`)"),
    ("meta_evaluate", MetaEvaluateConfig, "meta_evaluate.pipeline:run_meta_evaluate", None,
     "agreement with humans (`rexeval meta-evaluate`)"),
    ("expscore_train", ExpScoreTrainConfig, "expscore.pipeline:run_train", _expscore_roles,
     "seed 003's ExpScore heads trained on human ratings (`rexeval expscore train`)"),
    ("expscore_score", ExpScoreScoreConfig, "expscore.pipeline:run_score", _expscore_roles,
     "explanations scored with a trained ExpScore model (`rexeval expscore score`)"),
]:
    add_study_job(_name, _config, P + _target, roles=_roles, description=_what, serves=SERVES.get(_name))


def _finish(cfg, job: str, counts: dict[str, Any], file: str = "manifest.json", **extra: Any) -> dict:
    """The manifest of a job the study runs itself (JSON-safe), written to OUT/`file`."""
    import json

    from rexeval.pipelines.core.io import config_hash, write_json_atomic
    from rexeval.pipelines.core.storage import location

    manifest = {"job": job, "status": "complete", "config": cfg.model_dump(),
                "config_hash": config_hash(cfg.model_dump(exclude={"out"})), "counts": counts, **extra}
    manifest = json.loads(json.dumps(manifest, default=float))
    write_json_atomic(location(cfg.out) / file, manifest)
    return manifest


class StatsConfig(BaseModel):
    """Seed 000's Table II of a split (what `rexeval info` prints), written to `out`."""

    input: ReadPath
    out: str
    name: str = "all"


@register_study_job("stats", StatsConfig, description="seed 000 Table II of a split (`rexeval info`)")
def _stats(cfg, progress):
    import pyarrow.compute as pc

    from rexeval.pipelines.core.io import read_table, write_bytes_atomic
    from rexeval.pipelines.core.storage import location
    from rexeval.pipelines.ingest.stats import dataset_stats, format_table

    splits = {n: read_table(location(cfg.input) / n, "reviews") for n in ("train", "valid", "test")}
    stats = {}
    for cat in sorted(set(splits["train"].column("category").to_pylist()) - {None}):
        stats[cat] = dataset_stats({n: t.filter(pc.equal(t.column("category"), cat)) for n, t in splits.items()})
    stats[cfg.name] = dataset_stats(splits)
    table = format_table(stats)
    progress(table)
    write_bytes_atomic(location(cfg.out) / "table2.md", (table + "\n").encode())
    return _finish(cfg, "stats", {"datasets": len(stats)}, file="stats.json", stats=stats)


class AnnotationsConfig(BaseModel):
    """Hand-written statements (JSON lines, pipelines/sample/statements.jsonl's format) as
    a statements folder, for the jobs that read `rexeval extract` output."""

    input: ReadPath
    out: str
    stage: str = "verified"


@register_study_job("annotations", AnnotationsConfig,
                    description="hand-written statements (JSON lines) -> a statements folder")
def _annotations(cfg, progress):
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.core.io import write_parquet_atomic
    from rexeval.pipelines.core.storage import location

    table = statements_from_annotations(cfg.input, stage=cfg.stage)
    write_parquet_atomic(location(cfg.out) / "statements" / "part-00000.parquet", table)
    progress(f"annotations: {table.num_rows} statement(s) from {cfg.input}")
    return _finish(cfg, "annotations", {"statements": table.num_rows})


class FlipConfig(BaseModel):
    """Seed 000's sanity benchmark: rule-built ground truth from hand-written statements
    and a copy with every sentiment flipped (`evaluate.inputs.write_flip_benchmark`):
    OUT/ground_truth (references), OUT/explanations.parquet, OUT/statements.parquet."""

    input: ReadPath
    out: str
    system: str = "flipped"


@register_study_job("flip_benchmark", FlipConfig,
                    description="ground truth and a sentiment-flipped copy from hand-written statements")
def _flip(cfg, progress):
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.evaluate.inputs import write_flip_benchmark

    paths = write_flip_benchmark(statements_from_annotations(cfg.input, stage="triplet"), cfg.out, cfg.system)
    progress(f"flip benchmark: {', '.join(f'{k} {v}' for k, v in paths.items())}")
    return _finish(cfg, "flip_benchmark", {"systems": 2}, paths=paths)


class StarBaselinesConfig(EvalSettings):
    """`rexeval star baselines`: the popularity baselines ranked and scored."""

    methods: list[str] = ["random", "userpop", "itempop", "globalpop"]


@register_study_job("star_baselines", StarBaselinesConfig, description="ranking baselines (`rexeval star baselines`)")
def _star_baselines(cfg, progress):
    from rexeval.pipelines.star.pipeline import run_baselines

    return run_baselines(EvalSettings(**cfg.model_dump(exclude={"methods"})), list(cfg.methods), progress=progress)


@register_study_job("generate_train", GenerateTrainJob,
                    roles=lambda cfg: ["generator_lm"] if cfg.model in ("pepler", "xrec") else [],
                    description="seed 000's generators on Ray Tune (`rexeval generate train`)")
def _generate_train(cfg, overwrite, progress):
    from rexeval.pipelines.generate.pipeline import run_train

    # The study's overwrite is the job's own flag here.
    return run_train(cfg.model_copy(update={"overwrite": True}) if overwrite else cfg, progress=progress)


@register_study_job("evaluate", EvaluateConfig, keeps_changed_settings=True, serves=_evaluate_serves,
                    description="seed 000's metrics (`rexeval evaluate`)")
def _evaluate(cfg, progress):
    from rexeval.pipelines.evaluate.pipeline import run_evaluate

    # Never overwrite: the job recomputes the metric families whose settings changed.
    return run_evaluate(cfg, overwrite=False, progress=progress)


def counts_of(result: dict) -> dict[str, Any]:
    """The counts a job reports (its manifest's `counts`, else its top-level numbers)."""
    if isinstance(result.get("counts"), dict):
        return {k: v for k, v in result["counts"].items() if isinstance(v, (int, float, str))}
    return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
