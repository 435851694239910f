"""The study file: datasets, stages and models of a whole benchmark, as a typed model.

    name: local
    profile: local                   # model profile; `models` overrides roles for every stage
    out: runs/study-local            # or a URI (s3://bucket/studies/local); `rexeval study run --out` wins
    max_parallel: 2                  # independent stage instances run at once
    datasets:
      sample:
        inputs: [../pipelines/sample/reviews.jsonl]   # relative to this file
        meta: [../pipelines/sample/items.jsonl]
    stages:
      ingest: {job: ingest, with: {inputs: "{dataset.inputs}", meta: "{dataset.meta}"}}
      split:  {job: split, with: {input: "{ingest}"}}
      stats:  {job: stats, with: {input: "{split}"}}

A stage runs one existing job (`jobs.STUDY_JOBS`) with `with:` as that job's settings (the
keys of its command's `--config` file); the study fills in `out`, and the profile and
models where the job takes them. A stage runs once per dataset (`per_dataset`, the
default when the study has datasets) or once (`per_dataset: false`).

References inside `with:` values, resolved per instance:
  {stage}          output folder of that stage (the same dataset's instance)
  {stage@name}     ... of the instance for dataset `name`
  {stage@*}        the list of all its instances' folders (as a whole value)
  {dataset}        the dataset's name; {dataset.inputs}, {dataset.meta} (lists, as a whole
                   value), {dataset.category}, {dataset.format}, {dataset.<var>} from `vars`
  {vars.<name>}    a study variable (`vars:`; `rexeval study run --set name=value` overrides it)
  {here}, {out}    the study file's folder, the study's output folder
  ${VAR}, ${VAR:-default}   environment variables (e.g. ${REXEVAL_SHARED:-../shared})
A reference makes the stage depend on the stage it names; `after:` adds dependencies
that no value names. `when:` (e.g. "{vars.llm}") turns a stage off when false: it does not
run, and neither does any stage that reads its output. `optional: true`: a failure of
the stage (and the stages it then holds up) does not fail the study. Top-level keys
starting with "x-" are ignored: they hold YAML
anchors that stages merge in (`with: {<<: *train, model: nrt}`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rexeval.pipelines.core.storage import is_uri

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class StudyError(ValueError):
    """A study file that cannot run, with every problem found, each naming its key."""

    def __init__(self, file: str | Path, problems: list[str]):
        self.file, self.problems = str(file), problems
        super().__init__(f"{file}: " + ("\n  ".join(problems) if len(problems) == 1 else
                                        f"{len(problems)} problems:\n  " + "\n  ".join(problems)))


class DatasetSpec(BaseModel):
    """One dataset: its review files (and item metadata), for the stages to read."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str] = Field(min_length=1, description="review files (relative to the study file, or URIs)")
    meta: list[str] = Field(default_factory=list, description="item metadata files (the same)")
    format: str = "auto"
    category: str | None = None
    vars: dict[str, Any] = Field(default_factory=dict, description="values stages read as {dataset.<name>}")


class StageSpec(BaseModel):
    """One stage: the job it runs, that job's settings, where it runs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    job: str = Field(description="a study job (rexeval study jobs lists them)")
    with_: dict[str, Any] = Field(default_factory=dict, alias="with", description="the job's settings")
    per_dataset: bool | None = Field(None, description="once per dataset (default when the study has datasets)")
    datasets: list[str] | None = Field(None, description="only these datasets")
    after: list[str] = Field(default_factory=list, description="stages to finish first")
    when: bool | str = Field(True, description="false (or a reference resolving to false): the stage is off")
    optional: bool = Field(False, description="a failure here does not fail the study")


class StudyFile(BaseModel):
    """The whole study (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    profile: str = "local"
    models: dict[str, str | None] = Field(default_factory=dict, description="role -> model ref, every stage")
    out: str | None = Field(None, description="output folder (relative to the working directory) or URI")
    max_parallel: int = Field(2, ge=1, description="independent stage instances running at once")
    vars: dict[str, Any] = Field(default_factory=dict, description="values stages read as {vars.<name>}")
    datasets: dict[str, DatasetSpec] = Field(default_factory=dict)
    stages: dict[str, StageSpec] = Field(min_length=1)

    @field_validator("datasets", "stages")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for name in v:
            if not NAME.match(name):
                raise ValueError(f"{name!r} is not a usable name (letters, digits, _ and -, starting with a letter)")
        return v


def expand_env(value: Any) -> Any:
    """${VAR} and ${VAR:-default} in every string of `value`."""
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            got = os.environ.get(m.group(1))
            if got is None:
                if m.group(2) is None:
                    raise KeyError(m.group(1))
                return m.group(2)
            return got
        return ENV.sub(sub, value)
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    return value


def _where(loc: tuple) -> str:
    return ".".join("with" if p == "with_" else str(p) for p in loc)


def parse_sets(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """--set NAME=VALUE items (VALUE read as YAML: 3, true, null, [a, b], text)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"--set {item!r}: expected NAME=VALUE")
        out[name.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def load_study(path: str | Path, sets: dict[str, Any] | None = None) -> StudyFile:
    """Read and validate a study file; dataset paths are resolved against the file's
    folder (`_beside`), environment variables are expanded, `sets` override `vars`. Raises
    StudyError naming each bad key."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(path, ["no such study file"])
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise StudyError(path, [f"not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        raise StudyError(path, ["the file must be a mapping with name, datasets and stages"])
    # Top-level "x-..." keys hold YAML anchors for the stages to share (as in compose files).
    raw = {k: v for k, v in raw.items() if not str(k).startswith("x-")}
    try:
        raw = expand_env(raw)
    except KeyError as exc:
        raise StudyError(path, [f"environment variable {exc.args[0]} is not set (give a default: "
                                f"${{{exc.args[0]}:-value}})"]) from None
    try:
        study = StudyFile.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            where = _where(e["loc"])
            if e["type"] == "extra_forbidden":
                problems.append(f"{where}: unknown key")
            else:
                problems.append(f"{where}: {e['msg']}")
        raise StudyError(path, problems) from None
    unknown = sorted(set(sets or {}) - set(study.vars))
    if unknown:
        raise StudyError(path, [f"--set {name}: the study has no such var (vars: {', '.join(study.vars) or 'none'})"
                                for name in unknown])
    study.vars.update(sets or {})
    here = path.resolve().parent
    for ds in study.datasets.values():
        ds.inputs = [_beside(here, p) for p in ds.inputs]
        ds.meta = [_beside(here, p) for p in ds.meta]
    return study


def _beside(here: Path, path: str) -> str:
    """A dataset file as the stages get it: a URI as written, a local path against the
    study file's folder, relative to the working directory when it lies inside it and
    absolute otherwise.

    Why relative: a study submitted as a Ray job runs in its working dir unpacked under
    a folder of each node's own, so an absolute path there names one node's copy. Kept
    relative, the path names the same file on every node, and what the stages record
    from it (ingested rows' `source`, and so every table downstream and the upstream
    file sizes a job's settings hash counts) is the same whichever node's driver wrote
    it: a study killed on the head resumes from the worker instead of finding its
    folders written under other settings."""
    if is_uri(path):
        return path
    full = (here / path).resolve()
    cwd = Path.cwd().resolve()
    return str(full.relative_to(cwd)) if full.is_relative_to(cwd) else str(full)
