"""What rexeval's Serve apps (serve/nli.py, serve/judge.py) do alike, written once: the
opening of every HTTP request, the application built from a config, and the start.

Why one place: the health route, the bearer token and the 404/405 refusals are the
service's contract with probes, proxies and clients; two copies drift (one app asking
a token on /healthz, the other not). Each app keeps only what differs, in `HttpRoutes`
(its routes and the words of its refusals) and its own handlers.

The opening, in order: `GET <route>/healthz` is answered 200 `{"status": "ok"}` without
a token; every other request must carry the token (401 with a Bearer challenge); a
path the app does not serve is 404, a method a path it serves does not take 405.
All refusals are JSON (`common.error_response`), in the body shape the app asks for.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ray import serve

from rexeval.failures import ServeStartFailed
from rexeval.serve.common import (HEALTH_PATH, SERVE_PORT_ENV, AppAuth, ReplicaSettings, RequestError, check_bearer,
                                  default_serve_port, error_response, run_app, serve_running, sub_path)
from rexeval.serve.telemetry import ReplicaMetrics, route_label

HEALTHY = {"status": "ok"}
BIND_FAILED = "Failed to bind to address"  # what Serve's proxy raises (ray.serve._private.proxy)

Config = TypeVar("Config", bound=ReplicaSettings)


@dataclass(frozen=True)
class HttpRoutes:
    """One app's HTTP face: `tags` maps (path below the route, method) to the route tag
    its requests are counted under (None: not counted, the health probe); every pair
    not in it is refused. `not_found` (404, below the route) and `not_allowed` (405, on
    the route) are `str.format` templates given `method` and `path` (the full URL
    path). `error_body(path, exc)` gives another JSON shape for a refusal (None:
    `{"error": message}`). `route_of(path)` names the route a path belongs to, for
    routes with a parameter in the path (`/v1/models/{model}`); None: the path itself."""

    tags: Mapping[tuple[str, str], str | None]
    not_found: str
    not_allowed: str
    error_body: Callable[[str, RequestError], dict | None] | None = None
    route_of: Callable[[str], str] | None = None

    def route(self, path: str) -> str:
        """The key in `tags` a path below the route is served under."""
        return self.route_of(path) if self.route_of else path

    def unknown(self, path: str, method: str, url_path: str) -> RequestError | None:
        """The refusal of a (path, method) the app does not serve; None for one it does:
        404 for a path it does not serve, 405 (with the methods it allows) for one it
        serves by other methods, and for the route itself."""
        route = self.route(path)
        if (route, method) in self.tags:
            return None
        allowed = sorted(m for p, m in self.tags if p == route)
        template, status = (self.not_allowed, 405) if allowed or not path else (self.not_found, 404)
        exc = RequestError(status, template.format(method=method, path=url_path))
        exc.allow = ", ".join(allowed) or None
        return exc

    def refusal(self, path: str, exc: RequestError):
        """The JSON response for a refused request at `path` (below the route)."""
        return error_response(exc, self.error_body(path, exc) if self.error_body else None)


def opening(routes: HttpRoutes, path: str, method: str, url_path: str, headers: Mapping[str, str],
            token_sha256: str | None):
    """What every request meets first (pure: tested without Serve): the health answer,
    a refusal (401, 404, 405), or None when the app's own handler answers."""
    from starlette.responses import JSONResponse

    if path == HEALTH_PATH and method == "GET":
        return JSONResponse(HEALTHY)
    try:
        check_bearer(headers, token_sha256)
    except RequestError as exc:
        return routes.refusal(path, exc)
    problem = routes.unknown(path, method, url_path)
    return routes.refusal(path, problem) if problem is not None else None


async def answer_http(request, routes: HttpRoutes, metrics: ReplicaMetrics, token_sha256: str | None,
                      respond: Callable[[Any, str, str], Awaitable[Any]]) -> Any:
    """A deployment's `__call__`: the opening, then `respond(request, path, method)` for
    a route the app serves; the answer counted under its route tag and status."""
    path, method = sub_path(request), request.method

    async def answer():
        opened = opening(routes, path, method, request.url.path, request.headers, token_sha256)
        return opened if opened is not None else await respond(request, path, method)

    return await metrics.http(route_label(routes.route(path), method, routes.tags), answer())


# -- building and starting an application -----------------------------------------------


def config_from_args(args: dict[str, Any], args_model: type[AppAuth], config_model: type[Config]) -> Config:
    """A builder's `args` (a `serve run` / `serve deploy` config) as the deployment's
    config: validated by `args_model`, the auth fields turned into the token's hash."""
    return config_model(**args_model.model_validate(args).deployment_settings())


def deployment_app(cls: type, name: str, cfg: ReplicaSettings):
    """The Serve application of deployment class `cls` named `name`: replicas, queue and
    resources from `cfg`, which each replica gets (as a dict) to build itself from."""
    dep = serve.deployment(
        cls, name=name,
        autoscaling_config=cfg.autoscaling(),
        max_ongoing_requests=cfg.max_ongoing_requests,
        max_queued_requests=cfg.max_queued_requests,
        ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus},
    )
    return dep.bind(cfg.model_dump())


def start_app(build: Callable[[], Any], name: str, route: str | None, host: str = "127.0.0.1",
              port: int | None = None):
    """Start Serve's HTTP proxy on `host`:`port` (default: `default_serve_port()`; if Serve
    already runs, its proxy keeps its own), then the application `build()` gives, as `name`
    under `route`; its handle. `build` runs after the proxy starts, as each app's start always did.

    A port another process holds fails Serve's proxy with a remote traceback; the user gets
    ServeStartFailed naming the port and how to pick another, and a Serve this call started
    is shut down again (a controller left with a dead proxy would keep the port for later starts)."""
    port = default_serve_port() if port is None else port
    was_running = serve_running()
    try:
        serve.start(http_options={"host": host, "port": port})
    except Exception as exc:
        if BIND_FAILED not in str(exc):
            raise
        if not was_running:
            serve.shutdown()
        raise ServeStartFailed(f"Serve's HTTP proxy could not listen on {host}:{port}: another process holds "
                               f"that port; pick another (a job's --serve-port, `rexeval serve --port`, or "
                               f"${SERVE_PORT_ENV} for all of them)") from exc
    return run_app(build(), name, route)
