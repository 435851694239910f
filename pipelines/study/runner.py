"""Running a study's plan: what is missing, in dependency order, independent instances
at once, each through its existing job in a driver of its own (Tune, Serve and Ray Data
keep per-process state that two steps in one process would share): a process forked
by the study's driver (`step_process`), or on a running cluster a Ray job of its own
that can run on any node (`step_job`; `steps_as` in the study file); the state file
records each outcome.

- The judge Serve application is started once for all the steps that call the same
  judge (`StudyApps`), not once per step.
- Free slots go to the critical path first (`start_order`): the step with the longest
  chain of steps waiting on it.
- An instance whose fingerprint is unchanged since it completed is skipped (a second
  run does nothing and says so).
- An instance whose settings changed since its folder was written is re-run with the
  job's overwrite, except for jobs that recompute only what a changed setting touches
  themselves (`evaluate` recomputes the metric families whose settings changed).
- An instance that was interrupted (driver killed) simply runs again: every job resumes
  its finished shards, so the result equals an uninterrupted run.
- A failed instance is recorded with its reason; what depends on it is skipped, saying
  why; independent instances go on; the run's result says which failed, and which of
  them failed in transport (left for a re-run: the command then exits 75).
- Steps run as Ray jobs are stopped when the study is interrupted (Ctrl-C, or SIGTERM
  from `ray job stop`), and a job an earlier, killed run left running is stopped before
  its step runs again.

The study's folder may be a URI (`s3://bucket/studies/x`): the state, every step's
folder and the logs are written there through the storage module (`StepLogs`), and a
local folder that some node of the cluster cannot see is refused before any step runs
(`pipelines.core.reach`).
"""
from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rexeval.pipelines.core.io import write_json_atomic
from rexeval.storage import Location
from rexeval.pipelines.core.study_registry import ServeNeed, build_config
from rexeval.pipelines.study.plan import STATE_FILE, Plan, read_state, status_of


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class StudyState:
    """study.json, written atomically after every change (threads share it)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.path = plan.out / STATE_FILE
        self.data = read_state(plan.out)
        self.data.update({"name": plan.study.name, "file": str(plan.file.resolve()), "profile": plan.study.profile,
                          "out": str(plan.out)})
        self.data.setdefault("created", _now())
        self.data.setdefault("steps", {})
        self.lock = threading.Lock()

    def record(self, key: str, **fields: Any) -> None:
        inst = self.plan.instances[key]
        with self.lock:
            rec = self.data["steps"].setdefault(key, {})
            rec.update({"step": inst.step, "job": inst.job.name, "dataset": inst.dataset, "out": str(inst.out),
                        "fingerprint": inst.fingerprint, "settings": inst.settings}, **fields)
            self.data["updated"] = _now()
            self.plan.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, self.data)


class StepLogs:
    """Where the steps' and Serve holders' logs go: OUT/logs/<name>.log.

    A process streams its log to a local file as it runs. For a local study folder that
    file is OUT/logs/<name>.log itself. An object store cannot be appended to, so for a
    URI the process writes to a local temporary file (primed with the log an earlier run
    left, as a local log is appended to), which `publish` copies to OUT/logs/<name>.log
    when the step ends, failed or not."""

    def __init__(self, out: Location):
        self.folder = out / "logs"
        self.tmp = None if out.is_local else Path(tempfile.mkdtemp(prefix="rexeval-study-logs-"))

    def where(self, name: str) -> str:
        """The log as the user finds it (a local path or a URI)."""
        return str(self.folder / f"{name}.log")

    def local(self, name: str) -> str:
        """The local file the process appends to."""
        if self.tmp is None:
            return self.where(name)
        path = self.tmp / f"{name}.log"
        if not path.exists():
            earlier = self.folder / f"{name}.log"
            if earlier.is_file():
                earlier.download(path)
        return str(path)

    def publish(self, name: str, say: Callable[[str], None]) -> None:
        """Copy a URI study's log of `name` to OUT/logs (nothing to do for a local one);
        a failed copy is said, never raised (it must not hide the step's outcome)."""
        if self.tmp is None or not (self.tmp / f"{name}.log").is_file():
            return
        try:
            (self.folder / f"{name}.log").upload(self.tmp / f"{name}.log")
        except Exception as exc:  # noqa: BLE001
            say(f"[{name}] could not copy its log to {self.where(name)}: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def plan_lines(plan: Plan, status: dict[str, tuple[str, str]], only: set[str] | None = None) -> list[str]:
    """What `--dry-run` prints: every instance in order, whether it runs, and why."""
    lines = [f"study {plan.study.name}: {len(plan.order)} step instance(s) -> {plan.out}"]
    for key in plan.order:
        inst = plan.instances[key]
        what, why = status[key]
        if only is not None and key not in only:
            what, why = "skip", "not selected by --only"
        deps = f" after {', '.join(sorted(inst.deps))}" if inst.deps else ""
        lines.append(f"  [{what:4s}] {key:32s} {inst.job.name:16s}{deps}: {why}")
    for key, why in plan.off.items():
        lines.append(f"  [off ] {key:32s} {plan.study.steps[key.partition('@')[0]].job:16s}: {why}")
    todo = sum(1 for k in plan.order if status[k][0] == "run" and (only is None or k in only))
    lines.append(f"{todo} to run, {len(plan.order) - todo} not" + (f", {len(plan.off)} off" if plan.off else ""))
    return lines


def hard_failures(plan: Plan, result: dict[str, Any]) -> list[str]:
    """Failed or skipped instances that fail the study: all but the `optional` steps'
    failures and what only they held up."""
    soft = {k for k in result["failed"] if plan.study.steps[plan.instances[k].step].optional}
    for key in plan.order:  # in order: a skipped instance's blockers are decided before it
        if key in result["skipped"]:
            blockers = {d for d in plan.instances[key].deps if d in result["failed"] or d in result["skipped"]}
            if blockers and blockers <= soft:
                soft.add(key)
    return [k for k in [*result["failed"], *result["skipped"]] if k not in soft]


def selected(plan: Plan, only: list[str] | None) -> set[str] | None:
    """Instances picked by --only (step names or instance keys); None: all."""
    if not only:
        return None
    keys = set()
    for name in only:
        got = {k for k, i in plan.instances.items() if k == name or i.step == name}
        if not got:
            raise ValueError(f"--only {name}: no such step or instance (steps: {', '.join(plan.study.steps)})")
        keys |= got
    return keys


class StudyApps:
    """The Serve applications the study holds for its steps (`jobs.ServeNeed`).

    A "shared" application (the judge) is started before the first step that needs it
    and kept while any running or waiting step needs the same one, so every judge step
    of a run uses one deployment; a step that needs another under the same name waits
    until no running step uses it, then it is replaced. An application a job starts
    itself ("own") is used by one running step at a time."""

    def __init__(self, say: Callable[[str], None], hold: Callable[..., Callable[[], None]]):
        self.say, self.hold = say, hold  # hold(opener, app, progress) -> release
        self.held: dict[str, dict[str, Any]] = {}  # app -> {"key", "release", "lock"}
        self.users: dict[str, set[str]] = {}  # app -> running instances that use it
        self.own: dict[str, str] = {}  # app -> the running instance that starts it itself

    def can_start(self, needs: list[ServeNeed]) -> bool:
        for n in needs:
            users = self.users.get(n.app)
            if n.mode == "own" and users:
                return False
            if n.mode == "shared" and (n.app in self.own or users and self.held.get(n.app, {}).get("key") != n.key):
                return False
        return True

    def cost(self, needs: list[ServeNeed]) -> int:
        """0: every application it needs is up (or it needs none); 1: it would start one."""
        return int(any(n.mode == "own" or self.held.get(n.app, {}).get("key") != n.key for n in needs))

    def claim(self, key: str, needs: list[ServeNeed]) -> None:
        """Reserve what `key` needs (it starts now); an idle application of another kind
        under the same name is stopped first."""
        for n in needs:
            held = self.held.get(n.app)
            if held is not None and (n.mode == "own" or held["key"] != n.key):
                self._release(n.app)
            if n.mode == "own":
                self.own[n.app] = key
            elif n.app not in self.held:
                self.held[n.app] = {"key": n.key, "release": None, "lock": threading.Lock()}
            self.users.setdefault(n.app, set()).add(key)

    def open(self, needs: list[ServeNeed]) -> None:
        """In the step's thread, before its process starts: bring the shared applications
        up (the first step that needs one starts it; the others find it up)."""
        for n in needs:
            if n.mode != "shared":
                continue
            held = self.held[n.app]
            with held["lock"]:
                if held["release"] is None:
                    held["release"] = self.hold(n.open, n.app, lambda line: self.say(f"[serve] {line.strip()}"))

    def done(self, key: str, needs: list[ServeNeed], still_needed: set[tuple[str, str]]) -> None:
        """`key` finished; stop what no running or waiting step needs any more."""
        for n in needs:
            self.users.get(n.app, set()).discard(key)
            if self.own.get(n.app) == key:
                del self.own[n.app]
            if n.mode == "shared" and not self.users.get(n.app) and (n.app, n.key) not in still_needed:
                self._release(n.app)

    def _release(self, app: str) -> None:
        held = self.held.pop(app, None)
        if held and held["release"] is not None:
            held["release"]()

    def close(self) -> None:
        for app in list(self.held):
            try:
                self._release(app)
            except Exception as exc:  # noqa: BLE001  (stopping must not hide the study's result)
                self.say(f"[serve] could not stop {app!r}: {type(exc).__name__}: {exc}")


FIRST_COUNTS = ("in", "reviews_in", "statements_in", "interactions", "out", "explanations", "statements",
                "clusters", "examples", "errors", "error_rows")


def counts_line(counts: dict[str, Any], most: int = 4) -> str:
    """A step's main counts for its "done" line: what went in, came out, failed."""
    keys = [k for k in FIRST_COUNTS if k in counts]
    keys += [k for k in counts if k not in keys and not any(w in k for w in ("token", "cached", "seconds", "calls"))]
    return ", ".join(f"{k} {counts[k]:,}" if isinstance(counts[k], int) else f"{k} {counts[k]}" for k in keys[:most])


def start_order(plan: Plan, ready: Iterable[str], cost: Callable[[str], int],
                chains: dict[str, int]) -> list[str]:
    """Which ready steps take the free slots first. Steps that use an application
    already up before those that would start one (a Serve replica holds its CPUs or
    GPUs only while it is needed); then the critical path: the step with the longest
    chain of steps waiting on it (`Plan.chains`: the demo's split -> peter ->
    peter_test -> evaluate) before a leaf such as stats, which would hold a slot (and,
    beside an LLM step, wait for a CPU) while the long chain waits; then the study
    file's order."""
    return sorted(ready, key=lambda k: (cost(k), -chains[k], plan.order.index(k)))


def _needs(plan: Plan, key: str) -> list[ServeNeed]:
    inst = plan.instances[key]
    try:
        return inst.job.serves(build_config(inst.job, inst.settings))
    except Exception:  # noqa: BLE001  (the job itself reports what is wrong with its settings)
        return []


def _step_jobs(wanted: str, plan: Plan, runtime_env: dict[str, Any], progress: Callable[[str], None]):
    """A `step_job.StepJobs` when the steps run as Ray jobs, else None (processes)."""
    from rexeval.pipelines.study.step_job import StepJobs, describe, job_client, resolve_mode

    mode, why = resolve_mode(wanted)
    if mode == "job":
        try:
            client = job_client()
        except Exception as exc:  # noqa: BLE001  (auto falls back to processes, saying why)
            if wanted == "job":
                raise ValueError(f"steps as Ray jobs: cannot reach the cluster's job server: "
                                 f"{type(exc).__name__}: {exc}") from None
            mode, why = "process", f"the cluster's job server does not answer ({type(exc).__name__})"
        else:
            progress(f"study {plan.study.name}: steps run as Ray jobs ({why}); a step's driver asks for "
                     f"{describe(plan.study.driver_resources)} unless the step says otherwise")
            return StepJobs(client, plan.out, runtime_env)
    if wanted != "process" and why != "Ray was started by this study":
        progress(f"study {plan.study.name}: steps run as processes of this driver ({why})")
    return None


@contextmanager
def _sigterm_interrupts(on: bool) -> Iterator[None]:
    """`ray job stop` ends a study's driver with SIGTERM: taken as an interrupt, it stops
    the steps' Ray jobs on its way out (they would run on, orphaned, otherwise)."""
    if not on or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextmanager
def _stopping_on_interrupt(jobs, progress: Callable[[str], None]) -> Iterator[None]:
    """Stop the running steps' Ray jobs when the study is interrupted (inside the thread
    pool, so that its threads, following those jobs, see them end)."""
    try:
        yield
    except BaseException:
        if jobs is not None:
            jobs.stop_all(progress)
        raise


def run_study(plan: Plan, *, only: list[str] | None = None, dry_run: bool = False,
              max_parallel: int | None = None, progress: Callable[[str], None] = print,
              job_lines: Callable[[str], None] | None = None, verbose: bool = False,
              show_plan: bool = True, steps_as: str | None = None) -> dict[str, Any]:
    """Run what is missing; returns {"ran": [...], "done": [...], "failed": {key: reason},
    "skipped": {key: reason}, "transport": [failed keys left for a re-run]}.

    Each instance runs in a driver of its own, its log in OUT/logs/<instance>.log (OUT
    may be a URI; a local OUT that a node of the cluster cannot see is refused before
    any step runs: `reach.UnreachablePath`): a process of this driver
    (`step_process`) or a Ray job (`step_job`), as `steps_as` says ("auto",
    "process", "job"; default: REXEVAL_STEPS_AS, else the study file's). `progress`
    gets the study's lines (the plan, each step's start and end); `job_lines` each
    job's own progress lines, prefixed with the instance (default: `progress`).
    `verbose`: the steps' drivers print Ray's and the libraries' own output too.
    `show_plan` False: the plan in two lines, not one per instance."""
    from rexeval.pipelines.study.step_job import wanted_mode

    wanted = wanted_mode(steps_as, plan.study.steps_as)
    picked = selected(plan, only)
    status = status_of(plan, read_state(plan.out))
    shown = plan_lines(plan, status, picked)
    for line in shown if show_plan else [shown[0], "  " + shown[-1]]:
        progress(line)
    todo = [k for k in plan.order if status[k][0] == "run" and (picked is None or k in picked)]
    result: dict[str, Any] = {"ran": [], "done": [k for k in plan.order if status[k][0] == "done"],
                              "failed": {}, "skipped": {}, "planned": list(todo), "transport": []}
    if dry_run:
        return result
    if picked is not None:
        for key in todo:
            missing = [d for d in plan.instances[key].deps if status[d][0] != "done" and d not in todo]
            if missing:
                raise ValueError(f"--only: {key} needs {', '.join(sorted(missing))} first (run the study without "
                                 "--only, or add them)")
    if not todo:
        progress(f"study {plan.study.name}: nothing to do, every step is complete for these settings")
        return result

    from rexeval.pipelines.core.reach import require_reachable
    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.study.step_process import (StepCall, StepFailed, StepPool, hold_service,
                                                        ray_connection, run_step)

    init_ray(quiet=not verbose)
    require_reachable(plan.out, what="the study's out")
    address, runtime_env = ray_connection()
    jobs = _step_jobs(wanted, plan, runtime_env, progress)
    lines = job_lines or progress
    state = StudyState(plan)
    previous = {k: dict(v) for k, v in state.data["steps"].items()}
    for key in todo if jobs is not None else []:
        old = previous.get(key) or {}
        if old.get("status") == "running" and old.get("ray_job"):
            jobs.stop(old["ray_job"], lambda line, key=key: progress(f"[{key}] {line}"),
                      "left running by an earlier run of this study")
    waiting = set(todo)
    running: dict[Future, str] = {}
    finished = set(result["done"])
    needs = {k: _needs(plan, k) for k in todo}
    chains = plan.chains()
    logs = StepLogs(plan.out)

    def hold(opener, app: str, say: Callable[[str], None]) -> Callable[[], None]:
        name = f"serve-{app}"
        try:
            release = hold_service(opener, logs.local(name), say, address, runtime_env, verbose,
                                   log_shown=logs.where(name))
        except BaseException:
            logs.publish(name, progress)
            raise

        def release_and_publish() -> None:
            try:
                release()
            finally:
                logs.publish(name, progress)
        return release_and_publish

    apps = StudyApps(progress, hold)
    step_pool = StepPool()  # finished steps' processes, for the next steps (step_process)

    def run_one(key: str) -> dict:
        inst = plan.instances[key]
        old = previous.get(key) or {}
        # Settings or upstream outputs changed since this folder was written: the study
        # owns the folder, so the job starts it over (unless it recomputes only what
        # changed itself). An interrupted run (same fingerprint) resumes instead.
        changed = bool(old) and old.get("fingerprint") != inst.fingerprint and inst.out.exists()
        overwrite = changed and not inst.job.keeps_changed_settings
        progress(f"[{key}] {inst.job.name} -> {inst.out}" + (" (re-running: settings or inputs changed)"
                                                             if changed else ""))
        state.record(key, status="running", started=_now(), reason=None, ray_job=None, node=None)
        t0 = time.time()
        apps.open(needs[key])
        call = StepCall(key, inst.job.target, inst.job.config, inst.settings, overwrite,
                         logs.local(key), address, runtime_env, verbose, log_shown=logs.where(key))
        node = None
        try:
            if jobs is None:
                counts = run_step(call, lambda line: lines(f"[{key}] {line}"), step_pool)
            else:
                counts, node = jobs.run(call, plan.study.driver_of(inst.step), lambda line: lines(f"[{key}] {line}"),
                                        lambda sid: state.record(key, ray_job=sid))
        finally:
            logs.publish(key, progress)
        seconds = round(time.time() - t0, 2)
        state.record(key, status="complete", finished=_now(), seconds=seconds, summary=counts, reason=None,
                     node=node)
        shown = counts_line(counts)
        progress(f"[{key}] done in {seconds:.1f}s" + (f": {shown}" if shown else ""))
        return counts

    try:
        slots = max_parallel or plan.study.max_parallel
        with _sigterm_interrupts(jobs is not None), \
                ThreadPoolExecutor(slots, thread_name_prefix="rexeval-study") as pool, \
                _stopping_on_interrupt(jobs, progress):
            while waiting or running:
                for key in sorted(waiting, key=plan.order.index):
                    blocked = [d for d in plan.instances[key].deps if d in result["failed"] or d in result["skipped"]]
                    if blocked:
                        waiting.discard(key)
                        why = f"upstream {', '.join(sorted(blocked))} did not complete"
                        result["skipped"][key] = why
                        state.record(key, status="skipped", reason=why, finished=_now())
                        progress(f"[{key}] skipped: {why}")
                ready = [k for k in waiting if plan.instances[k].deps <= finished and apps.can_start(needs[k])]
                for key in start_order(plan, ready, lambda k: apps.cost(needs[k]), chains):
                    if len(running) >= slots:
                        break
                    if not apps.can_start(needs[key]):  # another just claimed the application
                        continue
                    waiting.discard(key)
                    apps.claim(key, needs[key])
                    running[pool.submit(run_one, key)] = key
                if not running:
                    break
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    key = running.pop(fut)
                    exc = fut.exception()
                    if exc is None:
                        finished.add(key)
                        result["ran"].append(key)
                    else:
                        reason = exc.reason if isinstance(exc, StepFailed) else f"{type(exc).__name__}: {exc}"
                        details = (exc.details if isinstance(exc, StepFailed)
                                   else "".join(traceback.format_exception(exc)))
                        transport = isinstance(exc, StepFailed) and exc.transport
                        result["failed"][key] = reason
                        if transport:
                            result["transport"].append(key)
                        state.record(key, status="failed", reason=reason, finished=_now(),
                                     traceback=details[-4000:], log=logs.where(key), transport=transport)
                        optional = plan.study.steps[plan.instances[key].step].optional
                        progress(f"[{key}] FAILED{' (optional step: the study goes on)' if optional else ''}"
                                 f"{' in transport (left for a re-run)' if transport else ''}: {reason}")
                    still = {(n.app, n.key) for k in waiting for n in needs[k]}
                    apps.done(key, needs[key], still)
    finally:
        try:
            step_pool.close()
            apps.close()
        finally:
            logs.close()
    return result
