"""What a study job is, and the registry of them (`STUDY_JOBS`, name -> StudyJob).

A study step runs one job (`pipelines/study/`). A job is the existing command's config
class and run function, the model roles and Serve applications it needs, and what it
writes (`outputs`, `pipelines/core/outputs.py`): the study report and the study plan read
that declaration instead of repeating file names.

Adding a job is one file: a module `rexeval.pipelines.<capability>.study_job` that
registers it,

    @register_study_job("my_job", MyJobConfig, outputs=OUTPUTS, description="...")
    def run_my_job(cfg, progress): ...

The registry imports every such module (and `pipelines/study/builtin_jobs.py`, which holds the
built-in jobs) before it lists its names (`names()`, iterating) or reports one unknown
(`lookup`), so the job is then usable in a study file (`job: my_job`) and listed by
`rexeval study jobs`; nothing else names it. (`name in STUDY_JOBS` and `STUDY_JOBS[name]`
see what is imported already: ask `names()` first, as the study plan does.) The module must be cheap to import (a study plan imports it:
heavy imports go inside the run function), and the function must sit at module level:
each step runs in a process of its own, which imports it by name.

This module lives in `pipelines/core/` so that a capability's `study_job` module can
import it without importing `pipelines/study` (which imports every capability).
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from rexeval.pipelines.core.io import MANIFEST
from rexeval.pipelines.core.outputs import Outputs
from rexeval.registry import Registry, load_object

BUILT_IN = "rexeval.pipelines.study.builtin_jobs"
STUDY_JOB_MODULE = "study_job"  # rexeval.pipelines.<capability>.study_job


def study_job_modules() -> tuple[str, ...]:
    """Every `rexeval.pipelines.<capability>.study_job` module there is (sorted)."""
    import rexeval.pipelines as pipelines

    found = []
    for info in pkgutil.iter_modules(pipelines.__path__):
        name = f"{pipelines.__name__}.{info.name}.{STUDY_JOB_MODULE}"
        if info.ispkg and importlib.util.find_spec(name) is not None:
            found.append(name)
    return tuple(sorted(found))


@dataclass(frozen=True)
class ServeNeed:
    """A Serve application a step's job would start for itself (and stop at its end).

    mode "shared": the study starts it once, before the first step that needs it, and
    keeps it for every step that needs the same one (`key`, a hash of what it serves);
    the jobs find it running and use it. `open(progress)` starts it (or joins one that
    runs) and returns its release; it must pickle (a partial of a module-level function):
    the study runs it in a process that holds the application. Mode "own": the job
    starts and stops it itself (the
    NLI service, which the evaluate job brings up only for its last families; several
    judges in one job); no other step that needs the application runs meanwhile, since
    the first to finish would stop it under the other."""

    app: str
    key: str = ""
    mode: Literal["shared", "own"] = "shared"
    open: Callable[[Callable[[str], None]], Callable[[], None]] | None = None


@dataclass(frozen=True)
class StudyJob:
    """One kind of step. `config` builds the job's config from the settings; `target` is
    the job's run function (or "module:function", imported when it runs), called with the
    config, `overwrite` where it takes it, and `progress`; `roles(cfg)` are
    the model roles it needs from the profile; `serves(cfg)` the Serve applications it
    would start (see ServeNeed); `keeps_changed_settings`: the job itself recomputes only
    what a changed setting touches (so the study never wipes its folder); `outputs`: the
    files and folders it writes in its `out` folder (`pipelines/core/outputs.py`)."""

    name: str
    config: type[BaseModel]
    target: Callable[..., dict] | str
    roles: Callable[[Any], list[str]] = field(default=lambda cfg: [])
    keeps_changed_settings: bool = False
    description: str = ""
    serves: Callable[[Any], list[ServeNeed]] = field(default=lambda cfg: [])
    outputs: Outputs = field(default_factory=Outputs)

    def run(self, cfg, overwrite: bool, progress: Callable[[str], None]) -> dict:
        """Run the job on `cfg`, its output first checked apart from its inputs (as every
        command does it, `overlap.check_output_apart`)."""
        from rexeval.pipelines.core.overlap import check_output_apart

        check_output_apart(cfg)
        fn = load_object(self.target) if isinstance(self.target, str) else self.target
        params = inspect.signature(fn).parameters
        kwargs: dict[str, Any] = {"progress": progress}
        if "overwrite" in params:
            kwargs["overwrite"] = overwrite
        return fn(cfg, **kwargs)


STUDY_JOBS: Registry[StudyJob] = Registry("study job", name_attr=None, modules=(BUILT_IN,),
                                          discover=study_job_modules)


def add_study_job(name: str, config: type[BaseModel], target: str, *,
                  roles: Callable[[Any], list[str]] | None = None, description: str = "",
                  serves: Callable[[Any], list[ServeNeed]] | None = None, outputs: Outputs | None = None) -> None:
    """Make the job whose run function is `target` ("module:function") a study job."""
    STUDY_JOBS.add(name, StudyJob(name, config, target, roles or (lambda cfg: []), False, description,
                                  serves or (lambda cfg: []), outputs or Outputs()))


def register_study_job(name: str, config: type[BaseModel], *, roles: Callable[[Any], list[str]] | None = None,
                       keeps_changed_settings: bool = False, description: str = "",
                       serves: Callable[[Any], list[ServeNeed]] | None = None, outputs: Outputs | None = None):
    """Register `fn(cfg, [overwrite,] progress) -> dict` as the study job `name`. The
    function must be importable by name (module level): each step runs in a process of
    its own (`pipelines.study.step_process`)."""
    def wrap(fn):
        STUDY_JOBS.add(name, StudyJob(name, config, fn, roles or (lambda cfg: []), keeps_changed_settings,
                                      description, serves or (lambda cfg: []), outputs or Outputs()))
        return fn
    return wrap


def build_config(job: StudyJob, settings: dict[str, Any]) -> BaseModel:
    return job.config.model_validate(settings)


def has_field(config: type[BaseModel], name: str) -> bool:
    return name in config.model_fields


def write_manifest(cfg, job: str, counts: dict[str, Any], file: str = MANIFEST, **extra: Any) -> dict:
    """The manifest of a job the study runs itself (JSON-safe), written to OUT/`file`."""
    from rexeval.pipelines.core.io import config_hash, unset_fields, write_json_atomic
    from rexeval.storage import location

    manifest = {"job": job, "status": "complete", "config": cfg.model_dump(),
                "config_hash": config_hash(cfg.model_dump(exclude={"out"} | unset_fields(cfg, "columns"))),
                "counts": counts, **extra}
    manifest = json.loads(json.dumps(manifest, default=float))
    write_json_atomic(location(cfg.out) / file, manifest)
    return manifest


def counts_of(result: dict) -> dict[str, Any]:
    """The counts a job reports (its manifest's `counts`, else its top-level numbers)."""
    if isinstance(result.get("counts"), dict):
        return {k: v for k, v in result["counts"].items() if isinstance(v, (int, float, str))}
    return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
