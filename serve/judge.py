"""The LLM judge as a Ray Serve deployment that batch jobs share.

Why Serve: a judging job runs many Ray Data actors; each loading its own copy of the
judge model (or each opening its own connections to a rate-limited API) wastes memory
and throughput. One deployment holds ONE backend per replica (an in-process `hf` model,
a test double, or an `openai` backend forwarding to an OpenAI-compatible upstream) and
`@serve.batch` merges the chat requests of concurrent callers into one
`generate()` call, which is where a batched model gets its speed.

Ways in:
- a `DeploymentHandle`: `handle.generate.remote([ChatRequest dict, ...])` ->
  `[LLMResult dict, ...]`, and `handle.info.remote()` -> model id, limits, counters;
- HTTP (the route is /judge unless set otherwise):
  - `POST <route>` with `{"requests": [ChatRequest JSON, ...]}` (`JudgeRequest`) ->
    `{"results": [LLMResult JSON, ...], "model_id": ...}` (`JudgeResponse`). Malformed
    JSON is answered 400, a body or a request over the limits (`JudgeLimits`) 413, a
    body of the wrong shape 422, a missing or wrong token 401; overload (every replica
    busy, `max_queued_requests` full) 503.
  - `GET <route>`: model id, limits, counters; `GET <route>/healthz`: 200
    `{"status": "ok"}` without a token, for probes.
  - `POST <route>/v1/chat/completions`, `GET <route>/v1/models` and
    `GET <route>/v1/models/{model}`: OpenAI's shape, errors included
    (serve/openai_compat.py), so `base_url=http://host:8000/judge/v1` works in any
    OpenAI client, and in our own `openai` backend.

The client side (`ServeJudgeLLM`, the "serve" LLM backend, and `JudgeService`, which
starts, reuses and stops the app for a job) is in `serve/judge_client.py`.

`rexeval serve judge` runs it until stopped; `app` builds it from a `serve run` /
`serve deploy` config (`import_path: rexeval.serve.judge:app`, args `JudgeAppArgs`).
The HTTP proxy binds 127.0.0.1 unless told otherwise; anything else needs a bearer
token (serve/common.py). Secrets: give the upstream key
as `api_key_env` (read on the replica), not `api_key`, which would sit in Serve's config.

Metrics (serve/telemetry.py, on Ray's metrics endpoint): each replica counts its
requests by route and status, the chat requests waiting in it, its batch sizes, and
its backend's calls, cache hits and tokens.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ray import serve

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMResult, check_model_here
from rexeval.serve.common import HEALTH_PATH, AppAuth, ReplicaSettings, RequestError, validation_summary
from rexeval.serve.deployment import HttpRoutes, answer_http, config_from_args, deployment_app, start_app
from rexeval.serve.openai_compat import (CHAT_PATH, MODEL_PATH, MODELS_PATH, OPENAI_PREFIX, OpenAIError,
                                         chat_completion, models_list, openai_error_body, openai_route,
                                         parse_chat_completion, retrieve_model)
from rexeval.serve.telemetry import ReplicaMetrics

DEFAULT_ROUTE = "/judge"
APP_NAME = "rexeval-judge"
DEPLOYMENT = "JudgeServer"
HTTP_ROUTES = {("", "POST"): "judge", ("", "GET"): "info", (CHAT_PATH, "POST"): "chat_completions",
               (MODELS_PATH, "GET"): "models", (MODEL_PATH, "GET"): "model", (HEALTH_PATH, "GET"): None}
"""(path below the route, method) -> the route tag its requests are counted under."""


def is_openai_path(path: str) -> bool:
    return path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/")


def _error_body(path: str, exc: RequestError) -> dict | None:
    """OpenAI clients read errors in OpenAI's shape: every refusal under /v1 (401, 404,
    405, 413, 400, 500, 503) is one; the native routes keep `{"error": message}`."""
    if isinstance(exc, OpenAIError) or is_openai_path(path):
        return openai_error_body(exc)
    return None


_NO_SUCH_ROUTE = ("no {method} {path!r}: POST or GET the route, "
                  f"POST <route>{CHAT_PATH}, GET <route>{MODELS_PATH}, GET <route>{MODELS_PATH}/{{{{model}}}}, "
                  f"GET <route>{HEALTH_PATH}")
HTTP = HttpRoutes(HTTP_ROUTES, not_found=_NO_SUCH_ROUTE, not_allowed=_NO_SUCH_ROUTE, error_body=_error_body,
                  route_of=openai_route)
"""The judge's routes and refusals (the opening every request meets: serve/deployment.py)."""


class JudgeLimits(BaseModel):
    """Bounds that keep one caller from taking a replica hostage."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(8_000_000, ge=1)
    max_requests: int = Field(256, ge=1, description="chat requests per call")
    max_messages: int = Field(64, ge=1, description="messages per chat request")
    max_chars: int = Field(32_000, ge=1, description="characters per message")
    max_tokens: int = Field(8192, ge=1, description="largest sampling.max_tokens accepted")


class JudgeServeConfig(ReplicaSettings):
    """How the deployment runs: which backend, cache, batching; replicas and queue
    from ReplicaSettings."""

    backend: BackendSpec = Field(description="the judge backend each replica builds (hf, openai, module:Class)")
    cache: str | None = Field(None, description="the replicas' LLM-call cache: a URI (one object per call, "
                                                "which a replica on any node reads) or a SQLite file on "
                                                "each replica's node (None: no cache)")
    max_batch_requests: int = Field(32, ge=1, description="chat requests merged into one generate()")
    batch_wait_timeout_s: float = Field(0.02, ge=0)
    target_ongoing_requests: float = Field(8, gt=0)
    limits: JudgeLimits = Field(default_factory=JudgeLimits)


class JudgeAppArgs(AppAuth, JudgeServeConfig):
    """The `args` of `rexeval.serve.judge:app` in a Serve config: the deployment's
    settings and how it authenticates (the token's hash is filled in where it is built)."""


# -- request validation (pure: tested without Serve) -----------------------------------


class JudgeRequest(BaseModel):
    """POST <route>: chat requests (at most `limits.max_requests`), answered in order."""

    model_config = ConfigDict(extra="forbid")

    requests: list[ChatRequest]


class JudgeResponse(BaseModel):
    """One result per request (an error result for one that failed), and the model id."""

    results: list[LLMResult]
    model_id: str


def limit_problem(request: ChatRequest, limits: JudgeLimits) -> str | None:
    """Why `request` is over the limits, or None when it is within them."""
    if len(request.messages) > limits.max_messages:
        return f"{len(request.messages)} messages is over the limit of {limits.max_messages}"
    for j, m in enumerate(request.messages):
        if len(m.get("content", "")) > limits.max_chars:
            return f"messages[{j}] is over {limits.max_chars} characters"
    if request.sampling.max_tokens > limits.max_tokens:
        return f"max_tokens {request.sampling.max_tokens} is over the limit of {limits.max_tokens}"
    return None


def parse_judge_body(body: bytes, limits: JudgeLimits) -> list[ChatRequest]:
    """Validate one HTTP body into chat requests, or raise RequestError(status)."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"body of {len(body)} bytes is over the limit of {limits.max_body_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise RequestError(422, 'expected {"requests": [{"messages": [...], "sampling": {...}}, ...]}')
    if len(data["requests"]) > limits.max_requests:
        raise RequestError(413, f"{len(data['requests'])} requests is over the limit of "
                                f"{limits.max_requests} per call")
    try:
        requests = JudgeRequest.model_validate(data).requests
    except ValidationError as exc:
        raise RequestError(422, f"not a list of chat requests: {validation_summary(exc)}") from None
    for i, r in enumerate(requests):
        problem = limit_problem(r, limits)
        if problem:
            raise RequestError(413, f"requests[{i}]: {problem}")
    return requests


def _requests_in(items: list) -> int:
    return sum(len(x) for x in items)


# -- the deployment ----------------------------------------------------------------------


class JudgeServer:
    """The deployment's class (wrapped by `serve.deployment` in `judge_app`)."""

    def __init__(self, cfg: dict[str, Any]):
        from rexeval.models.llm.cache import build_cached_backend

        self.cfg = JudgeServeConfig(**cfg)
        spec = self.cfg.backend
        refuse_engines_in_replica(spec)
        self.llm = build_cached_backend(spec.backend, spec.model, spec.options, self.cfg.cache)
        self.generate_calls = self.requests_served = self.largest_batch = 0
        self.metrics = ReplicaMetrics(APP_NAME)
        self._batch.set_max_batch_size(self.cfg.max_batch_requests)
        self._batch.set_batch_wait_timeout_s(self.cfg.batch_wait_timeout_s)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.02, batch_size_fn=_requests_in)
    async def _batch(self, items: list[list[ChatRequest]]) -> list[list[dict]]:
        """One generate() for the requests of several callers; results split back."""
        flat = [r for item in items for r in item]
        self.generate_calls += 1
        self.requests_served += len(flat)
        self.largest_batch = max(self.largest_batch, len(flat))
        self.metrics.batch(len(flat))
        t0 = time.perf_counter()
        try:
            # In a thread: the replica keeps accepting (and queueing) calls meanwhile.
            results = await asyncio.to_thread(self.llm.generate, flat)
            if len(results) != len(flat):
                raise RuntimeError(f"backend gave {len(results)} results for {len(flat)} requests")
        except Exception as exc:  # noqa: BLE001  (a failed batch fails its requests, not the service)
            results = [LLMResult(error=f"judge backend failed: {type(exc).__name__}: {exc}",
                                 transient=True)] * len(flat)
        results = _share_seconds(results, time.perf_counter() - t0)
        self.metrics.llm_results(self.llm.model_id, results)
        out, start = [], 0
        for item in items:
            out.append([r.model_dump() for r in results[start:start + len(item)]])
            start += len(item)
        return out

    async def _generate(self, requests: list[ChatRequest]) -> list[dict]:
        """A call larger than one batch goes in as several batch items (Serve refuses
        an item over `max_batch_size`); they may share batches with other callers."""
        size = self.cfg.max_batch_requests
        if not requests:
            return []
        with self.metrics.queued(len(requests)):
            if len(requests) <= size:
                return await self._batch(requests)
            parts = await asyncio.gather(*(self._batch(requests[i:i + size])
                                           for i in range(0, len(requests), size)))
        return [r for part in parts for r in part]

    async def generate(self, requests: list) -> list[dict]:
        """Handle API: [ChatRequest dict, ...] -> [LLMResult dict, ...], in order. A
        request that does not validate or is over the limits gets an error result."""
        with self.metrics.timed("handle.generate"):
            return await self._generate_checked(requests)

    async def _generate_checked(self, requests: list) -> list[dict]:
        limits = self.cfg.limits
        if len(requests) > limits.max_requests:
            raise RequestError(413, f"{len(requests)} requests is over the limit of {limits.max_requests}")
        out: list[dict | None] = [None] * len(requests)
        good: list[tuple[int, ChatRequest]] = []
        for i, raw in enumerate(requests):
            try:
                req = raw if isinstance(raw, ChatRequest) else ChatRequest.model_validate(raw)
            except ValidationError as exc:
                out[i] = LLMResult(error=f"invalid chat request: {validation_summary(exc)}").model_dump()
                continue
            problem = limit_problem(req, limits)
            if problem:
                out[i] = LLMResult(error=f"refused by the judge service: {problem}").model_dump()
            else:
                good.append((i, req))
        answers = await self._generate([r for _, r in good])
        for (i, _), res in zip(good, answers):
            out[i] = res
        return out  # type: ignore[return-value]

    async def chat(self, request: dict):
        """A streaming handle's method (`ray.data.llm`'s ServeDeploymentProcessor calls it):
        {"request_json": ChatRequest JSON, ...} (or "request": its dict) -> one
        {"result": LLMResult JSON}. Like `generate`, it answers bad or over-limit requests
        with an error result and never raises for the model: an exception here would be a
        transport failure."""
        raw = request.get("request_json")
        with self.metrics.timed("handle.chat"):
            [result] = await self._generate_checked([json.loads(raw) if raw else request.get("request")])
        yield {"result": json.dumps(result)}

    async def info(self) -> dict[str, Any]:
        """The model that answers (its id keys the call cache), limits and counters."""
        return {"model_id": self.llm.model_id, "backend": self.cfg.backend.backend,
                "limits": self.cfg.limits.model_dump(), "max_batch_requests": self.cfg.max_batch_requests,
                "generate_calls": self.generate_calls, "requests_served": self.requests_served,
                "largest_batch": self.largest_batch, "auth": self.cfg.token_sha256 is not None}

    async def __call__(self, request) -> Any:
        return await answer_http(request, HTTP, self.metrics, self.cfg.token_sha256, self._respond)

    async def _respond(self, request, path: str, method: str) -> Any:
        """One of HTTP_ROUTES but the health probe (authenticated: the opening let it in)."""
        from starlette.responses import JSONResponse

        try:
            if path == CHAT_PATH:
                return JSONResponse(await self._chat_completion(await request.body()))
            if path == MODELS_PATH:
                return JSONResponse(models_list(self.llm.model_id))
            if HTTP.route(path) == MODEL_PATH:
                return JSONResponse(retrieve_model(path, self.llm.model_id))
            if method == "GET":
                return JSONResponse(await self.info())
            requests = parse_judge_body(await request.body(), self.cfg.limits)
            results = await self._generate(requests)
        except RequestError as exc:
            return HTTP.refusal(path, exc)
        except Exception as exc:  # noqa: BLE001  (answered in the route's error shape, not Serve's bare 500)
            return HTTP.refusal(path, RequestError(500, f"the judge endpoint failed: {type(exc).__name__}: {exc}"))
        return JSONResponse({"results": results, "model_id": self.llm.model_id})

    async def _chat_completion(self, body: bytes) -> dict[str, Any]:
        """One OpenAI-shaped call: validated, held to the limits, batched with the rest."""
        limits = self.cfg.limits
        req = parse_chat_completion(body, self.llm.model_id, limits.max_body_bytes, limits)  # 400 with param
        [result] = await self._generate([req])
        return chat_completion(LLMResult(**result), self.llm.model_id)


def _share_seconds(results: list[LLMResult], wall: float) -> list[LLMResult]:
    """Backends that do not time their requests get an even share of the batch's wall
    time (as the hf backend reports), so cost and speed accounting see the work."""
    fresh = [r for r in results if r.ok and not r.cached and r.seconds == 0.0]
    if not fresh:
        return results
    share = wall / len(fresh)
    return [r.model_copy(update={"seconds": share}) if r.ok and not r.cached and r.seconds == 0.0 else r
            for r in results]


def app(args: dict[str, Any]):
    """Serve application builder (`import_path: rexeval.serve.judge:app`): the deployment
    from `args` (JudgeAppArgs); with auth "token", the token comes from `token_env`."""
    return judge_app(config_from_args(args, JudgeAppArgs, JudgeServeConfig))


def refuse_engines_in_replica(spec: BackendSpec) -> None:
    """A backend that starts engines of its own (vllm) cannot be a replica's model."""
    if spec.backend == "vllm":
        from rexeval.serve.judge_vllm import VLLM_IN_REPLICA

        raise ValueError(VLLM_IN_REPLICA)


def judge_app(cfg: JudgeServeConfig):
    """The Serve application for `cfg` (deployment options from the config); refuses a
    backend that would start engines inside the replica (`refuse_engines_in_replica`)."""
    refuse_engines_in_replica(cfg.backend)
    return deployment_app(JudgeServer, DEPLOYMENT, cfg)


def start_judge_service(cfg: JudgeServeConfig, host: str = "127.0.0.1", port: int | None = None,
                        route: str | None = None, name: str = APP_NAME):
    """Start Serve's HTTP proxy (127.0.0.1 by default) and the judge app; its handle.
    The route defaults to /judge for the default app name, else /<name> (routes must
    differ between apps). If Serve already runs, its proxy keeps its host and port."""
    check_model_here(cfg.backend.backend, cfg.backend.model)
    return start_app(lambda: judge_app(cfg), name, route or _route_for(name), host, port)


def _route_for(name: str) -> str:
    return DEFAULT_ROUTE if name == APP_NAME else f"/{name}"
