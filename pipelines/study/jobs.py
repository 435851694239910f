"""The jobs a study stage can run: each is the existing job's config class and run
function, called exactly as its command calls it (no second implementation of any
stage), and the model roles it cannot run without.

`STUDY_JOBS` is a registry (name -> StudyJob); adding a job to studies is one
`@register_study_job` here. A job's settings are its config class's fields (the YAML
keys of `--config FILE` for that command), with `out` filled in by the study.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rexeval.registry import Registry

STUDY_JOBS: Registry[StudyJob] = Registry("study job", name_attr=None)


@dataclass(frozen=True)
class StudyJob:
    """One kind of stage. `config` builds the job's config from the settings; `run(cfg,
    overwrite, progress)` runs it and returns its manifest or report; `roles(cfg)` are
    the model roles it needs from the profile; `keeps_changed_settings`: the job itself
    recomputes only what a changed setting touches (so the study never wipes its folder)."""

    name: str
    config: type[BaseModel]
    run: Callable[[Any, bool, Callable[[str], None]], dict]
    roles: Callable[[Any], list[str]] = field(default=lambda cfg: [])
    keeps_changed_settings: bool = False
    description: str = ""


def register_study_job(name: str, config: type[BaseModel], *, roles: Callable[[Any], list[str]] | None = None,
                       keeps_changed_settings: bool = False, description: str = ""):
    """Register `fn(cfg, overwrite, progress) -> dict` as the study job `name`."""
    def wrap(fn):
        STUDY_JOBS.add(name, StudyJob(name, config, fn, roles or (lambda cfg: []), keeps_changed_settings,
                                      description))
        return fn
    return wrap


def build_config(job: StudyJob, settings: dict[str, Any]) -> BaseModel:
    return job.config.model_validate(settings)


def has_field(config: type[BaseModel], name: str) -> bool:
    return name in config.model_fields


def _call(run: Callable, cfg, overwrite: bool, progress) -> dict:
    """Call a job's run function with what it takes (some jobs have no overwrite flag)."""
    params = inspect.signature(run).parameters
    kwargs = {"progress": progress}
    if "overwrite" in params:
        kwargs["overwrite"] = overwrite
    return run(cfg, **kwargs)


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


def _llm(role: str) -> Callable[[Any], list[str]]:
    return lambda cfg: [] if getattr(cfg, "backend", None) == "openai" else [role]


@register_study_job("ingest", IngestConfig, description="review files -> reviews/ + errors/ (`rexeval ingest`)")
def _ingest(cfg, overwrite, progress):
    from rexeval.pipelines.ingest.pipeline import run_ingest

    return _call(run_ingest, cfg, overwrite, progress)


@register_study_job("split", SplitConfig, description="k-core and temporal / leave-last-two split (`rexeval split`)")
def _split(cfg, overwrite, progress):
    from rexeval.pipelines.ingest.split_pipeline import run_split

    return _call(run_split, cfg, overwrite, progress)


class StatsConfig(BaseModel):
    """Seed 000's Table II of a split (what `rexeval info` prints), written to `out`."""

    input: str
    out: str
    name: str = "all"


@register_study_job("stats", StatsConfig, description="seed 000 Table II of a split (`rexeval info`)")
def _stats(cfg, overwrite, progress):
    import json

    import pyarrow.compute as pc

    from rexeval.pipelines.core.io import read_table, write_bytes_atomic, write_json_atomic
    from rexeval.pipelines.ingest.stats import dataset_stats, format_table

    splits = {n: read_table(Path(cfg.input) / n, "reviews") for n in ("train", "valid", "test")}
    stats = {}
    for cat in sorted(set(splits["train"].column("category").to_pylist()) - {None}):
        stats[cat] = dataset_stats({n: t.filter(pc.equal(t.column("category"), cat)) for n, t in splits.items()})
    stats[cfg.name] = dataset_stats(splits)
    table = format_table(stats)
    progress(table)
    out = Path(cfg.out)
    write_bytes_atomic(out / "table2.md", (table + "\n").encode())
    manifest = {"job": "stats", "status": "complete", "config": cfg.model_dump(), "stats": stats,
                "counts": {"datasets": len(stats)}}
    write_json_atomic(out / "stats.json", json.loads(json.dumps(manifest, default=float)))
    return manifest


@register_study_job("extract", ExtractConfig, roles=_llm("llm"),
                    description="reviews -> statements with an LLM (`rexeval extract`)")
def _extract(cfg, overwrite, progress):
    from rexeval.pipelines.extract.pipeline import run_extract

    return _call(run_extract, cfg, overwrite, progress)


@register_study_job("extract_quality", QualityConfig, roles=_llm("judge_llm"),
                    description="explanatoriness and atomicity of statements (`rexeval extract-quality`)")
def _extract_quality(cfg, overwrite, progress):
    from rexeval.pipelines.extract.quality import run_quality

    return _call(run_quality, cfg, overwrite, progress)


@register_study_job("ground_truth", GroundTruthConfig, description="rule-based explanations (`rexeval ground-truth`)")
def _ground_truth(cfg, overwrite, progress):
    from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth

    return _call(run_ground_truth, cfg, overwrite, progress)


@register_study_job("cluster", ClusterConfig, roles=lambda cfg: ["embedder"] if cfg.method == "star" else [],
                    description="paraphrase clusters or EXTRA (`rexeval cluster`)")
def _cluster(cfg, overwrite, progress):
    from rexeval.pipelines.cluster.pipeline import run_cluster

    return _call(run_cluster, cfg, overwrite, progress)


@register_study_job("star_build", BuildConfig, description="the STAR ranking benchmark (`rexeval star build`)")
def _star_build(cfg, overwrite, progress):
    from rexeval.pipelines.star.pipeline import run_build

    return _call(run_build, cfg, overwrite, progress)


class StarBaselinesConfig(EvalSettings):
    """`rexeval star baselines`: the popularity baselines ranked and scored."""

    methods: list[str] = ["random", "userpop", "itempop", "globalpop"]


@register_study_job("star_baselines", StarBaselinesConfig, description="ranking baselines (`rexeval star baselines`)")
def _star_baselines(cfg, overwrite, progress):
    from rexeval.pipelines.star.pipeline import run_baselines

    settings = EvalSettings(**cfg.model_dump(exclude={"methods"}))
    return run_baselines(settings, list(cfg.methods), progress=progress)


@register_study_job("star_train", StarTrainJob, description="BPER+ / ExpGCN on Ray Tune (`rexeval star train`)")
def _star_train(cfg, overwrite, progress):
    from rexeval.pipelines.star.pipeline import run_train

    return run_train(cfg, progress=progress)


@register_study_job("generate_train", GenerateTrainJob,
                    roles=lambda cfg: ["generator_lm"] if cfg.model in ("pepler", "xrec") else [],
                    description="seed 000's generators on Ray Tune (`rexeval generate train`)")
def _generate_train(cfg, overwrite, progress):
    from rexeval.pipelines.generate.pipeline import run_train

    if overwrite and not cfg.overwrite:
        cfg = cfg.model_copy(update={"overwrite": True})
    return run_train(cfg, progress=progress)


@register_study_job("generate_run", RunConfig, description="a trained generator decodes a split (`rexeval generate run`)")
def _generate_run(cfg, overwrite, progress):
    from rexeval.pipelines.generate.decode import run_generate

    return _call(run_generate, cfg, overwrite, progress)


@register_study_job("generate_llm", PromptedJob, roles=_llm("llm"),
                    description="seed 004's prompted generators (`rexeval generate llm`)")
def _generate_llm(cfg, overwrite, progress):
    from rexeval.pipelines.generate.prompted.job import run_prompted

    return run_prompted(cfg, progress=progress)


@register_study_job("evaluate", EvaluateConfig, keeps_changed_settings=True,
                    description="seed 000's metrics (`rexeval evaluate`)")
def _evaluate(cfg, overwrite, progress):
    from rexeval.pipelines.evaluate.pipeline import run_evaluate

    return run_evaluate(cfg, overwrite=False, progress=progress)


@register_study_job("judge_likert", LikertJobConfig, roles=lambda cfg: [] if cfg.judges else ["judge_llm"],
                    description="Likert ratings (`rexeval judge likert`)")
def _judge_likert(cfg, overwrite, progress):
    from rexeval.pipelines.judge.jobs import run_likert

    return run_likert(cfg, progress=progress)


@register_study_job("judge_pairwise", PairwiseJobConfig,
                    roles=lambda cfg: ["judge_llm"] if "gen" in cfg.evaluators else [],
                    description="pairwise verdicts against a baseline (`rexeval judge pairwise`)")
def _judge_pairwise(cfg, overwrite, progress):
    from rexeval.pipelines.judge.jobs import run_pairwise

    return run_pairwise(cfg, progress=progress)


@register_study_job("judge_detect", DetectJobConfig, roles=_llm("judge_llm"),
                    description="inferior-explanation detection (`rexeval judge detect`)")
def _judge_detect(cfg, overwrite, progress):
    from rexeval.pipelines.judge.jobs import run_detect

    return run_detect(cfg, progress=progress)


@register_study_job("judge_winrate", WinrateConfig, description="win rates, Table 4, Figure 5 (`rexeval judge winrate`)")
def _judge_winrate(cfg, overwrite, progress):
    from rexeval.pipelines.judge.winrate import run_winrate

    return run_winrate(cfg, progress=progress)


@register_study_job("meta_evaluate", MetaEvaluateConfig, description="agreement with humans (`rexeval meta-evaluate`)")
def _meta_evaluate(cfg, overwrite, progress):
    from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate

    return _call(run_meta_evaluate, cfg, overwrite, progress)


def counts_of(result: dict) -> dict[str, Any]:
    """The counts a job reports (its manifest's `counts`, else its top-level numbers)."""
    if isinstance(result.get("counts"), dict):
        return {k: v for k, v in result["counts"].items() if isinstance(v, (int, float, str))}
    return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
