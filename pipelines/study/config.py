"""The study file: datasets, steps and models of a whole benchmark, as a typed model.

    name: local
    profile: local                   # model profile; `models` overrides roles for every step
    out: runs/study-local            # or a URI (s3://bucket/studies/local); `rexeval study run --out` wins
    max_parallel: 2                  # independent step instances run at once
    steps_as: auto                   # auto | process | job (see below)
    driver_resources: {num_cpus: 1}  # what a step's driver asks for when it runs as a Ray job
    datasets:
      sample:
        inputs: [../pipelines/sample/reviews.jsonl]   # relative to this file
        meta: [../pipelines/sample/items.jsonl]
    steps:
      ingest: {job: ingest, with: {inputs: "{dataset.inputs}", meta: "{dataset.meta}"}}
      split:  {job: split, with: {input: "{ingest}"}}
      stats:  {job: stats, with: {input: "{split}"}}

A step runs one existing job (`core.study_registry.STUDY_JOBS`) with `with:` as that job's settings (the
keys of its command's `--config` file); the study fills in `out`, and the profile and
models where the job takes them. A step runs once per dataset (`per_dataset`, the
default when the study has datasets) or once (`per_dataset: false`).

References inside `with:` values, resolved per instance:
  {step}           output folder of that step (the same dataset's instance)
  {step@name}      ... of the instance for dataset `name`
  {step@*}         the list of all its instances' folders (as a whole value)
  {dataset}        the dataset's name; {dataset.inputs}, {dataset.meta} (lists, as a whole
                   value), {dataset.category}, {dataset.format}, {dataset.<var>} from `vars`
  {vars.<name>}    a study variable (`vars:`; `rexeval study run --set name=value` overrides it)
  {here}, {out}    the study file's folder, the study's output folder
  ${VAR}, ${VAR:-default}   environment variables (e.g. ${REXEVAL_SHARED:-../shared})
A reference makes the step depend on the step it names; `after:` adds dependencies
that no value names. `when:` (e.g. "{vars.llm}") turns a step off when false: it does not
run, and neither does any step that reads its output. `optional: true`: a failure of
the step (and the steps it then holds up) does not fail the study. Top-level keys
starting with "x-" are ignored: they hold YAML
anchors that steps merge in (`with: {<<: *train, model: nrt}`).

Where a step's driver runs (`steps_as`): "process", a process of the study's own driver
(forked in milliseconds: a laptop); "job", a Ray job of its own submitted to the cluster
with `driver_resources` as its entrypoint resources, so it runs on whichever node has
them (a worker; on an autoscaling cluster the autoscaler adds one); "auto" (the default),
jobs when the study joined a running cluster that has a job server, processes when the
study started Ray itself. `rexeval study run --steps-as` and REXEVAL_STEPS_AS override
the file. A step's own `driver_resources` override the study's, field by field.

Files written when a step was called a "stage" say `stages:` and `stages_as:`; they are
read as `steps:` and `steps_as:` (`OLD_KEY_NAMES`).

A file with mistakes is still read as far as it can be (`load_study`): an unknown key is
left out, a bad optional value falls back to its default, a step or dataset that cannot
be read at all is left out; what was wrong is kept with the study (`load_problems`), and
the plan reports it together with every problem of its own, so one dry run shows them all.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from rexeval.storage import is_uri

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class StudyError(ValueError):
    """A study file that cannot run, with every problem found, each naming its key."""

    def __init__(self, file: str | Path, problems: list[str]):
        self.file, self.problems = str(file), problems
        super().__init__(f"{file}: " + ("\n  ".join(problems) if len(problems) == 1 else
                                        f"{len(problems)} problems:\n  " + "\n  ".join(problems)))


class DatasetSpec(BaseModel):
    """One dataset: its review files (and item metadata), for the steps to read."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str] = Field(min_length=1, description="review files (relative to the study file, or URIs)")
    meta: list[str] = Field(default_factory=list, description="item metadata files (the same)")
    format: str = "auto"
    category: str | None = None
    vars: dict[str, Any] = Field(default_factory=dict, description="values steps read as {dataset.<name>}")


STEPS_AS = ("auto", "process", "job")


class DriverResources(BaseModel):
    """What a step's driver asks the cluster for when the step runs as a Ray job (its
    entrypoint resources): the driver runs on a node that has them, and on an
    autoscaling cluster a request no node can meet makes the autoscaler add one. All
    zero: Ray runs the driver on the head."""

    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)
    memory: int | None = Field(None, ge=0, description="bytes")
    resources: dict[str, float] = Field(default_factory=dict, description="custom resources, e.g. {driver: 1}")

    def over(self, base: "DriverResources") -> "DriverResources":
        """`base` with the fields this one sets (a step's own over the study's)."""
        return base.model_copy(update=self.model_dump(exclude_unset=True))


class StepSpec(BaseModel):
    """One step: the job it runs, that job's settings, where it runs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    job: str = Field(description="a study job (rexeval study jobs lists them)")
    with_: dict[str, Any] = Field(default_factory=dict, alias="with", description="the job's settings")
    per_dataset: bool | None = Field(None, description="once per dataset (default when the study has datasets)")
    datasets: list[str] | None = Field(None, description="only these datasets")
    after: list[str] = Field(default_factory=list, description="steps to finish first")
    when: bool | str = Field(True, description="false (or a reference resolving to false): the step is off")
    optional: bool = Field(False, description="a failure here does not fail the study")
    driver_resources: DriverResources | None = Field(None, description="the study's, field by field overridden")


class StudyFile(BaseModel):
    """The whole study (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    profile: str = "local"
    models: dict[str, str | None] = Field(default_factory=dict, description="role -> model ref, every step")
    out: str | None = Field(None, description="output folder (relative to the working directory) or URI")
    max_parallel: int = Field(2, ge=1, description="independent step instances running at once")
    steps_as: Literal["auto", "process", "job"] = Field("auto", description="where a step's driver runs")
    driver_resources: DriverResources = Field(default_factory=DriverResources,
                                              description="a step's driver as a Ray job asks for these")
    vars: dict[str, Any] = Field(default_factory=dict, description="values steps read as {vars.<name>}")
    datasets: dict[str, DatasetSpec] = Field(default_factory=dict)
    steps: dict[str, StepSpec] = Field(min_length=1)
    _load_problems: list[str] = PrivateAttr(default_factory=list)
    _dropped: set[str] = PrivateAttr(default_factory=set)

    @property
    def load_problems(self) -> list[str]:
        """What was wrong in the file and left out when it was read (the plan reports it)."""
        return self._load_problems

    @property
    def dropped(self) -> set[str]:
        """"steps.NAME" / "datasets.NAME" left out for their problems: references to them
        are not reported a second time."""
        return self._dropped

    def driver_of(self, step: str) -> DriverResources:
        """The entrypoint resources of `step`'s driver when it runs as a Ray job."""
        own = self.steps[step].driver_resources
        return own.over(self.driver_resources) if own is not None else self.driver_resources

    @field_validator("datasets", "steps")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for name in v:
            if not NAME.match(name):
                raise ValueError(f"{name!r} is not a usable name (letters, digits, _ and -, starting with a letter)")
        return v


def missing_env(value: Any) -> list[str]:
    """The ${VAR}s (without a default) in `value` that the environment lacks, each once."""
    if isinstance(value, str):
        return [m.group(1) for m in ENV.finditer(value) if m.group(2) is None and m.group(1) not in os.environ]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return list(dict.fromkeys(name for v in items for name in missing_env(v)))


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
        raise StudyError(path, ["the file must be a mapping with name, datasets and steps"])
    # Top-level "x-..." keys hold YAML anchors for the steps to share (as in compose files).
    raw = {k: v for k, v in raw.items() if not str(k).startswith("x-")}
    raw = _old_key_names(path, raw)
    if unset := missing_env(raw):
        raise StudyError(path, [f"environment variable {name} is not set (give a default: ${{{name}:-value}})"
                                for name in unset])
    study = _readable_part(path, expand_env(raw))
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


OLD_KEY_NAMES = {"stages": "steps", "stages_as": "steps_as"}  # before issue 51 a step was a "stage"


def _old_key_names(path: Path, raw: dict) -> dict:
    """`raw` with the keys that studies written before the rename use (`stages:`,
    `stages_as:`) read as today's; a file with both names of one key is refused."""
    both = [f"{old}: and {new}: are one key ({old} is its old name); keep {new}"
            for old, new in OLD_KEY_NAMES.items() if old in raw and new in raw]
    if both:
        raise StudyError(path, both)
    return {OLD_KEY_NAMES.get(k, k): v for k, v in raw.items()}


MAX_PASSES = 20  # each pass leaves out at least one bad part; a file has far fewer


def _readable_part(path: Path, raw: dict) -> StudyFile:
    """The study `raw` describes, less what is wrong in it (kept as its `load_problems`),
    so that the plan can check the rest and report everything at once. Raises StudyError
    when nothing usable is left (no name, no step)."""
    problems: list[str] = []
    dropped: set[str] = set()
    for _ in range(MAX_PASSES):
        try:
            study = StudyFile.model_validate(raw)
        except ValidationError as exc:
            errors = exc.errors()
            problems.extend(_problem(e) for e in errors)
            if not all([_leave_out(raw, e, dropped) for e in errors]) or raw.get("steps") == {}:
                raise StudyError(path, problems) from None  # nothing left to plan
            continue
        study._load_problems, study._dropped = problems, dropped
        return study
    raise StudyError(path, problems)


def _problem(error: dict) -> str:
    where = _where(error["loc"]) or "(file)"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key"
    return f"{where}: {error['msg'].removeprefix('Value error, ')}"


def _optional(model: type[BaseModel]) -> set[str]:
    """The keys of `model` that have a default (a bad value there can fall back to it)."""
    return {info.alias or name for name, info in model.model_fields.items() if not info.is_required()}


def _delete(raw: Any, loc: tuple) -> bool:
    """Remove the key at `loc` from the nested mappings `raw` (False: nothing there)."""
    for part in loc[:-1]:
        if not isinstance(raw, dict) or part not in raw:
            return False
        raw = raw[part]
    if isinstance(raw, dict) and loc and loc[-1] in raw:
        del raw[loc[-1]]
        return True
    return False


def _leave_out(raw: dict, error: dict, dropped: set[str]) -> bool:
    """Leave out of `raw` the part `error` is about: an unknown key, a bad optional value
    (its default applies), else the whole step or dataset. False: it cannot be left out."""
    loc = error["loc"]
    if len(loc) >= 2 and f"{loc[0]}.{loc[1]}" in dropped:
        return True  # its step or dataset is left out already, for another of its errors
    if error["type"] == "extra_forbidden":
        return _delete(raw, loc)
    if not loc:
        return False
    if loc[0] in ("steps", "datasets") and isinstance(raw.get(loc[0]), dict):
        entries, spec = raw[loc[0]], StepSpec if loc[0] == "steps" else DatasetSpec
        if len(loc) == 1:  # a name the field validator refused
            bad = [n for n in entries if not NAME.match(str(n))]
        elif len(loc) >= 3 and loc[2] in _optional(spec):
            return _delete(raw, loc[:3])
        else:
            bad = [loc[1]] if loc[1] in entries else []
        for name in bad:
            del entries[name]
            dropped.add(f"{loc[0]}.{name}")
        return bool(bad)
    return loc[0] in _optional(StudyFile) and _delete(raw, loc[:1])


def _beside(here: Path, path: str) -> str:
    """A dataset file as the steps get it: a URI as written, a local path against the
    study file's folder, relative to the working directory when it lies inside it and
    absolute otherwise.

    Why relative: a study submitted as a Ray job runs in its working dir unpacked under
    a folder of each node's own, so an absolute path there names one node's copy. Kept
    relative, the path names the same file on every node, and what the steps record
    from it (ingested rows' `source`, and so every table downstream and the upstream
    file sizes a job's settings hash counts) is the same whichever node's driver wrote
    it: a study killed on the head resumes from the worker instead of finding its
    folders written under other settings."""
    if is_uri(path):
        return path
    full = (here / path).resolve()
    cwd = Path.cwd().resolve()
    return str(full.relative_to(cwd)) if full.is_relative_to(cwd) else str(full)
