"""Calling the judge deployment (`serve/judge.py`) from a job, and a job's lease on it.

`ServeJudgeLLM` is an `LLMBackend` (registered as "serve") that talks to the deployment,
so a job's actors call the shared judge exactly as they would an in-process backend:
`BackendSpec(backend="serve", model=M, options={"address": "serve:rexeval-judge"})` (or an
`http(s)://.../judge` URL). Its `model_id` is the upstream model's id, asked once from
the deployment, so call-cache keys and provenance name the model that answered. Requests
over the deployment's limits get an error result without being sent; overload answers
(503, back-pressure) are retried with backoff a bounded number of times.

`JudgeService` is a job's view of the deployment: use the running app, start one and stop
it at the end, use a remote one, or none (an in-process backend).
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

from ray import serve

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMBackend, LLMResult, register_backend
from rexeval.serve.common import AppLease, auth_headers, default_serve_port, forget_a_dead_controller, idle_to_zero
from rexeval.serve.judge import (APP_NAME, DEPLOYMENT, JudgeLimits, JudgeServeConfig, limit_problem,
                                 start_judge_service)


class Overloaded(Exception):
    """The service said 503 / back-pressure: worth another try after a pause."""



class _HandleTransport:
    def __init__(self, app: str, deployment: str, timeout_s: float):
        forget_a_dead_controller()
        try:
            known = set(serve.status().applications)
        except Exception:  # noqa: BLE001  (Serve not started on this cluster)
            known = set()
        if app not in known:
            raise ValueError(f"no Serve application named {app!r} on this Ray cluster "
                             f"(running: {', '.join(sorted(known)) or 'none'})")
        self.handle = serve.get_deployment_handle(deployment, app_name=app)
        self.timeout_s = timeout_s

    def _wait(self, response):
        from ray.serve.exceptions import BackPressureError

        try:
            return response.result(timeout_s=self.timeout_s)
        except BackPressureError as exc:
            raise Overloaded(str(exc)) from None

    def info(self) -> dict:
        return self._wait(self.handle.info.remote())

    def send(self, requests: list[dict]) -> list[dict]:
        return self._wait(self.handle.generate.remote(requests))

    def close(self) -> None:
        pass



class _HttpTransport:
    def __init__(self, url: str, timeout_s: float, concurrency: int, transport=None):
        import httpx

        self.url = url
        self.client = httpx.Client(timeout=timeout_s, transport=transport, headers=auth_headers(),
                                   limits=httpx.Limits(max_connections=concurrency))

    def _check(self, r):
        if r.status_code == 503:
            raise Overloaded(f"HTTP 503: {r.text[:200]}")
        if r.status_code != 200:
            raise RuntimeError(f"judge service {self.url} answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def info(self) -> dict:
        return self._check(self.client.get(self.url))

    def send(self, requests: list[dict]) -> list[dict]:
        return self._check(self.client.post(self.url, json={"requests": requests}))["results"]

    def close(self) -> None:
        self.client.close()



@register_backend("serve")
class ServeJudgeLLM(LLMBackend):
    """An LLMBackend answered by a running judge deployment.

    Options: address ("serve:APP" in the cluster, or an http(s) URL of the route; the
    bearer token, when the endpoint asks for one, comes from REXEVAL_SERVE_TOKEN),
    deployment ("JudgeServer"), chunk (requests per call, 16: smaller calls interleave
    with other callers' in the replica's batches), concurrency (8 calls in flight),
    timeout_s (600), max_retries (6) and backoff_s (0.2) for overload answers.
    `spec.model` must equal the served model's id, or be "auto" to take whatever runs.
    Requests over the service's limits get an error result without being sent.
    """

    def __init__(self, spec: BackendSpec, transport=None):
        super().__init__(spec)
        opts = spec.options
        address = str(opts.get("address") or f"serve:{APP_NAME}")
        self.address = address
        self.chunk = int(opts.get("chunk", 16))
        self.concurrency = int(opts.get("concurrency", 8))
        self.max_retries = int(opts.get("max_retries", 6))
        self.backoff_s = float(opts.get("backoff_s", 0.2))
        timeout_s = float(opts.get("timeout_s", 600.0))
        if self.chunk < 1 or self.concurrency < 1:
            raise ValueError("chunk and concurrency must be >= 1")
        if address.startswith("serve:"):
            self.transport = _HandleTransport(address.split(":", 1)[1], str(opts.get("deployment", DEPLOYMENT)),
                                              timeout_s)
        elif address.startswith(("http://", "https://")):
            self.transport = _HttpTransport(address, timeout_s, self.concurrency, transport)
        else:
            raise ValueError(f"address must be serve:APP or an http(s) URL, got {address!r}")
        self.info = self._retrying(self.transport.info)
        self.limits = JudgeLimits(**self.info["limits"])
        served = self.info["model_id"]
        if spec.model not in ("auto", "", served):
            raise ValueError(f"the judge service at {address} serves {served!r}, not {spec.model!r} "
                             "(start it with that model, or ask for model 'auto')")
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="rexeval-judge-client")

    @property
    def model_id(self) -> str:
        return self.info["model_id"]

    def _retrying(self, call: Callable[..., Any], *args) -> Any:
        for attempt in range(self.max_retries + 1):
            try:
                return call(*args)
            except Overloaded:
                if attempt == self.max_retries:
                    raise
                time.sleep(self.backoff_s * 2 ** attempt * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def _send(self, chunk: list[ChatRequest]) -> list[LLMResult]:
        t0 = time.perf_counter()
        try:
            got = self._retrying(self.transport.send, [r.model_dump() for r in chunk])
            if len(got) != len(chunk):
                raise RuntimeError(f"judge service gave {len(got)} results for {len(chunk)} requests")
            return [LLMResult(**r) for r in got]
        except Overloaded as exc:
            error = f"judge service overloaded (gave up after {self.max_retries + 1} attempts): {exc}"
        except Exception as exc:  # noqa: BLE001  (a failed call fails its requests, the job goes on)
            error = f"judge service call failed: {type(exc).__name__}: {exc}"
        # The call never got an answer (overload, a dead replica, a lost connection):
        # transient, so a job leaves these rows for a re-run instead of recording them.
        return [LLMResult(error=error, seconds=time.perf_counter() - t0, transient=True) for _ in chunk]

    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        results: list[LLMResult | None] = [None] * len(requests)
        send: list[int] = []
        for i, r in enumerate(requests):
            problem = limit_problem(r, self.limits)
            if problem:
                results[i] = LLMResult(error=f"over the judge service's limits: {problem}")
            else:
                send.append(i)
        size = max(1, min(self.chunk, self.limits.max_requests))
        chunks = [send[i:i + size] for i in range(0, len(send), size)]
        for idx, got in zip(chunks, self._pool.map(lambda c: self._send([requests[i] for i in c]), chunks)):
            for i, res in zip(idx, got):
                results[i] = res
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.transport.close()



class JudgeService:
    """The judge a job calls: `service` is "auto" (use the running app named `app_name`,
    else start one with `cfg` and stop it at the end), "serve:APP" or an http(s) URL (an
    app someone else runs), or "none" (the job builds `cfg.backend` in-process).

    `backend_spec()` is what the job's actors build (`build_backend` / `build_cached_backend`);
    `cache_path()` is the deployment's cache when the job runs the backend itself (None
    when served: a job's pipelines put their own call cache in front of the served judge,
    `pipelines/core/llm/engines.py`). Use as a context manager, or call `stop()` in a finally.
    """

    def __init__(self, cfg: JudgeServeConfig, service: str = "auto", host: str = "127.0.0.1",
                 port: int | None = None, app_name: str = APP_NAME, progress: Callable[[str], None] = print):
        if not (service in ("auto", "none") or service.startswith(("serve:", "http://", "https://"))):
            raise ValueError(f"judge service must be auto, none, serve:APP or an http(s) URL, got {service!r}")
        self.cfg, self.service, self.host = cfg, service, host
        self.port = default_serve_port() if port is None else port
        self.app_name, self.progress = app_name, progress
        self._address: str | None = None
        self.lease = AppLease(app_name, "judge", progress)

    def address(self) -> str:
        """Where the judge is ("none", "serve:APP" or a URL); starts the app when needed."""
        if self._address is None:
            self._address = self._resolve()
        return self._address

    def _resolve(self) -> str:
        if self.service != "auto":
            return self.service
        spec = self.cfg.backend
        return self.lease.acquire(
            lambda: start_judge_service(idle_to_zero(self.cfg), host=self.host, port=self.port, name=self.app_name),
            f"{spec.backend}: {spec.model}", f"{self.host}:{self.port}")

    @property
    def started(self) -> str | None:
        """The app this job started (None when it uses one that was running)."""
        return self.app_name if self.lease.started else None

    @property
    def started_serve(self) -> bool:
        return self.lease.started_serve

    def backend_spec(self, **client_options) -> BackendSpec:
        """The spec a job's actors build: the in-process backend, or a "serve" client."""
        address = self.address()
        if address == "none":
            return self.cfg.backend
        return BackendSpec(backend="serve", model=self.cfg.backend.model,
                           options={"address": address, **client_options})

    def cache_path(self) -> str | None:
        return self.cfg.cache if self.address() == "none" else None

    def check(self) -> str:
        """Connect once from the driver (fails early on a wrong model or a dead
        service); the served model's id."""
        if self.address() == "none":
            return self.cfg.backend.model
        client = ServeJudgeLLM(self.backend_spec())
        try:
            return client.model_id
        finally:
            client.close()

    def stop(self) -> None:
        """Leave the cluster as found: our app deleted, Serve shut down if we started it."""
        self.lease.release()
        self._address = None

    def __enter__(self) -> Self:
        self.address()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
