"""Ray's job server without a cluster: what a study's `StepJobs` talks to, for tests of
how a step becomes a job and how its end is read back.

`JobServer` answers the calls `ray.job_submission.JobSubmissionClient` makes. A
submitted job runs at once, in this process: by default its entrypoint itself (`rexeval
study step CALL`, whose `run_call` reads the call the study wrote and writes the result
beside it), its printed lines becoming the job's log; or, scripted (`ends`), with the
log, status and result file a test gives, as when a node is lost.
"""
from __future__ import annotations

import contextlib
import io
import shlex
from dataclasses import dataclass, field
from typing import Any

from ray.job_submission import JobInfo, JobStatus

from rexeval.storage import location


@dataclass
class Ending:
    """A scripted end: the job's log, status, error type, exit code, node, and the
    result file it leaves (None: none)."""

    log: str = ""
    status: JobStatus = JobStatus.FAILED
    error_type: str | None = None
    exit_code: int | None = None
    node: str | None = "node-w"
    message: str = ""
    result: dict[str, Any] | None = None


@dataclass
class JobServer:
    ends: list[Ending] = field(default_factory=list)  # scripted ends, in order; then real runs
    submitted: list[dict[str, Any]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    jobs: dict[str, JobInfo] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)

    def submit_job(self, **kw: Any) -> str:
        self.submitted.append(kw)
        sid, entry = kw["submission_id"], kw["entrypoint"]
        if self.ends:
            end = self.ends.pop(0)
            if end.result is not None:
                location(self._call_of(entry)["result"]).write_json(end.result)
        else:
            end = self._run(entry)
        self.logs[sid] = end.log
        self.jobs[sid] = JobInfo(status=end.status, entrypoint=entry, message=end.message,
                                 error_type=end.error_type, driver_exit_code=end.exit_code,
                                 driver_node_id=end.node)
        return sid

    @staticmethod
    def _call_of(entry: str) -> dict[str, Any]:
        *command, call = shlex.split(entry)
        assert command == ["rexeval", "study", "step"], entry
        return location(call).read_json()

    def _run(self, entry: str) -> Ending:
        """The entrypoint run here, as the job's driver would run it."""
        from rexeval.pipelines.study.step_job import run_call

        *_, call = shlex.split(entry)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = run_call(call)
        return Ending(out.getvalue(), JobStatus.SUCCEEDED if code == 0 else JobStatus.FAILED,
                      None if code == 0 else "JOB_ENTRYPOINT_COMMAND_ERROR", code)

    async def tail_job_logs(self, sid: str):
        text = self.logs[sid]
        cut = len(text) // 2  # mid-line, as the server's chunks come
        for chunk in (text[:cut], text[cut:]):
            if chunk:
                yield chunk

    def get_job_logs(self, sid: str) -> str:
        return self.logs[sid]

    def get_job_info(self, sid: str) -> JobInfo:
        return self.jobs[sid]

    def get_job_status(self, sid: str) -> JobStatus:
        return self.jobs[sid].status

    def stop_job(self, sid: str) -> bool:
        self.stopped.append(sid)
        self.jobs[sid].status = JobStatus.STOPPED
        return True


def calls_fail_in_transport(cfg, progress):
    """A step whose LLM calls all failed in transport: its work is left for a re-run."""
    from rexeval.failures import AwaitingRerun

    progress("3 row(s) left for a re-run")
    raise AwaitingRerun("3 row(s) whose calls failed in transport are left for a re-run", awaiting=3)
