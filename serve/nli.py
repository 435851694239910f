"""The NLI scorer as a Ray Serve deployment that batch jobs share.

Why Serve: several evaluation jobs (and their actors) need the same NLI model; one
deployment loads it once per replica, and `@serve.batch` merges the pairs of
concurrent requests into full model batches, which is where the throughput is.

Two ways in:
- a `DeploymentHandle` (`handle.score.remote(pairs)`), what jobs on the cluster use;
- HTTP (the route is /nli unless set otherwise):
  - `POST <route>` with `{"pairs": [[premise, hypothesis], ...]}` (`NLIRequest`) ->
    `{"probs": [[p_entailment, p_neutral, p_contradiction], ...], "labels": [...]}`
    (`NLIResponse`). Malformed JSON is answered 400, a body or a request over the limits
    (`ServeLimits`) 413, a body of the wrong shape 422, a missing or wrong token 401.
    When every replica is busy and the queue is full (`max_queued_requests`), Serve
    answers 503 and the deployment keeps serving.
  - `GET <route>`: model, labels, limits (`NLIInfo`); `GET <route>/healthz`: 200
    `{"status": "ok"}` once a replica has loaded its model, asked without a token (for
    load balancers and Kubernetes probes).

`rexeval serve nli` runs it until stopped; `app` builds it from a `serve run` /
`serve deploy` config (`import_path: rexeval.serve.nli:app`, args `NLIAppArgs`).
The HTTP proxy binds 127.0.0.1 unless told otherwise; anything else needs a token
(serve/common.py). Batching is counted in pairs (`batch_size_fn`), so one large
request cannot make a batch larger than `max_batch_pairs`. Each replica counts its
requests by route and status, the pairs waiting in it and its batch sizes
(serve/telemetry.py, on Ray's metrics endpoint).
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from rexeval.registry import load_object
from rexeval.serve.common import (HEALTH_PATH, TOKEN_ENV, AppAuth, ReplicaSettings, RequestError, auth_headers,
                                  forget_a_dead_controller, running_apps, serve_running)  # noqa: F401
from rexeval.serve.deployment import HttpRoutes, answer_http, config_from_args, deployment_app, start_app
from rexeval.serve.telemetry import ReplicaMetrics

DEFAULT_ROUTE = "/nli"
APP_NAME = "rexeval-nli"
HTTP_ROUTES = {("", "POST"): "score", ("", "GET"): "info", (HEALTH_PATH, "GET"): None}
"""(path below the route, method) -> the route tag its requests are counted under."""
HTTP = HttpRoutes(HTTP_ROUTES,
                  not_found=f"no such endpoint {{path!r}}: POST or GET the route, GET <route>{HEALTH_PATH}",
                  not_allowed="use POST (score) or GET (info)")
"""The NLI app's routes and refusals (the opening every request meets: serve/deployment.py)."""


class ServeLimits(BaseModel):
    """Bounds that keep one request from taking a replica hostage."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(2_000_000, ge=1)
    max_pairs: int = Field(2048, ge=1, description="pairs per request")
    max_chars: int = Field(8000, ge=1, description="characters per premise or hypothesis")


class NLIServeConfig(ReplicaSettings):
    """How the deployment runs: model, batching; replicas and queue from ReplicaSettings."""

    model: str = Field(description="NLI checkpoint reference (path, URI or hub id; a URI is copied "
                                   "to each replica's node where it loads)")
    scorer: str = Field("rexeval.models.encoders.nli:NLIScorer",
                        description="package.module:Class building the scorer from a location")
    device: str = "auto"
    scorer_options: dict[str, Any] = Field(default_factory=dict)
    max_batch_pairs: int = Field(64, ge=1)
    batch_wait_timeout_s: float = Field(0.01, ge=0)
    limits: ServeLimits = Field(default_factory=ServeLimits)


class NLIAppArgs(AppAuth, NLIServeConfig):
    """The `args` of `rexeval.serve.nli:app` in a Serve config: the deployment's settings
    and how it authenticates (the token's hash is filled in where it is built)."""


class NLIRequest(BaseModel):
    """POST <route>: the pairs to score (at most `limits.max_pairs`)."""

    pairs: list[tuple[str, str]]


class NLIResponse(BaseModel):
    """One row of probabilities per pair, in the order of `labels`."""

    probs: list[tuple[float, float, float]]
    labels: list[str]


class NLIInfo(BaseModel):
    """GET <route>: what answers and within which limits."""

    model: str
    labels: list[str]
    limits: ServeLimits
    max_batch_pairs: int
    auth: bool


def parse_pairs(body: bytes, limits: ServeLimits) -> list[tuple[str, str]]:
    """Validate one HTTP body into pairs (pure, so it is tested without Serve)."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"body of {len(body)} bytes is over the limit of {limits.max_body_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
        raise RequestError(422, 'expected {"pairs": [[premise, hypothesis], ...]}')
    pairs = data["pairs"]
    if len(pairs) > limits.max_pairs:
        raise RequestError(413, f"{len(pairs)} pairs is over the limit of {limits.max_pairs} per request")
    out = []
    for i, pair in enumerate(pairs):
        if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(t, str) for t in pair)):
            raise RequestError(422, f"pairs[{i}] must be [premise, hypothesis] (two strings)")
        if max(len(pair[0]), len(pair[1])) > limits.max_chars:
            raise RequestError(413, f"pairs[{i}] has a text over {limits.max_chars} characters")
        out.append((pair[0], pair[1]))
    return out


def _pairs_in(requests: list) -> int:
    return sum(len(r) for r in requests)


class NLIServer:
    """The deployment's class (wrapped by `serve.deployment` in `nli_app`)."""

    def __init__(self, cfg: dict[str, Any]):
        from rexeval.models.refs import resolve

        self.cfg = NLIServeConfig(**cfg)
        cls = load_object(self.cfg.scorer)
        location = resolve(self.cfg.model).location
        self.scorer = cls(location, model_ref=self.cfg.model, device=self.cfg.device,
                          **self.cfg.scorer_options)
        self.labels = ["entailment", "neutral", "contradiction"]
        self.metrics = ReplicaMetrics(APP_NAME)
        self._batch.set_max_batch_size(self.cfg.max_batch_pairs)
        self._batch.set_batch_wait_timeout_s(self.cfg.batch_wait_timeout_s)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01, batch_size_fn=_pairs_in)
    async def _batch(self, requests: list[list[tuple[str, str]]]) -> list[list[list[float]]]:
        """Score the pairs of several requests in one model call; split the rows back."""
        flat = [p for r in requests for p in r]
        self.metrics.batch(len(flat))
        probs = self.scorer.score([p for p, _ in flat], [h for _, h in flat]) if flat else []
        out, start = [], 0
        for r in requests:
            out.append([[float(x) for x in row] for row in probs[start:start + len(r)]])
            start += len(r)
        return out

    async def _score_pairs(self, pairs: list[tuple[str, str]]) -> list[list[float]]:
        """A request larger than one batch goes in as several batch items (Serve refuses
        an item over `max_batch_size`); they may share batches with other requests."""
        import asyncio

        size = self.cfg.max_batch_pairs
        with self.metrics.queued(len(pairs)):
            if len(pairs) <= size:
                return await self._batch(pairs)
            parts = await asyncio.gather(*(self._batch(pairs[i:i + size]) for i in range(0, len(pairs), size)))
        return [row for part in parts for row in part]

    async def score(self, pairs: list) -> list[list[float]]:
        """Handle API: [(premise, hypothesis), ...] -> [[E, N, C], ...]."""
        with self.metrics.timed("handle.score"):
            return await self._score_pairs([(str(p), str(h)) for p, h in pairs])

    def info(self) -> dict[str, Any]:
        return NLIInfo(model=self.cfg.model, labels=self.labels, limits=self.cfg.limits,
                       max_batch_pairs=self.cfg.max_batch_pairs,
                       auth=self.cfg.token_sha256 is not None).model_dump()

    async def __call__(self, request) -> Any:
        return await answer_http(request, HTTP, self.metrics, self.cfg.token_sha256, self._respond)

    async def _respond(self, request, path: str, method: str) -> Any:
        """GET or POST the route (authenticated: the opening let it in)."""
        from starlette.responses import JSONResponse

        if method == "GET":
            return JSONResponse(self.info())
        try:
            pairs = parse_pairs(await request.body(), self.cfg.limits)
        except RequestError as exc:
            return HTTP.refusal(path, exc)
        probs = await self._score_pairs(pairs)
        return JSONResponse({"probs": probs, "labels": self.labels})


def app(args: dict[str, Any]):
    """Serve application builder (`import_path: rexeval.serve.nli:app`): the deployment
    from `args` (NLIAppArgs); with auth "token", the token comes from `token_env`."""
    return nli_app(config_from_args(args, NLIAppArgs, NLIServeConfig))


def nli_app(cfg: NLIServeConfig):
    """The Serve application for `cfg` (deployment options from the config)."""
    return deployment_app(NLIServer, "NLIServer", cfg)


def start_nli_service(cfg: NLIServeConfig, host: str = "127.0.0.1", port: int | None = None,
                      route: str = DEFAULT_ROUTE, name: str = APP_NAME):
    """Start Serve's HTTP proxy (127.0.0.1 by default) and the NLI app; its handle."""
    from rexeval.models.refs import resolve

    resolve(cfg.model, prepare=False)  # a missing model package or URI fails here, not in a replica's log
    return start_app(lambda: nli_app(cfg), name, route, host, port)


class ServeNLIClient:
    """`score(premises, hypotheses)` through a running deployment: the pairs go out in
    chunks, concurrently, so the replicas' `@serve.batch` can merge them; the same
    interface as the in-process `NLIScorer`, so metric code does not care which."""

    def __init__(self, handle, chunk: int = 256):
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.handle = handle
        self.chunk = int(chunk)

    @classmethod
    def connect(cls, app_name: str = APP_NAME, deployment: str = "NLIServer", **kw) -> ServeNLIClient:
        """A client for a deployment already running on this Ray cluster."""
        forget_a_dead_controller()
        return cls(serve.get_deployment_handle(deployment, app_name=app_name), **kw)

    def score(self, premises, hypotheses, batch_size=None):
        import numpy as np

        if len(premises) != len(hypotheses):
            raise ValueError(f"{len(premises)} premises but {len(hypotheses)} hypotheses")
        pairs = list(zip(premises, hypotheses))
        calls = [self.handle.score.remote(pairs[i:i + self.chunk]) for i in range(0, len(pairs), self.chunk)]
        rows = [row for call in calls for row in call.result()]
        return np.asarray(rows, dtype=np.float32).reshape(-1, 3)


class HttpNLIClient:
    """`score(premises, hypotheses)` against a deployment reached over HTTP (another
    cluster, or a service shared by several teams): chunks within the server's
    `max_pairs`, sent concurrently; 503 answers are retried with back-off. The bearer
    token, when the service asks for one, comes from REXEVAL_SERVE_TOKEN (`token_env`)."""

    def __init__(self, url: str, chunk: int = 256, concurrency: int = 8, timeout_s: float = 300.0,
                 max_retries: int = 5, token_env: str | None = None):
        self.url = url
        self.headers = auth_headers(token_env or TOKEN_ENV)
        self.chunk = int(chunk)
        self.concurrency = int(concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)

    def _post(self, client, pairs: list) -> list:
        import time

        for attempt in range(self.max_retries + 1):
            r = client.post(self.url, json={"pairs": [list(p) for p in pairs]}, headers=self.headers)
            if r.status_code == 503 and attempt < self.max_retries:
                time.sleep(0.2 * 2 ** attempt)
                continue
            if r.status_code != 200:
                raise RuntimeError(f"NLI service {self.url} answered {r.status_code}: {r.text[:300]}")
            return r.json()["probs"]
        raise AssertionError("unreachable")

    def score(self, premises, hypotheses, batch_size=None):
        from concurrent.futures import ThreadPoolExecutor

        import httpx
        import numpy as np

        if len(premises) != len(hypotheses):
            raise ValueError(f"{len(premises)} premises but {len(hypotheses)} hypotheses")
        pairs = list(zip(premises, hypotheses))
        chunks = [pairs[i:i + self.chunk] for i in range(0, len(pairs), self.chunk)]
        with httpx.Client(timeout=self.timeout_s) as client, ThreadPoolExecutor(self.concurrency) as pool:
            rows = [row for part in pool.map(lambda c: self._post(client, c), chunks) for row in part]
        return np.asarray(rows, dtype=np.float32).reshape(-1, 3)
