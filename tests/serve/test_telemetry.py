"""The Serve apps' metrics (serve/telemetry.py), recorded by the deployments' own classes
driven in this process (no Serve): each HTTP answer counted under its route and status,
handle calls too, health probes not; the queue depth rises while work waits and comes
back to zero; the judge's calls, cache hits and tokens; an unknown path never becomes a
tag value.

Values are caught where they would go to Ray (`telemetry.emit`); the real export is
tests/deploy/test_metrics_scrape.py."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMResult, SamplingParams
from rexeval.serve.common import RequestError, token_sha256
from rexeval.serve.telemetry import ReplicaMetrics, code_class, route_label
from tests.doubles.metrics import catch_metrics

SCRIPTED = BackendSpec(backend="tests.doubles.llm:ScriptedLLM", model="scripted-judge",
                       options={"rules": [["broken", "!error"]], "default": '{"verdict": "yes"}'})


@pytest.fixture
def caught(monkeypatch):
    return catch_metrics(monkeypatch)


@pytest.fixture
def replica(monkeypatch):
    """What Serve tells a replica about itself (`serve.get_replica_context()`, which
    `@serve.batch` and ReplicaMetrics read), for a deployment class built here."""
    from ray.serve import context

    def as_replica(app: str, tag: str = "r1"):
        monkeypatch.setattr(context, "_INTERNAL_REPLICA_CONTEXT", SimpleNamespace(
            app_name=app, deployment="Deployment", replica_tag=tag,
            _deployment_config=SimpleNamespace(max_ongoing_requests=64)))

    return as_replica


def http_request(method: str, path: str, body: bytes = b"", root: str = "/judge", token: str | None = None):
    """A Starlette request as Serve's proxy hands it to a replica (the app's route
    prefix as the ASGI root_path)."""
    from starlette.requests import Request

    headers = [(b"host", b"127.0.0.1")] + ([(b"authorization", f"Bearer {token}".encode())] if token else [])
    scope = {"type": "http", "method": method, "path": root + path, "root_path": root, "query_string": b"",
             "headers": headers, "scheme": "http", "server": ("127.0.0.1", 8000)}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def chat(text: str) -> dict:
    return ChatRequest(messages=[{"role": "user", "content": text}],
                       sampling=SamplingParams(max_tokens=16)).model_dump()


def test_route_labels_and_code_classes():
    routes = {("", "POST"): "score", ("/healthz", "GET"): None}
    assert route_label("", "POST", routes) == "score"
    assert route_label("/healthz", "GET", routes) is None
    assert route_label("/../../etc/passwd", "GET", routes) == "other"  # never the raw path
    assert [code_class(c) for c in (200, 401, 413, 503)] == ["2xx", "4xx", "4xx", "5xx"]


def test_handle_calls_count_their_refusals_and_failures(caught):
    m = ReplicaMetrics("rexeval-nli")
    assert (m.app, m.replica) == ("rexeval-nli", "local")  # outside Serve
    with m.timed("handle.score"):
        pass
    with pytest.raises(RequestError), m.timed("handle.score"):
        raise RequestError(413, "too many")
    with pytest.raises(KeyError), m.timed("handle.score"):
        raise KeyError("bug")
    counts = {code: caught.total("rexeval_serve_requests", route="handle.score", code=code)
              for code in ("200", "413", "500")}
    assert counts == {"200": 1, "413": 1, "500": 1}
    assert caught.total("rexeval_serve_requests", code_class="4xx") == 1
    assert caught.total("rexeval_serve_request_seconds", app="rexeval-nli", route="handle.score") >= 0


def test_the_judge_counts_http_answers_calls_cache_hits_and_tokens(caught, replica, tmp_path, monkeypatch):
    from rexeval.serve.judge import JudgeServeConfig, JudgeServer

    replica("team-judge")  # an app deployed under another name is counted under that name
    monkeypatch.setenv("REXEVAL_SERVE_TOKEN", "s3cret")
    cfg = JudgeServeConfig(backend=SCRIPTED, cache=str(tmp_path / "calls.sqlite"), batch_wait_timeout_s=0.0,
                           token_sha256=token_sha256("s3cret"))
    server = JudgeServer(cfg.model_dump())
    body = json.dumps({"requests": [chat("fine"), chat("broken amp")]}).encode()

    async def calls():
        answers = [await server(http_request("POST", "", body, token="s3cret")),  # 200, fresh
                   await server(http_request("POST", "", body, token="s3cret")),  # 200, "fine" from the cache
                   await server(http_request("POST", "", b"{oops", token="s3cret")),  # 400
                   await server(http_request("POST", "", body)),  # 401: no token
                   await server(http_request("GET", "/healthz")),  # not counted
                   await server(http_request("GET", "/v1/models", token="s3cret")),
                   await server(http_request("DELETE", "/nowhere", token="s3cret"))]  # 404 under "other"
        await server.generate([chat("fine")])
        with pytest.raises(RequestError):
            await server.generate([chat("x")] * (cfg.limits.max_requests + 1))
        return [a.status_code for a in answers]

    assert asyncio.run(calls()) == [200, 200, 400, 401, 200, 200, 404]
    by_code = {(r, c): caught.total("rexeval_serve_requests", app="team-judge", route=r, code=c)
               for r, c in [("judge", "200"), ("judge", "400"), ("judge", "401"), ("models", "200"),
                            ("other", "404"), ("handle.generate", "200"), ("handle.generate", "413")]}
    assert by_code[("judge", "200")] == 2 and all(v == 1 for k, v in by_code.items() if k != ("judge", "200"))
    assert caught.total("rexeval_serve_requests", route="healthz") == 0
    assert caught.total("rexeval_serve_requests") == 8

    judge = {"app": "team-judge", "model": "scripted-judge"}
    # 5 answers: fine, broken, fine (cached), broken (errors are not cached), fine (cached)
    assert caught.total("rexeval_serve_llm_calls", outcome="ok", **judge) == 3
    assert caught.total("rexeval_serve_llm_calls", outcome="error", **judge) == 2
    assert caught.total("rexeval_serve_llm_cache_hits", **judge) == 2
    assert caught.total("rexeval_serve_llm_tokens", kind="prompt", **judge) == 100  # the one fresh answer
    assert caught.total("rexeval_serve_llm_tokens", kind="completion", **judge) == 2
    assert caught.total("rexeval_serve_batch_size", app="team-judge") == 2 + 2 + 1  # items per generate()
    depth = caught.gauge("rexeval_serve_queue_depth", app="team-judge", replica="r1")
    assert max(depth) == 2 and depth[-1] == 0


def test_the_queue_depth_counts_work_waiting_in_the_nli_replica(caught, replica):
    from rexeval.serve.nli import NLIServeConfig, NLIServer

    replica("rexeval-nli")
    cfg = NLIServeConfig(model=".", scorer="tests.doubles.nli:ScriptedNLI", scorer_options={"delay_s": 0.05},
                         max_batch_pairs=2, batch_wait_timeout_s=0.05)
    server = NLIServer(cfg.model_dump())
    pairs = [["the case fits well", "the case fits"]] * 3

    async def burst():
        posts = [server(http_request("POST", "", json.dumps({"pairs": pairs}).encode(), root="/nli"))
                 for _ in range(3)]
        answers = await asyncio.gather(*posts, server.score([tuple(p) for p in pairs]))
        return [a.status_code for a in answers[:3]]

    assert asyncio.run(burst()) == [200, 200, 200]
    depth = caught.gauge("rexeval_serve_queue_depth", app="rexeval-nli")
    assert max(depth) == 12 and depth[-1] == 0  # 4 callers x 3 pairs waited at once
    assert caught.total("rexeval_serve_requests", app="rexeval-nli", route="score", code="200") == 3
    assert caught.total("rexeval_serve_requests", app="rexeval-nli", route="handle.score", code="200") == 1
    assert caught.total("rexeval_serve_batch_size", app="rexeval-nli") == 12  # every pair, in batches of <= 2


def test_llm_results_count_cached_answers_without_their_tokens(caught):
    m = ReplicaMetrics("judge")
    m.llm_results("m", [LLMResult(text="a", prompt_tokens=5, completion_tokens=1),
                        LLMResult(text="a", prompt_tokens=5, completion_tokens=1, cached=True),
                        LLMResult(error="boom")])
    assert caught.total("rexeval_serve_llm_calls", outcome="ok") == 2
    assert caught.total("rexeval_serve_llm_calls", outcome="error") == 1
    assert caught.total("rexeval_serve_llm_tokens", kind="prompt") == 5
