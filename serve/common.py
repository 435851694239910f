"""What every rexeval Serve deployment shares: replica and queue settings, the request
error with its HTTP status, bearer-token authentication, the builders' arguments, and a
job's lease on an application (use the one running, or start it and leave the cluster
as found when done).

Authentication: an endpoint reachable from anywhere but this machine needs a token.
The token itself never enters Serve's config (which the dashboard shows): the builder
or `rexeval serve` reads it from an environment variable (REXEVAL_SERVE_TOKEN by
default) and gives the replicas its SHA-256, against which they check the
`Authorization: Bearer <token>` header of every request but the health route. Clients
(`HttpNLIClient`, the judge's HTTP transport) send the same variable's token.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

TOKEN_ENV = "REXEVAL_SERVE_TOKEN"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
HEALTH_PATH = "/healthz"
# The HTTP port Serve's proxy takes when a job or command starts it and none is given
# (8000, Serve's own default): a machine where 8000 is taken, or two Ray clusters on one
# host (parallel test workers), set this instead of every job's --serve-port.
SERVE_PORT_ENV = "REXEVAL_SERVE_PORT"


def default_serve_port() -> int:
    """The proxy's port when none is given: $REXEVAL_SERVE_PORT, else 8000."""
    raw = os.environ.get(SERVE_PORT_ENV, "").strip()
    if not raw:
        return 8000
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"${SERVE_PORT_ENV} must be a port number, got {raw!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"${SERVE_PORT_ENV} must be a port in 1-65535, got {port}")
    return port


class ReplicaSettings(BaseModel):
    """Replicas, autoscaling, the requests a replica takes and the queue before 503."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    initial_replicas: int | None = Field(None, ge=0, description="replicas the app starts with "
                                                                 "(None: min_replicas)")
    target_ongoing_requests: float = Field(4, gt=0)
    # Requests in flight per replica: with small requests, fewer than a batch's worth
    # could never fill a batch (measured in benchmarks/bench_nli.py).
    max_ongoing_requests: int = Field(64, ge=1)
    max_queued_requests: int = Field(256, ge=1)
    num_cpus: float = Field(1, gt=0)
    num_gpus: float = Field(0, ge=0)
    token_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                                     description="SHA-256 (hex) of the bearer token every request but "
                                                 "the health route must carry; None: no token asked")

    def autoscaling(self) -> dict[str, Any]:
        out = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
               "target_ongoing_requests": self.target_ongoing_requests}
        if self.initial_replicas is not None:
            out["initial_replicas"] = self.initial_replicas
        return out


S = TypeVar("S", bound=ReplicaSettings)


def idle_to_zero(cfg: S) -> S:
    """The settings of an app a job starts for itself: on accelerators it may scale to zero
    replicas when idle (min_replicas 0), so that its GPUs, and with them the node, go back
    to the autoscaler while the job does other work; it still starts with max(1, min)
    replicas, so the job waits for a loaded model, and fails early on one that cannot load.
    An app of CPUs only is left as it is."""
    if cfg.num_gpus <= 0:
        return cfg
    first = cfg.initial_replicas if cfg.initial_replicas is not None else cfg.min_replicas
    return cfg.model_copy(update={"min_replicas": 0, "initial_replicas": min(max(1, first), cfg.max_replicas)})


class RequestError(ValueError):
    """A request the deployment refuses, with the HTTP status it deserves; `code` (a
    machine-readable reason) and `param` (the request field at fault) go into the
    OpenAI-shaped bodies of the judge's /v1 routes (serve/openai_compat.py)."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param
        self.allow: str | None = None  # a 405's Allow header


# -- authentication ----------------------------------------------------------------------


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def token_from_env(env: str = TOKEN_ENV) -> str | None:
    """The token in `env`, or None when unset or blank."""
    token = os.environ.get(env, "").strip()
    return token or None


def bind_token_sha256(host: str, env: str = TOKEN_ENV) -> str | None:
    """The token hash an endpoint bound to `host` must check: None on a loopback address
    without a token set; refuses (ValueError) any other address without one."""
    token = token_from_env(env)
    if token is None and not is_loopback(host):
        raise ValueError(f"refusing to serve on {host} without a bearer token: set {env} "
                         "(e.g. export REXEVAL_SERVE_TOKEN=$(openssl rand -hex 32)) or bind 127.0.0.1")
    return token_sha256(token) if token else None


def check_bearer(headers: Mapping[str, str], expected_sha256: str | None) -> None:
    """Raise RequestError(401) unless the request carries the token (when one is asked)."""
    if expected_sha256 is None:
        return
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise RequestError(401, "this endpoint needs an 'Authorization: Bearer <token>' header")
    if not hmac.compare_digest(token_sha256(token.strip()), expected_sha256):
        raise RequestError(401, "the bearer token is not the one this endpoint was started with",
                           "invalid_api_key")


def auth_headers(env: str = TOKEN_ENV) -> dict[str, str]:
    """Headers a client sends: the bearer token from `env` when it is set."""
    token = token_from_env(env)
    return {"Authorization": f"Bearer {token}"} if token else {}


class AppAuth(BaseModel):
    """The builders' authentication arguments (`serve run` / `serve deploy` configs).

    auth "token" (the default) reads the token from `token_env` where the application
    is built and refuses to build without it; "none" serves without one, for a proxy
    bound to 127.0.0.1 only (say so in the config's http_options)."""

    auth: Literal["token", "none"] = "token"
    token_env: str = TOKEN_ENV

    def deployment_settings(self) -> dict[str, Any]:
        """The deployment's config from these args: the auth fields become the token's
        hash (a `token_sha256` given directly in the args is kept)."""
        settings = self.model_dump(exclude=set(AppAuth.model_fields))
        if self.auth == "none":
            settings["token_sha256"] = None
        elif not settings.get("token_sha256"):
            token = token_from_env(self.token_env)
            if token is None:
                raise ValueError(f"auth is 'token' but {self.token_env} is not set where the application "
                                 "is built: set it (from a secret), give token_sha256, or give auth: none "
                                 "for a proxy bound to 127.0.0.1 only")
            settings["token_sha256"] = token_sha256(token)
        return settings


def sub_path(request) -> str:
    """The request's path below the application's route prefix ("" for the route itself);
    Serve gives the prefix as the ASGI root_path."""
    path, root = request.url.path, request.scope.get("root_path") or ""
    if root not in ("", "/") and path.startswith(root):
        path = path[len(root):]
    return path.rstrip("/")


def validation_summary(exc) -> str:
    """A pydantic ValidationError in one line: how many problems, and the first."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{exc.error_count()} problem(s), first at {where}: {first['msg']}"


def error_response(exc: RequestError, body: dict | None = None):
    """The refusal as JSON (`{"error": message}` unless another `body` shape is given),
    with its status, the Bearer challenge on a 401 and the allowed methods on a 405."""
    from starlette.responses import JSONResponse

    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    if exc.status == 405 and exc.allow:
        headers["Allow"] = exc.allow
    return JSONResponse(body or {"error": str(exc)}, status_code=exc.status, headers=headers or None)


def startup_failure(app: str) -> str | None:
    """Why the application's replicas failed to start, in one line (the last exception
    of the first failed deployment's message), or None when none failed."""
    from ray import serve

    from rexeval.failures import last_exception_line

    try:
        status = serve.status().applications.get(app)
    except Exception:  # noqa: BLE001  (Serve itself is gone: nothing more to say)
        return None
    if status is None:
        return None
    for name, dep in status.deployments.items():
        if "FAILED" in str(dep.status) or "UNHEALTHY" in str(dep.status):
            text = dep.message or ""
            found = last_exception_line(text)
            return f"{name}: {found or (text.strip().splitlines() or ['no message'])[-1]}"
    return None


def run_app(application, name: str, route: str):
    """`serve.run` of one application; when its replicas cannot start, ServeStartFailed
    with the replica's own error in one line (Serve says only "Failed to update the
    deployments"), and the failed application is deleted."""
    from ray import serve

    from rexeval.failures import ServeStartFailed

    try:
        return serve.run(application, name=name, route_prefix=route)
    except RuntimeError as exc:
        reason = startup_failure(name)
        if reason is None:
            raise
        try:
            serve.delete(name)
        except Exception:  # noqa: BLE001  (the reason matters more than the clean-up)
            pass
        raise ServeStartFailed(f"the Serve application {name!r} could not start its replicas: {reason}") from exc


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
    from ray import serve

    try:
        return {name for name, app in serve.status().applications.items()
                if str(app.status).endswith("RUNNING")}
    except Exception:  # noqa: BLE001  (Serve not started on this cluster: nothing runs)
        return set()


class AppLease:
    """A job's use of the Serve application `name`: the one already running, or one it
    starts; `release()` deletes it only when this was the last holder of an app a lease
    started, and shuts Serve down instead when a lease started Serve too and nothing else
    is leased (a Serve left behind on one port breaks later starts on other ports).

    Holders are counted across every driver of the cluster (`serve/leases.py`: a detached
    actor keeps the book), so the steps of a study, and two `ray job submit` drivers,
    share an application: the first starts it, the others use it, and it goes when the
    last of them ends, not while another still sends requests. An app that ran before
    any lease (a standing `rexeval serve` endpoint) is never deleted."""

    def __init__(self, name: str, label: str, progress: Callable[[str], None] = print, book=None):
        from rexeval.serve.leases import Beats, RayBook

        self.name, self.label, self.progress = name, label, progress
        self.book = book if book is not None else RayBook()
        key = id(book) if book is not None else "ray"
        with _BEATS_LOCK:
            self.beats = _BEATS.setdefault(key, Beats(self.book))
        self.holder = self.beats.new_holder()
        self.started = False
        self.started_serve = False
        self._holding = False

    def acquire(self, start: Callable[[], Any], what: str, where: str, wait_s: float = 600) -> str:
        """`serve:NAME`; calls `start()` (serving `what` at `where`) when no such app runs
        and no other holder is starting it (then waits for that one, at most `wait_s`)."""
        from ray import serve

        deadline = time.monotonic() + wait_s
        said_wait = False
        while True:
            verdict = self.book.begin(self.name, self.holder, self.name in running_apps(), serve_running())
            if verdict != "wait":
                break
            if not said_wait:
                self.progress(f"  {self.label}: waiting for another job to start the Serve application {self.name!r}")
                said_wait = True
            if time.monotonic() > deadline:
                raise TimeoutError(f"another job did not finish starting the Serve application {self.name!r} "
                                   f"within {wait_s:.0f}s")
            time.sleep(0.5)
        self.beats.hold(self.holder)
        if verdict == "use":
            shared = self.book.holders(self.name) > 1
            self.progress(f"  {self.label}: using the running Serve application {self.name!r}"
                          + (" (shared with another job)" if shared else ""))
        else:
            self.progress(f"  {self.label}: starting the Serve deployment {self.name!r} ({what}) on {where}")
            self.started_serve = not serve_running()
            try:
                start()
            except BaseException:
                self.beats.drop(self.holder)
                if self.book.failed(self.name, self.holder) == "shutdown":
                    serve.shutdown()  # leave the cluster as found
                raise
            self.book.started(self.name, self.holder)
            self.started = True
        self._holding = True
        return f"serve:{self.name}"

    def release(self) -> None:
        from ray import serve

        if not self._holding:
            return
        self._holding = False
        self.started = False
        self.beats.drop(self.holder)
        action = self.book.end(self.name, self.holder, self.name in running_apps())
        if action == "shutdown":
            serve.shutdown()
        elif action == "delete":
            serve.delete(self.name)
        if action != "keep":
            self.progress(f"  {self.label}: stopped the Serve application {self.name!r} (its last job has ended)")


_BEATS: dict[Any, Any] = {}  # one heartbeat thread per book in this process
_BEATS_LOCK = threading.Lock()


def forget_a_dead_controller() -> None:
    """Drop this process's cached handle on a Serve controller that has since died.

    Serve caches its controller's handle per worker process and trusts it for the whole
    Ray session; a pooled worker (a Ray task's) that talked to a Serve instance which was
    shut down and started again would otherwise find no applications, or hold handles
    on a dead controller. Called wherever a job's worker looks up a deployment. Serve has
    no public call for this; `_check_cached_client_alive` is what its own API uses.
    """
    from ray.serve import context

    context._check_cached_client_alive()
