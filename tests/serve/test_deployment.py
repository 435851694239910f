"""The opening every request to a rexeval Serve app meets (serve/deployment.py), as a pure
function, without Ray: the health probe answered without a token, 401 with a Bearer
challenge, 404 for a path not served and 405 for a method not taken, JSON bodies in the app's shape; both apps'
own routes tables; `answer_http` handing served routes to the app and counting under
route tags; the start building the app only once the proxy is up. One test with Ray: a
port another process holds is named in the error, and Serve is left as it was found."""
from __future__ import annotations

import asyncio
import json

import pytest

from rexeval.serve import deployment
from rexeval.serve.common import RequestError, token_sha256
from rexeval.serve.deployment import HttpRoutes, answer_http, config_from_args, opening

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ROUTES = HttpRoutes({("", "POST"): "work", ("", "GET"): "info", ("/healthz", "GET"): None},
                    not_found="no {method} {path!r} here", not_allowed="{method}: use GET or POST")


def body(response) -> dict:
    return json.loads(response.body)


def test_health_is_answered_without_a_token():
    r = opening(ROUTES, "/healthz", "GET", "/app/healthz", {}, token_sha256(TOKEN))
    assert r.status_code == 200 and body(r) == {"status": "ok"}
    assert "www-authenticate" not in r.headers


def test_everything_else_needs_the_token():
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {TOKEN}"}):
        for path, method in [("", "GET"), ("", "POST"), ("/nowhere", "GET"), ("/healthz", "POST")]:
            r = opening(ROUTES, path, method, "/app" + path, headers, token_sha256(TOKEN))
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "bearer" in body(r)["error"].lower()


def test_served_routes_go_to_the_app():
    for token, headers in [(token_sha256(TOKEN), AUTH), (None, {})]:
        assert opening(ROUTES, "", "GET", "/app", headers, token) is None
        assert opening(ROUTES, "", "POST", "/app", headers, token) is None


def test_unknown_path_is_404_wrong_method_is_405():
    r = opening(ROUTES, "/nowhere", "DELETE", "/app/nowhere", AUTH, token_sha256(TOKEN))
    assert r.status_code == 404 and body(r) == {"error": "no DELETE '/app/nowhere' here"}
    assert "www-authenticate" not in r.headers
    r = opening(ROUTES, "/healthz", "POST", "/app/healthz", {}, None)  # the probe is GET only
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    r = opening(ROUTES, "", "PUT", "/app", AUTH, token_sha256(TOKEN))
    assert r.status_code == 405 and body(r) == {"error": "PUT: use GET or POST"}
    assert r.headers["allow"] == "GET, POST"


def test_an_app_gives_its_refusals_its_own_shape():
    shaped = HttpRoutes(ROUTES.tags, ROUTES.not_found, ROUTES.not_allowed,
                        error_body=lambda path, exc: {"detail": str(exc), "at": path} if path else None)
    r = opening(shaped, "/v9", "GET", "/app/v9", {}, token_sha256(TOKEN))
    assert r.status_code == 401 and body(r)["at"] == "/v9" and r.headers["www-authenticate"] == "Bearer"
    r = opening(shaped, "", "PUT", "/app", {}, None)
    assert body(r) == {"error": "PUT: use GET or POST"}  # None: the plain shape
    r = shaped.refusal("/v9", RequestError(413, "too big"))
    assert r.status_code == 413 and body(r) == {"detail": "too big", "at": "/v9"}


def test_the_judge_answers_refusals_on_its_openai_routes_in_openai_shape():
    from rexeval.serve.judge import HTTP

    r = opening(HTTP, "/v1/chat/completions", "POST", "/judge/v1/chat/completions", {}, token_sha256(TOKEN))
    assert r.status_code == 401 and set(body(r)["error"]) == {"message", "type", "code", "param"}
    r = opening(HTTP, "/v1/models", "GET", "/judge/v1/models", {"authorization": "Bearer nope"}, token_sha256(TOKEN))
    assert r.status_code == 401 and body(r)["error"]["code"] == "invalid_api_key"
    r = opening(HTTP, "/v1/chat/completions", "GET", "/judge/v1/chat/completions", {}, None)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert body(r)["error"]["message"].startswith("no GET '/judge/v1/chat/completions'")
    assert body(r)["error"]["type"] == "invalid_request_error"
    r = opening(HTTP, "/v1/completions", "POST", "/judge/v1/completions", {}, None)  # unknown below /v1
    assert r.status_code == 404 and set(body(r)["error"]) == {"message", "type", "code", "param"}
    r = opening(HTTP, "/v1/models/org/judge-x", "DELETE", "/judge/v1/models/org/judge-x", {}, None)
    assert r.status_code == 405 and body(r)["error"]["type"] == "invalid_request_error"
    r = opening(HTTP, "/nowhere", "GET", "/judge/nowhere", {}, None)
    assert r.status_code == 404 and body(r)["error"].startswith("no GET '/judge/nowhere': POST or GET the route")
    r = opening(HTTP, "", "PUT", "/judge", {}, None)
    assert r.status_code == 405 and body(r)["error"].startswith("no PUT '/judge': ")
    for path, method in [("", "GET"), ("", "POST"), ("/v1/chat/completions", "POST"), ("/v1/models", "GET"),
                         ("/v1/models/judge-x", "GET"), ("/v1/models/org/judge-x", "GET")]:
        assert opening(HTTP, path, method, "/judge" + path, {}, None) is None


def test_the_nli_app_refusals():
    from rexeval.serve.nli import HTTP

    r = opening(HTTP, "/nowhere", "GET", "/nli/nowhere", {}, None)
    assert r.status_code == 404
    assert body(r) == {"error": "no such endpoint '/nli/nowhere': POST or GET the route, GET <route>/healthz"}
    r = opening(HTTP, "", "DELETE", "/nli", {}, None)
    assert r.status_code == 405 and body(r) == {"error": "use POST (score) or GET (info)"}


class _Metrics:
    def __init__(self):
        self.counted = []

    async def http(self, route, respond):
        response = await respond
        self.counted.append((route, response.status_code))
        return response


def _request(method: str, path: str, root: str = "/app", headers: dict | None = None):
    from starlette.requests import Request

    scope = {"type": "http", "method": method, "path": root + path, "root_path": root, "query_string": b"",
             "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
             "scheme": "http", "server": ("127.0.0.1", 8000)}
    return Request(scope)


def test_answer_http_hands_served_routes_to_the_app_and_counts_by_tag():
    from starlette.responses import JSONResponse

    seen = []

    async def respond(request, path, method):
        seen.append((path, method))
        return JSONResponse({"ok": True})

    metrics = _Metrics()

    async def calls():
        sha = token_sha256(TOKEN)
        return [(await answer_http(_request(m, p, headers=h), ROUTES, metrics, sha, respond)).status_code
                for m, p, h in [("GET", "/healthz", {}), ("GET", "", {}), ("POST", "/", AUTH),
                                ("GET", "/x", AUTH), ("PUT", "", AUTH)]]

    assert asyncio.run(calls()) == [200, 401, 200, 404, 405]
    assert seen == [("", "POST")]  # a trailing slash is the route itself
    assert metrics.counted == [(None, 200), ("info", 401), ("work", 200), ("other", 404), ("other", 405)]


def test_config_from_args_turns_the_token_into_its_hash(monkeypatch):
    from rexeval.serve.nli import NLIAppArgs, NLIServeConfig

    monkeypatch.setenv("REXEVAL_SERVE_TOKEN", TOKEN)
    cfg = config_from_args({"model": "m", "max_replicas": 2}, NLIAppArgs, NLIServeConfig)
    assert isinstance(cfg, NLIServeConfig) and cfg.max_replicas == 2 and cfg.token_sha256 == token_sha256(TOKEN)
    assert config_from_args({"model": "m", "auth": "none"}, NLIAppArgs, NLIServeConfig).token_sha256 is None
    monkeypatch.delenv("REXEVAL_SERVE_TOKEN")
    with pytest.raises(ValueError, match="REXEVAL_SERVE_TOKEN"):
        config_from_args({"model": "m"}, NLIAppArgs, NLIServeConfig)


def test_start_app_builds_the_app_once_the_proxy_is_up(monkeypatch):
    steps = []
    monkeypatch.setattr(deployment, "serve_running", lambda: False)
    monkeypatch.setattr(deployment.serve, "start", lambda http_options: steps.append(("start", http_options)))
    monkeypatch.setattr(deployment, "run_app", lambda app, name, route: steps.append(("run", app, name, route))
                        or "handle")
    handle = deployment.start_app(lambda: steps.append(("build",)) or "app", "my-app", "/mine", "0.0.0.0", 9)
    assert handle == "handle"
    assert steps == [("start", {"host": "0.0.0.0", "port": 9}), ("build",), ("run", "app", "my-app", "/mine")]


def test_a_port_another_process_holds_is_named_and_serve_is_left_as_found(ray_session):
    """Serve's proxy fails on a taken port with a remote traceback (seen in CI, when an
    outgoing connection held a test worker's port); the user gets the port and the way to
    pick another, and no controller stays behind holding that port for later starts."""
    import socket

    from ray import serve

    from rexeval.failures import ServeStartFailed

    serve.shutdown()  # a Serve already up keeps its own proxy: this start must make one
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ServeStartFailed, match=rf"127\.0\.0\.1:{port}: another process holds.*--serve-port"):
            deployment.start_app(lambda: pytest.fail("built after a failed start"), "taken", "/taken", port=port)
    assert not deployment.serve_running()
