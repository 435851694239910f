"""Standing endpoints as a platform team runs them: both applications built by their
`serve run`/`serve deploy` builders from deploy/serve/{nli,judge}.yaml's args (model swapped
for test doubles), one Serve on 127.0.0.1, a bearer token asked of every route but
/healthz; rexeval's own clients and the official OpenAI SDK call them; the judge speaks
OpenAI's chat-completions shape. Pure checks of authentication and the OpenAI mapping
need no Serve."""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMResult, SamplingParams, build_backend
from rexeval.serve.common import (AppAuth, RequestError, bind_token_sha256, check_bearer, token_sha256)
from rexeval.serve.judge import JudgeLimits
from rexeval.serve.openai_compat import OpenAIError, chat_completion, parse_chat_completion, retrieve_model
from tests.doubles.nli import scripted_probs
from tests.doubles.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-for-tests"
RULES = [["capital", "Paris."], ["verdict", '{"verdict": "yes"}']]


# -- authentication (pure) ---------------------------------------------------------------


def test_bearer_token_checked_by_hash():
    want = token_sha256(TOKEN)
    check_bearer({"authorization": f"Bearer {TOKEN}"}, want)
    check_bearer({"authorization": f"bearer  {TOKEN} "}, want)  # scheme is case-insensitive
    check_bearer({}, None)  # no token asked
    for headers in ({}, {"authorization": TOKEN}, {"authorization": "Bearer nope"},
                    {"authorization": f"Basic {TOKEN}"}, {"authorization": "Bearer "}):
        with pytest.raises(RequestError) as err:
            check_bearer(headers, want)
        assert err.value.status == 401


def test_public_bind_refused_without_token(monkeypatch):
    monkeypatch.delenv("REXEVAL_SERVE_TOKEN", raising=False)
    assert bind_token_sha256("127.0.0.1") is None
    assert bind_token_sha256("localhost") is None
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ValueError, match="REXEVAL_SERVE_TOKEN"):
            bind_token_sha256(host)
    monkeypatch.setenv("REXEVAL_SERVE_TOKEN", TOKEN)
    assert bind_token_sha256("0.0.0.0") == token_sha256(TOKEN)
    assert bind_token_sha256("127.0.0.1") == token_sha256(TOKEN)  # a token set is always asked


class _Args(AppAuth):
    token_sha256: str | None = None


def test_builder_args_token_from_env_and_never_in_config(monkeypatch):
    monkeypatch.delenv("REXEVAL_SERVE_TOKEN", raising=False)
    with pytest.raises(ValueError, match="REXEVAL_SERVE_TOKEN is not set"):
        _Args().deployment_settings()  # auth defaults to token
    assert _Args(auth="none").deployment_settings() == {"token_sha256": None}
    monkeypatch.setenv("REXEVAL_SERVE_TOKEN", TOKEN)
    settings = _Args().deployment_settings()
    assert settings == {"token_sha256": token_sha256(TOKEN)}
    assert TOKEN not in json.dumps(settings)
    monkeypatch.setenv("MY_TOKEN", "other")
    assert _Args(token_env="MY_TOKEN").deployment_settings()["token_sha256"] == token_sha256("other")


# -- the OpenAI shape (pure) -------------------------------------------------------------


def _body(**kw) -> bytes:
    return json.dumps({"model": "judge-x", "messages": [{"role": "user", "content": "hi"}], **kw}).encode()


def test_chat_completion_request_becomes_our_chat_request():
    req = parse_chat_completion(_body(
        messages=[{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        max_completion_tokens=7, temperature=0.5, top_p=0.9, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
        "judge-x", 10_000)
    assert req.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"}]
    assert req.sampling == SamplingParams(temperature=0.5, top_p=0.9, max_tokens=7, seed=3)
    assert req.json_schema == {"type": "object"}
    assert parse_chat_completion(_body(model="auto", max_tokens=9), "judge-x", 10_000).sampling.max_tokens == 9
    assert parse_chat_completion(_body(response_format={"type": "json_object"}), "judge-x",
                                 10_000).json_schema == {"type": "object"}


LIMITS = JudgeLimits(max_messages=3, max_chars=50, max_tokens=100)


@pytest.mark.parametrize("body,status,code,param", [
    (b"{nope", 400, None, None),
    (b"[1, 2]", 400, "invalid_type", None),
    (_body(model="gpt-4o"), 404, "model_not_found", None),
    (_body(stream=True), 400, "unsupported_parameter", "stream"),
    (_body(n=2), 400, "unsupported_parameter", "n"),
    (_body(tools=[{"type": "function"}]), 400, "unsupported_parameter", "tools"),
    (_body(stop=["\n"]), 400, "unsupported_parameter", "stop"),
    (_body(messages=[]), 400, "invalid_value", "messages"),
    (json.dumps({"model": "judge-x"}).encode(), 400, "missing_required_parameter", "messages"),
    (_body(messages=[{"role": "robot", "content": "hi"}]), 400, "invalid_value", "messages[0].role"),
    (_body(temperature=3), 400, "invalid_value", "temperature"),
    (_body(max_tokens="many"), 400, "invalid_type", "max_tokens"),
    (_body(max_tokens=0), 400, "invalid_value", "max_tokens"),
    (_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), 400,
     "unsupported_content", "messages[0].content"),
    (_body(response_format={"type": "grammar"}), 400, "invalid_value", "response_format.type"),
    # over the endpoint's limits: 400 naming the field, as OpenAI answers, not 413
    (_body(max_tokens=101), 400, "invalid_value", "max_tokens"),
    (_body(max_completion_tokens=101), 400, "invalid_value", "max_completion_tokens"),
    (_body(messages=[{"role": "user", "content": "a"}] * 4), 400, "array_above_max_length", "messages"),
    (_body(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "x" * 51}]), 400,
     "string_above_max_length", "messages[1].content"),
    (b" " * 1001, 413, None, None),  # only a body over the size limit is 413
])
def test_chat_completion_refusals_in_openai_error_shape(body, status, code, param):
    with pytest.raises(OpenAIError) as err:
        parse_chat_completion(body, "judge-x", 1000 if status == 413 else 10_000, LIMITS)
    assert err.value.status == status
    error = err.value.body()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert error["message"]


def test_chat_completion_default_max_tokens_within_the_limit():
    assert parse_chat_completion(_body(), "judge-x", 10_000, LIMITS).sampling.max_tokens == 100
    assert parse_chat_completion(_body(), "judge-x", 10_000).sampling.max_tokens == 512
    assert parse_chat_completion(_body(max_tokens=100), "judge-x", 10_000, LIMITS).sampling.max_tokens == 100


def test_model_retrieve_and_its_404():
    assert retrieve_model("/v1/models/org/judge-x", "org/judge-x") == {
        "id": "org/judge-x", "object": "model", "created": 0, "owned_by": "rexeval"}
    assert retrieve_model("/v1/models/auto", "judge-x")["id"] == "judge-x"
    with pytest.raises(OpenAIError) as err:
        retrieve_model("/v1/models/gpt-4o", "judge-x")
    assert err.value.status == 404 and err.value.body()["error"] == {
        "message": err.value.body()["error"]["message"], "type": "invalid_request_error", "param": None,
        "code": "model_not_found"}
    assert "gpt-4o" in str(err.value)


def test_chat_completion_response_shape():
    out = chat_completion(LLMResult(text="Yes.", prompt_tokens=5, completion_tokens=2, finish_reason="length"), "m")
    assert out["object"] == "chat.completion" and out["model"] == "m"
    assert out["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Yes."},
                               "finish_reason": "length", "logprobs": None}]
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    with pytest.raises(OpenAIError) as err:
        chat_completion(LLMResult(error="boom"), "m")
    assert err.value.status == 500 and err.value.body()["error"]["type"] == "server_error"
    with pytest.raises(OpenAIError) as err:  # the backend's call failed: a client may retry
        chat_completion(LLMResult(error="connection reset", transient=True), "m")
    assert err.value.status == 503 and err.value.body()["error"]["type"] == "server_error"


# -- both endpoints on one Serve, built from the config file's args ---------------------


def _config_args(name: str) -> dict:
    file = {"rexeval-nli": "nli.yaml", "rexeval-judge": "judge.yaml"}[name]
    cfg = yaml.safe_load((REPO / "deploy" / "serve" / file).read_text())
    [app] = [a for a in cfg["applications"] if a["name"] == name]
    return dict(app["args"]), app["route_prefix"], app["import_path"]


@pytest.fixture(scope="module")
def endpoints(ray_session):
    """rexeval-nli (the scripted NLI) and rexeval-judge (a scripted LLM) on 127.0.0.1,
    both built by their import paths' builders with auth: token."""
    from ray import serve

    from rexeval.registry import load_object

    serve.shutdown()
    os.environ["REXEVAL_SERVE_TOKEN"] = TOKEN
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    apps = {}
    for name, override in [
        ("rexeval-nli", {"scorer": "tests.doubles.nli:ScriptedNLI", "model": str(REPO)}),
        ("rexeval-judge", {"backend": {"backend": "tests.doubles.llm:ScriptedLLM", "model": "judge-x",
                                       "options": {"rules": RULES, "default": "No idea."}}}),
    ]:
        args, route, import_path = _config_args(name)
        args.update(override, auth="token")
        serve.run(load_object(import_path)(args), name=name, route_prefix=route)
        apps[name] = f"http://127.0.0.1:{port}{route}"
    try:
        yield apps
    finally:
        serve.shutdown()
        os.environ.pop("REXEVAL_SERVE_TOKEN", None)


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.slow
def test_health_without_token_everything_else_with_it(endpoints):
    for url in endpoints.values():
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        r = httpx.get(url)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        info = httpx.get(url, headers=AUTH).json()
        assert info["auth"] is True
        assert httpx.get(f"{url}/nowhere", headers=AUTH).status_code == 404
    r = httpx.post(endpoints["rexeval-nli"], json={"pairs": [["a b", "a"]]})
    assert r.status_code == 401


def test_nli_endpoint_api_and_client(endpoints, monkeypatch):
    from rexeval.serve.nli import HttpNLIClient

    url = endpoints["rexeval-nli"]
    pairs = [["The strings stay in tune.", "stay in tune"], ["It is not loud.", "It is loud."], ["x", "y"]]
    r = httpx.post(url, json={"pairs": pairs}, headers=AUTH)
    assert r.status_code == 200
    body = r.json()
    assert body["labels"] == ["entailment", "neutral", "contradiction"]
    np.testing.assert_allclose(body["probs"], [scripted_probs(p, h) for p, h in pairs], rtol=1e-6)
    assert httpx.post(url, content=b"{oops", headers=AUTH).status_code == 400
    assert httpx.post(url, json={"pairs": [["only one"]]}, headers=AUTH).status_code == 422
    # The client batch jobs use (--nli-service URL) sends the token from the environment.
    monkeypatch.setenv("REXEVAL_SERVE_TOKEN", TOKEN)
    got = HttpNLIClient(url, chunk=2).score([p for p, _ in pairs], [h for _, h in pairs])
    np.testing.assert_allclose(got, [scripted_probs(p, h) for p, h in pairs], rtol=1e-6)
    monkeypatch.setenv("REXEVAL_SERVE_TOKEN", "wrong")
    with pytest.raises(RuntimeError, match="401"):
        HttpNLIClient(url).score(["a"], ["b"])


def test_judge_client_and_openai_shape_agree(endpoints, monkeypatch):
    url = endpoints["rexeval-judge"]
    monkeypatch.setenv("REXEVAL_SERVE_TOKEN", TOKEN)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    # rexeval's own judge client (what --judge-service URL uses).
    client = build_backend(BackendSpec(backend="serve", model="judge-x", options={"address": url}))
    try:
        [ours] = client.generate([ChatRequest(messages=question)])
    finally:
        client.close()
    assert ours.text == "Paris."
    # rexeval's openai backend pointed at the endpoint's /v1.
    oa = build_backend(BackendSpec(backend="openai", model="judge-x",
                                   options={"base_url": f"{url}/v1", "api_key_env": "REXEVAL_SERVE_TOKEN"}))
    try:
        [via_openai] = oa.generate([ChatRequest(messages=question, sampling=SamplingParams(max_tokens=16))])
    finally:
        oa.close()
    assert via_openai.text == "Paris." and via_openai.finish_reason == "stop"
    # OpenAI-shaped errors and the models list.
    r = httpx.post(f"{url}/v1/chat/completions", headers=AUTH,
                   json={"model": "judge-x", "messages": question, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "judge-x", "messages": question})
    assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
    models = httpx.get(f"{url}/v1/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == ["judge-x"]


def test_official_openai_sdk_calls_the_judge(endpoints):
    openai = pytest.importorskip("openai")
    url = endpoints["rexeval-judge"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
    out = client.chat.completions.create(
        model="judge-x", messages=[{"role": "user", "content": "Give your verdict."}], max_tokens=20,
        temperature=0)
    assert out.choices[0].message.content == '{"verdict": "yes"}'
    assert out.model == "judge-x" and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert [m.id for m in client.models.list()] == ["judge-x"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.chat.completions.create(model="judge-x", messages=[{"role": "user", "content": "x"}])
    assert err.value.code == "invalid_api_key" and err.value.type == "invalid_request_error"


def test_official_openai_sdk_sees_openai_errors_and_models_retrieve(endpoints):
    """What `except openai.BadRequestError` / `NotFoundError` code written against OpenAI
    meets here: the same exceptions, with `param`, `code` and `type` filled as OpenAI does."""
    openai = pytest.importorskip("openai")
    url = endpoints["rexeval-judge"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
    ask = [{"role": "user", "content": "Give your verdict."}]
    # over the endpoint's max_tokens (8192): 400 naming the field, not a bare 413
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="judge-x", messages=ask, max_tokens=9000)
    assert err.value.param == "max_tokens" and err.value.code == "invalid_value"
    assert err.value.type == "invalid_request_error" and "9000" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="judge-x", messages=ask, max_completion_tokens=9000)
    assert err.value.param == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="judge-x", messages=ask, temperature=2.5)
    assert err.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="judge-x", messages=ask, n=2)
    assert (err.value.param, err.value.code) == ("n", "unsupported_parameter")
    # an unknown model, on a chat call and on retrieve: NotFoundError, model_not_found
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=ask)
    assert err.value.code == "model_not_found" and err.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.code == "model_not_found" and err.value.param is None
    model = client.models.retrieve("judge-x")
    assert (model.id, model.object, model.owned_by) == ("judge-x", "model", "rexeval")
    # a route OpenAI has and we do not, and a method a route does not take: OpenAI's shape
    r = httpx.post(f"{url}/v1/completions", headers=AUTH, json={"model": "judge-x", "prompt": "x"})
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(f"{url}/v1/chat/completions", headers=AUTH)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, content=b" " * 8_000_001)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
def test_serve_run_judge_config_with_smollm2(tmp_path):
    """Ray's own `serve run` on deploy/serve/judge.yaml (port moved to a free one): the
    installed import path builds SmolLM2's judge, which answers the official SDK."""
    import signal
    import subprocess
    import sys
    import time

    openai = pytest.importorskip("openai")
    cfg = yaml.safe_load((REPO / "deploy" / "serve" / "judge.yaml").read_text())
    port = free_port()
    cfg["http_options"]["port"] = port
    (tmp_path / "judge.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    serve_bin = str(Path(sys.executable).parent / "serve")
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([serve_bin, "run", str(tmp_path / "judge.yaml")], cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/judge"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=2)
        out = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Say hello."}],
                                             max_tokens=8, temperature=0)
        assert out.model == "SmolLM2-135M-Instruct"
        assert out.choices[0].message.content.strip()
        assert out.usage.completion_tokens <= 8 and out.choices[0].finish_reason in ("stop", "length")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
