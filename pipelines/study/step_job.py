"""One step instance of a study as a Ray job of its own, so its driver can run off the head.

Why: a step's driver loads what its job's driver loads, and on a cluster the study's own
driver usually sits on the head, whose loss ends every job, the lease book and every
Serve application. Submitted through Ray's job server with entrypoint resources
(`config.DriverResources`), a step's driver runs on a node that has them; on an
autoscaling cluster a request that no node meets is what makes the autoscaler add one
(the job's supervisor actor asks for those resources).

How, on the study's side (`StepJobs`): the step's call (its job's run function and
config class by name, its settings, overwrite) is written to
OUT/_step_jobs/<instance>/call.json through the storage module (OUT may be s3://), and
a job is submitted whose entrypoint is `rexeval study step <that file>`, with the
study's runtime environment (the same working dir and variables as the study's driver).
The job's log is followed into the step's log file; the lines its job reports as
progress (marked `MARK`) also reach the study's terminal. The job writes its outcome to
result.json beside the call; the study reads it back once the job has ended.

How a job's end is read (`outcome`): its result "done", the step's counts; "error", a
failed step with the job's own reason line; no result, the job's status says why (a
supervisor that died with its node is a transport failure: the step is left for a
re-run, as rows whose calls failed in transport are; a driver killed by the OS, a runtime
environment that could not be set up, resources no node has are failed steps).

Inside the job (`run_call`): the call is read back, the step's registered job runs
exactly as it runs in a step process (`StudyJob.run`), and its result is written.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shlex
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from rexeval.storage import Location, location
from rexeval.pipelines.study.config import STEPS_AS, DriverResources
from rexeval.pipelines.study.step_process import StepCall, StepFailed, is_transport

STEPS_AS_ENV = "REXEVAL_STEPS_AS"  # auto | process | job: overrides the study file
OLD_STEPS_AS_ENV = "REXEVAL_STAGES_AS"  # its name before a step was renamed from "stage"; still read
JOBS_FOLDER = "_step_jobs"  # OUT/_step_jobs/<instance>/{call,result}.json (no step name starts with "_")
CALL, RESULT = "call.json", "result.json"
MARK = "::step:: "  # a progress line of the step's job, in the job's log
ENTRYPOINT = "rexeval study step"  # the hidden command that runs a call (ray_jobs/study.py)
POLL_S = 2.0
SILENT_S = 120.0  # the job server not answering this long fails the step in transport
STOP_WAIT_S = 60.0
LOST = ("JOB_SUPERVISOR_ACTOR_DIED", "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE")  # the driver's node went away


# -- which way steps run ---------------------------------------------------------------


def wanted_mode(flag: str | None, in_file: str) -> str:
    """`--steps-as`, else REXEVAL_STEPS_AS (or its old name), else the study file's `steps_as`."""
    got = flag or os.environ.get(STEPS_AS_ENV) or os.environ.get(OLD_STEPS_AS_ENV) or in_file
    if got not in STEPS_AS:
        raise ValueError(f"steps as {got!r}: expected one of {', '.join(STEPS_AS)} "
                         f"(--steps-as, {STEPS_AS_ENV}, {OLD_STEPS_AS_ENV} or the study's steps_as)")
    return got


def started_here() -> bool:
    """Whether this process started the Ray it is connected to (a laptop run) rather than
    joining a running cluster. Ray keeps that only on its worker's node object (the job
    SDK reads the dashboard's address from the same place)."""
    import ray

    node = getattr(ray._private.worker.global_worker, "node", None)
    return bool(node is not None and node.is_head())


def job_client():
    """Ray's client of the connected cluster's job server (its address from the GCS;
    RAY_API_SERVER_ADDRESS or RAY_ADDRESS, when set, win, as in every Ray job CLI)."""
    import ray
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(ray.get_runtime_context().gcs_address)


def has_job_server() -> bool:
    """Whether the connected cluster runs a dashboard (where the job server lives)."""
    import ray

    node = getattr(ray._private.worker.global_worker, "node", None)
    return bool(os.environ.get("RAY_API_SERVER_ADDRESS") or (node is not None and node.webui_url))


def resolve_mode(wanted: str) -> tuple[str, str]:
    """("job" | "process", why) for a study whose Ray is up. "job" wanted on a Ray
    without a job server is refused (ValueError); "auto" then falls back to processes."""
    if wanted == "process":
        return "process", "asked for"
    if wanted == "auto" and started_here():
        return "process", "Ray was started by this study"
    if not has_job_server():
        if wanted == "job":
            raise ValueError("steps as Ray jobs need the cluster's job server (Ray's dashboard), and this "
                             "cluster has none: start its head with the dashboard, or run the steps as "
                             "processes (--steps-as process)")
        return "process", "the cluster has no job server"
    return "job", "on a running cluster" if wanted == "auto" else "asked for"


# -- the study's side -------------------------------------------------------------------


def entrypoint(call: Location) -> str:
    """The command a step's Ray job runs."""
    return f"{ENTRYPOINT} {shlex.quote(str(call))}"


def submission_id(key: str) -> str:
    """A readable id that names the step (`ray job list`), unique per try."""
    return f"rexeval-{re.sub(r'[^A-Za-z0-9_-]', '-', key)}-{uuid.uuid4().hex[:8]}"


def by_name(obj: Any, what: str) -> str:
    """"module:name" of a module-level function or class (the job imports it by name)."""
    if isinstance(obj, str):
        return obj
    name = getattr(obj, "__qualname__", "")
    if not name or "." in name or "<" in name:
        raise StepFailed(f"NotImportable: the step's {what} {obj!r} must sit at module level to run as a Ray "
                          "job (it is imported by name there)")
    return f"{obj.__module__}:{name}"


def call_spec(call: StepCall, result: Location, runtime_env: dict[str, Any]) -> dict[str, Any]:
    """What the job needs to run `call` (JSON). Without a working dir in the runtime
    environment the job starts in a folder of Ray's, so it is given the study's working
    directory, where relative input paths point (when that node has it)."""
    return {"key": call.key, "target": by_name(call.target, "run function"), "config": by_name(call.config, "config"),
            "settings": call.settings, "overwrite": call.overwrite, "verbose": call.verbose, "result": str(result),
            "cwd": None if runtime_env.get("working_dir") else os.getcwd()}


def entrypoint_resources(res: DriverResources) -> dict[str, Any]:
    """`submit_job`'s entrypoint_* arguments for `res` (none given: Ray puts it on the head)."""
    return {"entrypoint_num_cpus": res.num_cpus or None, "entrypoint_num_gpus": res.num_gpus or None,
            "entrypoint_memory": res.memory or None, "entrypoint_resources": dict(res.resources) or None}


def describe(res: DriverResources) -> str:
    """"1 CPU, 1 GPU, 2.0 GiB, {'driver': 1.0}": what a driver asks for, in a line."""
    parts = [f"{res.num_cpus:g} CPU"] + ([f"{res.num_gpus:g} GPU"] if res.num_gpus else [])
    parts += ([f"{res.memory / 2**30:.1f} GiB"] if res.memory else []) + ([str(res.resources)] if res.resources else [])
    return ", ".join(parts)


def outcome(call: StepCall, sid: str, info: Any, result: dict[str, Any] | None) -> dict[str, Any]:
    """The counts of a step whose job ended as `info` (Ray's JobInfo) having written
    `result` (None: nothing); raises StepFailed for any other end."""
    if result and result.get("status") == "done":  # its outputs are complete, however the process ended
        return dict(result.get("counts") or {})
    status = str(getattr(info.status, "value", info.status))
    if result and result.get("status") == "error":
        raise StepFailed(result["reason"], result.get("details", ""), transport=bool(result.get("transport")))
    kind = str(getattr(info.error_type, "value", info.error_type or ""))
    said = (info.message or "").strip().splitlines()
    why = said[0] if said else "no message"
    where = f"Ray job {sid}" + (f" on node {info.driver_node_id}" if info.driver_node_id else "")
    if status == "STOPPED":
        raise StepFailed(f"StepStopped: its {where} was stopped before it reported a result; its log: "
                          f"{call.log_where}")
    if kind in LOST:
        raise StepFailed(f"StepLost: the driver of its {where} was lost ({why}); nothing is wrong with the "
                          "step: run the study again to do it", info.message or "", transport=True)
    if info.driver_exit_code is not None or kind == "JOB_ENTRYPOINT_COMMAND_ERROR":
        code = info.driver_exit_code
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        raise StepFailed(f"StepDied: the driver of its {where} ended ({how}) before it reported a result "
                          f"(out of memory? killed?); its log: {call.log_where}", info.message or "")
    raise StepFailed(f"StepNotStarted: its {where} did not start ({kind or status}: {why})", info.message or "")


class StepJobs:
    """The study's steps as Ray jobs on its cluster: each submitted, followed into its
    log, read back; all stopped when the study is interrupted."""

    def __init__(self, client, out: Location, runtime_env: dict[str, Any]):
        self.client, self.out, self.runtime_env = client, out, dict(runtime_env or {})
        self.running: dict[str, str] = {}  # instance -> submission id
        self.lock = threading.Lock()
        # The job SDK says at INFO level each time a job's log ends; the step's end says it.
        logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)

    def folder(self, key: str) -> Location:
        return self.out / JOBS_FOLDER / key

    def run(self, call: StepCall, resources: DriverResources, progress: Callable[[str], None],
            submitted: Callable[[str], None] = lambda sid: None) -> tuple[dict[str, Any], str | None]:
        """Run `call` as a Ray job asking for `resources`; its counts and the node its
        driver ran on. `progress` gets the job's progress lines (every line with
        `call.verbose`), `submitted` the submission id once it is. Raises StepFailed."""
        folder = self.folder(call.key)
        (folder / RESULT).unlink(missing_ok=True)
        (folder / CALL).write_json(call_spec(call, folder / RESULT, self.runtime_env))
        sid = submission_id(call.key)
        os.makedirs(os.path.dirname(call.log_path) or ".", exist_ok=True)
        with open(call.log_path, "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} step {call.key}: Ray job {sid}, its driver "
                      f"asking for {describe(resources)}\n")
            log.flush()
            self.client.submit_job(entrypoint=entrypoint(folder / CALL), submission_id=sid,
                                   runtime_env=self.runtime_env or None, metadata={"rexeval_step": call.key},
                                   **entrypoint_resources(resources))
            with self.lock:
                self.running[call.key] = sid
            submitted(sid)
            try:
                info = self.follow(sid, lambda line: self._line(line, log, call.verbose, progress))
            finally:
                with self.lock:
                    self.running.pop(call.key, None)
        got = folder / RESULT
        result = got.read_json() if got.is_file() else None
        node = info.driver_node_id or (result or {}).get("node")
        return outcome(call, sid, info, result), node

    @staticmethod
    def _line(line: str, log, verbose: bool, progress: Callable[[str], None]) -> None:
        """One line of the job's log: to the step's log file (unmarked), and to
        `progress` when it is a progress line (every line when verbose)."""
        said = line.startswith(MARK)
        text = line[len(MARK):] if said else line
        log.write(text + "\n")
        log.flush()
        if said or verbose:
            progress(text)

    def follow(self, sid: str, on_line: Callable[[str], None]) -> Any:
        """Pass every line of the job's log to `on_line` as it comes; its JobInfo once it
        has ended. The log is tailed (a websocket); if that breaks, it is polled."""
        seen, rest = 0, ""

        def take(chunk: str) -> None:
            nonlocal seen, rest
            seen += len(chunk)
            *lines, rest = (rest + chunk).split("\n")
            for line in lines:
                on_line(line.rstrip("\r"))

        async def tail() -> None:
            async for chunk in self.client.tail_job_logs(sid):
                take(chunk)

        try:
            asyncio.run(tail())
        except Exception:  # noqa: BLE001  (the websocket broke: the job's log is polled below)
            pass
        silent_since = None
        while True:
            try:
                info = self.client.get_job_info(sid)
                text = self.client.get_job_logs(sid)
            except Exception as exc:  # noqa: BLE001  (a job server restarting: asked again, bounded)
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since > SILENT_S:
                    raise StepFailed(f"JobServerLost: the cluster's job server did not answer for {SILENT_S:.0f}s "
                                      f"about Ray job {sid} ({type(exc).__name__}: {exc})", transport=True) from None
                time.sleep(POLL_S)
                continue
            silent_since = None
            if len(text) > seen:
                take(text[seen:])
            if info.status.is_terminal():
                break
            time.sleep(POLL_S)
        if rest:
            on_line(rest)
        return info

    def stop(self, sid: str, say: Callable[[str], None], why: str, wait_s: float = STOP_WAIT_S) -> None:
        """Stop one job (a no-op for one that has ended) and wait, bounded, for its end."""
        try:
            if self.client.get_job_status(sid).is_terminal():
                return
            say(f"stopping Ray job {sid} ({why})")
            self.client.stop_job(sid)
            deadline = time.monotonic() + wait_s
            while not self.client.get_job_status(sid).is_terminal() and time.monotonic() < deadline:
                time.sleep(POLL_S)
        except Exception as exc:  # noqa: BLE001  (a job the server no longer knows, a server gone)
            say(f"could not stop Ray job {sid}: {type(exc).__name__}: {exc}")

    def stop_all(self, say: Callable[[str], None]) -> None:
        """Stop every running step's job (the study was interrupted)."""
        with self.lock:
            running = dict(self.running)
        for key, sid in running.items():
            self.stop(sid, lambda line, key=key: say(f"[{key}] {line}"), "the study was interrupted", wait_s=0)


# -- inside the step's job ---------------------------------------------------------------


def _say(line: str) -> None:
    """A progress line of the step, marked for the study's driver (each physical line)."""
    for part in str(line).split("\n"):
        print(MARK + part, flush=True)


def run_call(call_file: str) -> int:
    """Run the step `call_file` describes (inside its Ray job) and write its result
    beside it; the job's exit code (75 when its work is left for a re-run)."""
    from rexeval.pipelines.core.study_registry import StudyJob, build_config, counts_of
    from rexeval.registry import load_object

    spec = location(call_file).read_json()
    result = location(spec["result"])
    cwd = spec.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)  # relative inputs name the study's working directory, as they do for it
        sys.path.insert(0, cwd)
    try:
        from rexeval.pipelines.core.runtime import init_ray

        # The job's runtime env already holds the variables init_ray forwards.
        os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        ray = init_ray(quiet=not spec.get("verbose"))
        node = ray.get_runtime_context().get_node_id()
        _say(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()} on node {node}: step {spec['key']}")
        job = StudyJob(spec["key"], load_object(spec["config"]), spec["target"])
        got = job.run(build_config(job, spec["settings"]), bool(spec.get("overwrite")), _say)
        result.write_json(json.loads(json.dumps({"status": "done", "node": node, "pid": os.getpid(),
                                                 "counts": counts_of(got if isinstance(got, dict) else {})},
                                                default=str)))
        return 0
    except BaseException as exc:  # noqa: BLE001  (every failure is reported to the study)
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        result.write_json({"status": "error", "reason": f"{type(exc).__name__}: {exc}", "details": tb,
                           "transport": is_transport(exc)})
        return 75 if is_transport(exc) else 1
