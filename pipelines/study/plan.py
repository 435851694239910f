"""A study file -> the graph of step instances it runs, checked before anything runs.

Each step becomes one instance per dataset ("extract@mi") or one instance ("winrate").
References in its settings are resolved to output folders, which gives the edges; the
graph must be acyclic. Every problem a user can fix is found here, before any job
starts: an unknown job, a reference to no step or dataset, a cycle, a missing input
file, a file read from another step's folder that its job does not write (the jobs
declare their outputs), settings the job's config refuses (its ranges included), a model
role the profile lacks. Every check runs whatever the others found, and one StudyError
lists all the problems, one line each naming the step and the setting.

The study's folder may be a URI (`s3://bucket/studies/x`): every instance's folder is
then under it, and input files named by URI are checked and fingerprinted through the
storage module like local ones.

An instance's fingerprint hashes its job, its resolved settings (a local file they name
counts by its content, not its path: `io.content_identity`), the sizes and times of the
files by URI it reads from outside the study, and its upstream instances' fingerprints:
a changed setting or an edited input changes the fingerprints of that instance and of
everything downstream, and nothing else; the same inputs found under another folder
(the working dir unpacked on another node) change nothing. The state file (`study.json`) remembers the fingerprint each instance
last completed with; an instance whose fingerprint is unchanged is done.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rexeval.pipelines.core.io import content_identity
from rexeval.pipelines.core.read_paths import path_values, read_settings, why_missing
from rexeval.storage import Location, is_uri, location
from rexeval.pipelines.study.config import StudyError, StudyFile
from rexeval.pipelines.core.study_registry import STUDY_JOBS, StudyJob, build_config, has_field

REF = re.compile(r"\{([A-Za-z][A-Za-z0-9_.\-]*(?:@(?:\*|[A-Za-z][A-Za-z0-9_\-]*))?)\}")
FALSE = (False, None, 0, "", "false", "False", "no", "off", "0")
STATE_FILE = "study.json"


@dataclass
class Instance:
    """One run of one step (for one dataset, or for the study)."""

    key: str
    step: str
    job: StudyJob
    dataset: str | None
    out: Location
    settings: dict[str, Any] = field(default_factory=dict)
    deps: set[str] = field(default_factory=set)
    reads: list[str] = field(default_factory=list)
    fingerprint: str = ""


@dataclass
class Plan:
    study: StudyFile
    file: Path
    out: Location  # a local folder or a URI (every step's folder, the state and the logs are under it)
    instances: dict[str, Instance]
    order: list[str]
    off: dict[str, str] = field(default_factory=dict)  # instance -> why it does not run (`when`)

    def downstream(self, key: str) -> set[str]:
        out, todo = set(), [key]
        while todo:
            k = todo.pop()
            for other in self.instances.values():
                if k in other.deps and other.key not in out:
                    out.add(other.key)
                    todo.append(other.key)
        return out

    def chains(self) -> dict[str, int]:
        """Instance -> the most steps that must still run after it, one after another
        (0 for a step nothing waits on): the study's critical path, counted in steps,
        so the runner starts the step that holds up the most work first."""
        below: dict[str, int] = {}
        for key in reversed(self.order):  # every dependent comes later in `order`
            below[key] = max((below[o] + 1 for o, inst in self.instances.items() if key in inst.deps), default=0)
        return below


def _instances_of(study: StudyFile, step: str) -> list[str | None]:
    spec = study.steps[step]
    per = spec.per_dataset if spec.per_dataset is not None else bool(study.datasets)
    if not per:
        return [None]
    return list(spec.datasets or study.datasets)


def instance_key(step: str, dataset: str | None) -> str:
    return step if dataset is None else f"{step}@{dataset}"


class _Said(LookupError):
    """A reference to a step or dataset whose own problem is reported already."""


class _Resolver:
    """Resolves the references of one instance's settings; records what it depends on."""

    def __init__(self, plan_out: Location, here: Path, study: StudyFile, outs: dict[str, Location],
                 dataset: str | None, where: str, problems: list[str], quiet: set[str] = frozenset()):
        self.out, self.here, self.study, self.outs = plan_out, here, study, outs
        self.dataset, self.where, self.problems, self.quiet = dataset, where, problems, quiet
        self.deps: set[str] = set()
        self.bad: set[str] = set()  # settings (top-level keys) with a reference that did not resolve

    def value(self, ref: str) -> Any:
        if ref == "here":
            return str(self.here)
        if ref == "out":
            return str(self.out)
        if ref.startswith("vars."):
            name = ref[5:]
            if name not in self.study.vars:
                raise LookupError(f"{{{ref}}}: no var {name!r} (vars: {', '.join(self.study.vars) or 'none'})")
            return self.study.vars[name]
        if ref == "dataset" or ref.startswith("dataset."):
            return self._dataset(ref)
        step, _, at = ref.partition("@")
        try:
            return self._step(ref, step, at)
        except LookupError:
            if step in self.quiet or f"steps.{step}" in self.study.dropped or f"datasets.{at}" in self.study.dropped:
                raise _Said(ref) from None
            raise

    def _step(self, ref: str, step: str, at: str) -> Any:
        """The output folder(s) `{step}`, `{step@name}` or `{step@*}` names."""
        if step not in self.study.steps:
            raise LookupError(f"{{{ref}}} names no step (steps: {', '.join(self.study.steps)})")
        if at == "*":
            keys = [k for k in self.outs if k == step or k.startswith(f"{step}@")]
            self.deps.update(keys)
            return [str(self.outs[k]) for k in keys]
        target = at or None
        if target is None and self.dataset is not None and f"{step}@{self.dataset}" in self.outs:
            target = self.dataset
        key = instance_key(step, target)
        if key not in self.outs:
            if target is None and any(k.startswith(f"{step}@") for k in self.outs):
                raise LookupError(f"{{{ref}}}: {step} runs per dataset; name one ({{{step}@NAME}}) or all "
                                  f"({{{step}@*}})")
            raise LookupError(f"{{{ref}}}: step {step} has no instance {key}")
        self.deps.add(key)
        return str(self.outs[key])

    def _dataset(self, ref: str) -> Any:
        if self.dataset is None:
            raise LookupError(f"{{{ref}}} in a step that does not run per dataset")
        if ref == "dataset":
            return self.dataset
        spec = self.study.datasets[self.dataset]
        name = ref.split(".", 1)[1]
        if name in ("inputs", "meta", "format", "category"):
            return getattr(spec, name)
        if name in spec.vars:
            return spec.vars[name]
        raise LookupError(f"{{{ref}}}: dataset {self.dataset} has no {name!r} (add it under vars)")

    def resolve(self, value: Any, key: str) -> Any:
        if isinstance(value, dict):
            return {k: self.resolve(v, f"{key}.{k}" if key else k) for k, v in value.items()}
        if isinstance(value, list):
            out = []
            for i, v in enumerate(value):
                got = self.resolve(v, f"{key}[{i}]")
                # A whole-value list reference inside a list is spliced in.
                out.extend(got if isinstance(got, list) and isinstance(v, str) and REF.fullmatch(v) else [got])
            return out
        if not isinstance(value, str):
            return value
        try:
            whole = REF.fullmatch(value)
            if whole:
                return self.value(whole.group(1))

            def sub(m: re.Match) -> str:
                got = self.value(m.group(1))
                if isinstance(got, list):
                    raise LookupError(f"{{{m.group(1)}}} is a list: use it as the whole value")
                return str(got)
            return REF.sub(sub, value)
        except LookupError as exc:
            self.bad.add(re.split(r"[.\[]", key, maxsplit=1)[0])
            if not isinstance(exc, _Said):
                self.problems.append(f"{self.where}.with.{key}: {exc.args[0]}")
            return value


def _inside(path: str, root: Location) -> bool:
    """Whether `path` (resolved, or a URI) lies in the study's folder `root`."""
    if root.is_local:
        return not is_uri(path) and Path(path).is_relative_to(root.path)
    return path == root.uri or path.startswith(root.uri + "/")


def _files_read(settings: Any, inside: Location) -> list[str]:
    """Existing files outside the study's folder that the settings name, local or by URI
    (their sizes and times go into the fingerprint: an edited input re-runs its readers)."""
    found: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and len(v) < 4096 and ("/" in v or "." in v):
            if is_uri(v):
                if not _inside(v.rstrip("/"), inside) and _uri_file(v):
                    found.append(location(v).uri)
                return
            p = Path(v)
            if p.is_file() and not _inside(str(p.resolve()), inside):
                found.append(str(p.resolve()))
    walk(settings)
    return sorted(set(found))


def _uri_file(uri: str) -> bool:
    """Whether `uri` names a file in a store this machine reaches (a web address, or a
    store it cannot ask, is not an input file of the fingerprint)."""
    if uri.startswith(("http://", "https://")):
        return False
    try:
        return location(uri).is_file()
    except (ValueError, TypeError, OSError):
        return False


def _missing_reads(instances: dict[str, Instance], root: Location, known: set[str] = frozenset()) -> list[str]:
    """A file or folder a step reads, named outside the study's folder, that does not
    exist: found now rather than when the step's turn comes, hours into a study. Paths
    inside the study's folder are steps' outputs (they appear as it runs); web
    addresses, patterns and `none` are left to the job; a URI is asked through storage.
    Which settings are paths the job reads, each job's config declares (`ReadPath` &
    co., `pipelines/core/read_paths.py`). A path in `known` is reported already (a
    dataset's file)."""
    problems = []
    for inst in instances.values():
        for name, v in path_values(inst.job.config, inst.settings):
            where = v.rstrip("/") if is_uri(v) else str(Path(v).resolve())
            if v in known or _inside(where, root):
                continue
            why = why_missing(v)
            if why is not None:
                ds = f" (dataset {inst.dataset})" if inst.dataset else ""
                problems.append(f"steps.{inst.step}.with.{name}{ds}: {v} {why}")
    return problems


def _undeclared_reads(instances: dict[str, Instance]) -> list[str]:
    """A path a step reads inside an upstream step's folder that the upstream job does
    not write (`{flip}/explanation.parquet` for `explanations.parquet`): found now rather
    than when the reader fails. What a job writes, its `outputs` declare
    (`pipelines/core/outputs.py`); a path inside a declared folder counts as declared,
    and a job that declares nothing is not checked."""
    problems = []
    for inst in instances.values():
        for name, v in path_values(inst.job.config, inst.settings):
            for up in (instances[d] for d in sorted(inst.deps)):
                try:
                    rel = location(v).relative_to(up.out)
                except ValueError:
                    continue
                if rel and up.job.outputs and not up.job.outputs.declares(rel):
                    ds = f" (dataset {inst.dataset})" if inst.dataset else ""
                    problems.append(f"steps.{inst.step}.with.{name}{ds}: {v}: job {up.job.name} (step "
                                    f"{up.step}) writes no {rel}; it writes {', '.join(up.job.outputs.paths())}")
                break
    return problems


def _uri_stamp(uri: str) -> list:
    """An input object's identity without reading it: its URI, size and time (the same
    from every node, and an overwritten object gets a new time)."""
    loc = location(uri)
    info = loc.fs.get_file_info(loc.path)
    return [uri, info.size, int(info.mtime.timestamp()) if info.mtime else 0]


def _cycle(instances: dict[str, Instance]) -> list[str] | None:
    """One dependency cycle (as a list of keys), or None."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(k: str) -> list[str] | None:
        colour[k] = 1
        stack.append(k)
        for d in sorted(instances[k].deps):
            if colour.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in colour and (found := visit(d)):
                return found
        stack.pop()
        colour[k] = 2
        return None

    for k in instances:
        if k not in colour and (found := visit(k)):
            return found
    return None


def _topological(instances: dict[str, Instance], declared: list[str]) -> list[str]:
    """Dependency order; ties keep the study file's order (step, then dataset)."""
    rank = {k: i for i, k in enumerate(declared)}
    done: list[str] = []
    left = set(instances)
    while left:
        ready = sorted((k for k in left if instances[k].deps <= set(done)), key=rank.__getitem__)
        done.append(ready[0])
        left.remove(ready[0])
    return done


def study_root(out: str | Path | Location) -> Location:
    """The study's folder: a URI as given, a local path made absolute (symlinks resolved)."""
    if isinstance(out, Location) or is_uri(str(out)):
        return location(out)
    return location(Path(out).resolve())


def build_plan(study: StudyFile, file: str | Path, out: str | Path | Location | None = None) -> Plan:
    """The checked graph of `study`. Every check runs, whatever an earlier one found, and
    StudyError then lists every problem at once (the study file's own first): a user
    fixes them all after one dry run instead of one per run."""
    file = Path(file)
    here = file.resolve().parent
    root = study_root(out or study.out or f"runs/{study.name}")
    problems: list[str] = list(study.load_problems)
    if root.is_file():
        problems.append(f"out: {root} is a file; the study writes a folder there (its steps, state and logs)")
    missing = _dataset_problems(study, problems)
    quiet = {d.split(".", 1)[1] for d in study.dropped if d.startswith("steps.")}
    outs, declared = _instance_folders(study, root, problems, quiet)
    instances, off, unresolved = _instances(study, root, here, outs, declared, problems, quiet)
    declared = [k for k in declared if k not in off]
    if not instances and (off or not problems):
        problems.append("every step is off (see the steps' when:)" if off else
                        "no step instance to run (a step that runs per dataset needs datasets)")
    if cycle := _cycle(instances):
        problems.append(f"steps: a cycle: {' -> '.join(cycle)} (each needs the next's output)")
    configs = _configs(instances, unresolved, problems)
    checked = {k: replace(i, settings={n: v for n, v in i.settings.items() if n not in unresolved[k]})
               for k, i in instances.items()}
    problems.extend(_missing_reads(checked, root, missing))
    problems.extend(_undeclared_reads(checked))
    problems.extend(_model_problems(study, {k: instances[k] for k in configs}, configs))
    problems.extend(_overlapping_outputs(instances, configs))
    if problems:
        raise StudyError(file, list(dict.fromkeys(problems)))

    order = _topological(instances, declared)
    for key in order:
        inst = instances[key]
        inst.reads = _files_read(inst.settings, root)
        # Local files by content (io.content_identity: the same inputs unpacked on another
        # node under another folder are the same inputs); files by URI by size and time.
        outside = set(inst.reads)
        settings = content_identity(inst.settings, read_settings(inst.job.config),
                                    counts=lambda f, outside=outside: str(Path(f).resolve()) in outside)
        payload = {"job": inst.job.name, "settings": settings,
                   "reads": [_uri_stamp(p) for p in inst.reads if is_uri(p)],
                   "upstream": sorted(instances[d].fingerprint for d in inst.deps)}
        inst.fingerprint = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Plan(study, file, root, instances, order, off)


def _dataset_problems(study: StudyFile, problems: list[str]) -> set[str]:
    """Add a problem for each dataset file that is not there; returns those paths (the
    steps that read them are not told the same thing again)."""
    missing = set()
    for name, ds in study.datasets.items():
        for kind in ("inputs", "meta"):
            for p in getattr(ds, kind):
                if (why := why_missing(p)) is not None:
                    problems.append(f"datasets.{name}.{kind}: {p} {why}")
                    missing.add(p)
    return missing


def _instance_folders(study: StudyFile, root: Location, problems: list[str],
                      quiet: set[str]) -> tuple[dict[str, Location], list[str]]:
    """Each step instance's output folder, in the study file's order, and the problems
    of the steps' own keys. A step whose job is unknown has no instance, and one that
    names a dataset there is not has none for it: references to either join `quiet` (the
    problem is said once, at the step)."""
    outs: dict[str, Location] = {}
    declared: list[str] = []
    jobs = STUDY_JOBS.names()  # the built-in jobs and every study_job module's
    for step, spec in study.steps.items():
        if spec.job not in jobs:
            problems.append(f"steps.{step}.job: unknown job {spec.job!r} (jobs: {', '.join(jobs)})")
            quiet.add(step)
            continue
        for ds in spec.datasets or []:
            if ds not in study.datasets:
                quiet.add(step)
                if f"datasets.{ds}" not in study.dropped:
                    problems.append(f"steps.{step}.datasets: no dataset {ds!r} (datasets: "
                                    f"{', '.join(study.datasets) or 'none'})")
        for d in spec.after:
            if d not in study.steps and f"steps.{d}" not in study.dropped:
                problems.append(f"steps.{step}.after: no step {d!r}")
        if "out" in spec.with_:
            problems.append(f"steps.{step}.with.out: the study sets each step's output folder")
        for ds in _instances_of(study, step):
            if ds is not None and ds not in study.datasets:
                continue
            key = instance_key(step, ds)
            outs[key] = root / ds / step if ds else root / step
            declared.append(key)
    return outs, declared


def _instances(study: StudyFile, root: Location, here: Path, outs: dict[str, Location], declared: list[str],
               problems: list[str], quiet: set[str]) -> tuple[dict[str, Instance], dict[str, str], dict[str, set]]:
    """The instances with their settings resolved, less those switched off (`when`, or
    reading an instance that is off: key -> why), and for each instance the settings whose
    references did not resolve (their problems are added; their values are not checked
    further, which would only say the same thing again)."""
    instances: dict[str, Instance] = {}
    off: dict[str, str] = {}
    unresolved: dict[str, set] = {}
    for key in declared:
        step, _, ds = key.partition("@")
        spec = study.steps[step]
        job = STUDY_JOBS[spec.job]
        r = _Resolver(root, here, study, outs, ds or None, f"steps.{step}" + (f" (dataset {ds})" if ds else ""),
                      problems, quiet)
        when = r.resolve(spec.when, "when") if isinstance(spec.when, str) else spec.when
        if when in FALSE:
            off[key] = f"off (when: {spec.when})"
        settings = r.resolve(dict(spec.with_), "")
        settings["out"] = str(outs[key])
        if has_field(job.config, "profile") and "profile" not in settings:
            settings["profile"] = study.profile
        if has_field(job.config, "models") and study.models:
            settings["models"] = {**study.models, **(settings.get("models") or {})}
        deps = set(r.deps)
        for a in spec.after:
            deps.update(k for k in outs if k == a or k.startswith(f"{a}@") and (ds == "" or k == f"{a}@{ds}"))
        instances[key] = Instance(key, step, job, ds or None, outs[key], settings, deps)
        unresolved[key] = r.bad - {"when"}
    # A step that reads the output of a step that is off is off too.
    changed = True
    while changed:
        changed = False
        for key, inst in instances.items():
            if key not in off and (gone := sorted(inst.deps & set(off))):
                off[key] = f"off: needs {', '.join(gone)}"
                changed = True
    for key in off:
        instances.pop(key)
    return instances, off, unresolved


def _configs(instances: dict[str, Instance], unresolved: dict[str, set], problems: list[str]) -> dict:
    """Each instance's settings built with its job's own config class (whose validators
    are the job's checks: a range, a combination, a name), one problem per refusal,
    naming the step and the setting. Settings whose references did not resolve are
    reported already."""
    configs = {}
    for key, inst in instances.items():
        where = f"steps.{inst.step}.with" + (f" (dataset {inst.dataset})" if inst.dataset else "")
        try:
            configs[key] = build_config(inst.job, inst.settings)
        except ValidationError as exc:
            for e in exc.errors():
                if e["loc"] and str(e["loc"][0]) in unresolved.get(key, ()):
                    continue
                loc = "".join(f".{p}" for p in e["loc"])
                msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
                problems.append(f"{where}{loc}: {msg}")
    return configs


def _overlapping_outputs(instances: dict[str, Instance], configs: dict) -> list[str]:
    """A step whose folder is, holds or lies inside a file or folder it reads (a
    dataset file kept under the study's output, say): the job would refuse it when its
    turn came (`overlap.check_output_apart`), so the plan says so first."""
    from rexeval.pipelines.core.overlap import check_output_apart

    problems = []
    for key, cfg in configs.items():
        try:
            check_output_apart(cfg)
        except ValueError as exc:
            inst = instances[key]
            problems.append(f"steps.{inst.step}" + (f" (dataset {inst.dataset})" if inst.dataset else "")
                            + f": {exc}")
    return problems


def _model_problems(study: StudyFile, instances: dict[str, Instance], configs: dict) -> list[str]:
    """A model role a step needs and its profile lacks: one message per step and role."""
    from rexeval.models.profiles import load_profile

    problems, seen = [], set()
    for key, inst in instances.items():
        cfg = configs[key]
        profile = getattr(cfg, "profile", study.profile)
        overrides = getattr(cfg, "models", None) or study.models
        try:
            prof = load_profile(profile, overrides)
        except (ValueError, KeyError) as exc:
            problems.append(f"steps.{inst.step}: profile {profile!r}: {exc}")
            continue
        given = [r for r, ref in dict(overrides or {}).items() if ref]  # models named outright: checked too
        for role in dict.fromkeys([*inst.job.roles(cfg), *given]):
            if (inst.step, role) in seen:
                continue
            ref = prof.ref(role)
            if ref is None:
                seen.add((inst.step, role))
                problems.append(f"steps.{inst.step}: job {inst.job.name} needs a {role!r} model and profile "
                                f"{profile!r} has none: give one under models (e.g. models: {{{role}: /path}})")
            elif (why := _unusable(ref)) is not None:
                seen.add((inst.step, role))
                problems.append(f"steps.{inst.step}: the {role!r} model: {why}")
    return problems


def _unusable(ref: str) -> str | None:
    """Why the model `ref` cannot be used here (a path with nothing there, a package not
    installed, a URI with nothing under it), checked without loading or copying it."""
    from rexeval.models.refs import ModelUnavailable, resolve

    try:
        resolve(ref, prepare=False)
    except ModelUnavailable as exc:
        return str(exc)
    return None


# -- the state of a study folder -------------------------------------------------------


def read_state(root: str | Path | Location) -> dict[str, Any]:
    path = location(root) / STATE_FILE
    if not path.is_file():
        return {"steps": {}}
    return state_in_todays_names(json.loads(path.read_text()))


def state_in_todays_names(state: Any) -> Any:
    """study.json as written before a step was renamed from "stage" (issue 51): its
    "stages" mapping and each record's "stage" read as "steps" and "step", so a study
    folder from an older rexeval resumes and reports rather than running afresh."""
    if isinstance(state, dict) and "stages" in state and "steps" not in state:
        state["steps"] = state.pop("stages")
        for rec in state["steps"].values() if isinstance(state["steps"], dict) else ():
            if isinstance(rec, dict) and "stage" in rec and "step" not in rec:
                rec["step"] = rec.pop("stage")
    return state


def status_of(plan: Plan, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """instance -> ("done" | "run", why) for every instance of the plan."""
    out: dict[str, tuple[str, str]] = {}
    steps = state.get("steps", {})
    for key in plan.order:
        inst, rec = plan.instances[key], steps.get(key)
        if rec is None:
            out[key] = ("run", "never run")
        elif rec.get("status") == "complete" and rec.get("fingerprint") == inst.fingerprint:
            if inst.out.exists():
                out[key] = ("done", f"complete (fingerprint {inst.fingerprint})")
            else:
                out[key] = ("run", f"its output {inst.out} is gone")
        elif rec.get("status") == "failed" and rec.get("fingerprint") == inst.fingerprint:
            out[key] = ("run", f"failed last time: {rec.get('reason')}")
        elif rec.get("fingerprint") != inst.fingerprint:
            changed = [d for d in sorted(inst.deps) if out.get(d, ("", ""))[0] == "run"]
            if rec.get("settings") != inst.settings:
                diff = sorted(k for k in set(inst.settings) | set(rec.get("settings") or {})
                              if (rec.get("settings") or {}).get(k) != inst.settings.get(k))
                out[key] = ("run", f"settings changed: {', '.join(diff)}")
            elif changed:
                out[key] = ("run", f"upstream changes: {', '.join(changed)}")
            else:
                out[key] = ("run", "an input file changed")
        else:
            out[key] = ("run", f"last run did not finish ({rec.get('status')})")
    return out
