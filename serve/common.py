"""What every rexeval Serve deployment shares: replica and queue settings, the request
error with its HTTP status, and a job's lease on an application (use the one running,
or start it and leave the cluster as found when done)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray import serve


class ReplicaSettings(BaseModel):
    """Replicas, autoscaling, the requests a replica takes and the queue before 503."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(4, gt=0)
    # Requests in flight per replica: with small requests, fewer than a batch's worth
    # could never fill a batch (measured in benchmarks/bench_nli.py).
    max_ongoing_requests: int = Field(64, ge=1)
    max_queued_requests: int = Field(256, ge=1)
    num_cpus: float = Field(1, gt=0)
    num_gpus: float = Field(0, ge=0)

    def autoscaling(self) -> dict[str, Any]:
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests}


class RequestError(ValueError):
    """A request the deployment refuses, with the HTTP status it deserves."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def serve_running() -> bool:
    """Whether Serve (its controller) is up on the connected Ray cluster."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return True
    except ValueError:
        return False


def running_apps() -> set[str]:
    """Names of the Serve applications running on the connected Ray cluster."""
    try:
        return {name for name, app in serve.status().applications.items()
                if str(app.status).endswith("RUNNING")}
    except Exception:  # noqa: BLE001  (Serve not started on this cluster: nothing runs)
        return set()


class AppLease:
    """A job's use of the Serve application `name`: the one already running, or one it
    starts; `release()` then deletes only what the job started, and shuts Serve down
    when the job was the one that started Serve (a Serve left behind on one port breaks
    later starts on other ports)."""

    def __init__(self, name: str, label: str, progress: Callable[[str], None] = print):
        self.name, self.label, self.progress = name, label, progress
        self.started = False
        self.started_serve = False

    def acquire(self, start: Callable[[], Any], what: str, where: str) -> str:
        """`serve:NAME`; calls `start()` (serving `what` at `where`) when no such app runs."""
        if self.name in running_apps():
            self.progress(f"  {self.label}: using the running Serve application {self.name!r}")
            return f"serve:{self.name}"
        self.progress(f"  {self.label}: starting the Serve deployment {self.name!r} ({what}) on {where}")
        self.started_serve = not serve_running()
        start()
        self.started = True
        return f"serve:{self.name}"

    def release(self) -> None:
        if self.started:
            if self.started_serve:
                serve.shutdown()
            else:
                serve.delete(self.name)
            self.progress(f"  {self.label}: stopped the Serve application {self.name!r} this job started")
            self.started = False
