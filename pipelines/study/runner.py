"""Running a study's plan: what is missing, in dependency order, independent instances
at once, each through its existing job; the state file records each outcome.

- An instance whose fingerprint is unchanged since it completed is skipped (a second
  run does nothing and says so).
- An instance whose settings changed since its folder was written is re-run with the
  job's overwrite, except for jobs that recompute only what a changed setting touches
  themselves (`evaluate` recomputes the metric families whose settings changed).
- An instance that was interrupted (driver killed) simply runs again: every job resumes
  its finished shards, so the result equals an uninterrupted run.
- A failed instance is recorded with its reason; what depends on it is skipped, saying
  why; independent instances go on; the run's result says which failed.
"""
from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from typing import Any

from rexeval.pipelines.core.io import write_json_atomic
from rexeval.pipelines.study.jobs import build_config, counts_of
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
        self.data.setdefault("stages", {})
        self.lock = threading.Lock()

    def record(self, key: str, **fields: Any) -> None:
        inst = self.plan.instances[key]
        with self.lock:
            rec = self.data["stages"].setdefault(key, {})
            rec.update({"stage": inst.stage, "job": inst.job.name, "dataset": inst.dataset, "out": str(inst.out),
                        "fingerprint": inst.fingerprint, "settings": inst.settings}, **fields)
            self.data["updated"] = _now()
            self.plan.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, self.data)


def plan_lines(plan: Plan, status: dict[str, tuple[str, str]], only: set[str] | None = None) -> list[str]:
    """What `--dry-run` prints: every instance in order, whether it runs, and why."""
    lines = [f"study {plan.study.name}: {len(plan.order)} stage instance(s) -> {plan.out}"]
    for key in plan.order:
        inst = plan.instances[key]
        what, why = status[key]
        if only is not None and key not in only:
            what, why = "skip", "not selected by --only"
        deps = f" after {', '.join(sorted(inst.deps))}" if inst.deps else ""
        lines.append(f"  [{what:4s}] {key:32s} {inst.job.name:16s}{deps}: {why}")
    for key, why in plan.off.items():
        lines.append(f"  [off ] {key:32s} {plan.study.stages[key.partition('@')[0]].job:16s}: {why}")
    todo = sum(1 for k in plan.order if status[k][0] == "run" and (only is None or k in only))
    lines.append(f"{todo} to run, {len(plan.order) - todo} not" + (f", {len(plan.off)} off" if plan.off else ""))
    return lines


def hard_failures(plan: Plan, result: dict[str, Any]) -> list[str]:
    """Failed or skipped instances that fail the study: all but the `optional` stages'
    failures and what only they held up."""
    soft = {k for k in result["failed"] if plan.study.stages[plan.instances[k].stage].optional}
    for key in plan.order:  # in order: a skipped instance's blockers are decided before it
        if key in result["skipped"]:
            blockers = {d for d in plan.instances[key].deps if d in result["failed"] or d in result["skipped"]}
            if blockers and blockers <= soft:
                soft.add(key)
    return [k for k in [*result["failed"], *result["skipped"]] if k not in soft]


def selected(plan: Plan, only: list[str] | None) -> set[str] | None:
    """Instances picked by --only (stage names or instance keys); None: all."""
    if not only:
        return None
    keys = set()
    for name in only:
        got = {k for k, i in plan.instances.items() if k == name or i.stage == name}
        if not got:
            raise ValueError(f"--only {name}: no such stage or instance (stages: {', '.join(plan.study.stages)})")
        keys |= got
    return keys


def run_study(plan: Plan, *, only: list[str] | None = None, dry_run: bool = False,
              max_parallel: int | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Run what is missing; returns {"ran": [...], "done": [...], "failed": {key: reason},
    "skipped": {key: reason}}."""
    picked = selected(plan, only)
    status = status_of(plan, read_state(plan.out))
    for line in plan_lines(plan, status, picked):
        progress(line)
    todo = [k for k in plan.order if status[k][0] == "run" and (picked is None or k in picked)]
    result: dict[str, Any] = {"ran": [], "done": [k for k in plan.order if status[k][0] == "done"],
                              "failed": {}, "skipped": {}, "planned": list(todo)}
    if dry_run:
        return result
    if picked is not None:
        for key in todo:
            missing = [d for d in plan.instances[key].deps if status[d][0] != "done" and d not in todo]
            if missing:
                raise ValueError(f"--only: {key} needs {', '.join(sorted(missing))} first (run the study without "
                                 "--only, or add them)")
    if not todo:
        progress(f"study {plan.study.name}: nothing to do, every stage is complete for these settings")
        return result

    from rexeval.pipelines.core.runtime import init_ray

    init_ray()
    state = StudyState(plan)
    previous = {k: dict(v) for k, v in state.data["stages"].items()}
    waiting = set(todo)
    running: dict[Future, str] = {}
    finished = set(result["done"])

    def run_one(key: str) -> dict:
        inst = plan.instances[key]
        say = (lambda line: progress(f"[{key}] {line}"))
        old = previous.get(key) or {}
        # Settings or upstream outputs changed since this folder was written: the study
        # owns the folder, so the job starts it over (unless it recomputes only what
        # changed itself). An interrupted run (same fingerprint) resumes instead.
        changed = bool(old) and old.get("fingerprint") != inst.fingerprint and inst.out.exists()
        overwrite = changed and not inst.job.keeps_changed_settings
        say(f"{inst.job.name} -> {inst.out}" + (" (re-running: settings or inputs changed)" if changed else ""))
        state.record(key, status="running", started=_now(), reason=None)
        t0 = time.time()
        cfg = build_config(inst.job, inst.settings)
        res = inst.job.run(cfg, overwrite, say)
        state.record(key, status="complete", finished=_now(), seconds=round(time.time() - t0, 2),
                     summary=counts_of(res if isinstance(res, dict) else {}), reason=None)
        return res

    with ThreadPoolExecutor(max_parallel or plan.study.max_parallel, thread_name_prefix="rexeval-study") as pool:
        while waiting or running:
            for key in sorted(waiting, key=plan.order.index):
                deps = plan.instances[key].deps
                blocked = [d for d in deps if d in result["failed"] or d in result["skipped"]]
                if blocked:
                    waiting.discard(key)
                    why = f"upstream {', '.join(sorted(blocked))} did not complete"
                    result["skipped"][key] = why
                    state.record(key, status="skipped", reason=why, finished=_now())
                    progress(f"[{key}] skipped: {why}")
                elif deps <= finished:
                    waiting.discard(key)
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
                    reason = f"{type(exc).__name__}: {exc}"
                    result["failed"][key] = reason
                    state.record(key, status="failed", reason=reason, finished=_now(),
                                 traceback="".join(traceback.format_exception(exc))[-4000:])
                    optional = plan.study.stages[plan.instances[key].stage].optional
                    progress(f"[{key}] FAILED{' (optional stage: the study goes on)' if optional else ''}: {reason}")
    return result
