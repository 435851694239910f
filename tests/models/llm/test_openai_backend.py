"""OpenAIBackend against a scripted fake OpenAI server on 127.0.0.1 (no network)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rexeval.models.llm import BackendSpec, ChatRequest, SamplingParams, build_backend
from rexeval.models.llm.openai_backend import OpenAIBackend, _retry_after


class FakeServer:
    """Answers /v1/chat/completions according to the first user message (the 'script').

    Scripts: "ok ...", "429once", "500twice", "400", "nochoices", "sleep", "slow".
    Records attempts per script, the bodies and headers, and the peak number of
    requests in flight at once.
    """

    def __init__(self, sleep_s: float = 1.0, slow_s: float = 0.15):
        self.attempts: dict[str, int] = {}
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = self.peak = 0
        self.lock = threading.Lock()
        self.sleep_s, self.slow_s = sleep_s, slow_s
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                with fake.lock:
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                    fake.bodies.append(body)
                    fake.headers.append(dict(self.headers))
                try:
                    reply = fake.answer(self, body)
                finally:
                    # The request leaves the count before its answer is written: once the
                    # client has read an answer it may send its next request, and counting
                    # this one until after the write would see one more in flight than the
                    # client ever had.
                    with fake.lock:
                        fake.in_flight -= 1
                fake.send(self, *reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, h: BaseHTTPRequestHandler, body: dict) -> tuple:
        """The reply to one request, as `send`'s (status, payload[, headers])."""
        script = body["messages"][-1]["content"]
        key = script.split()[0]
        with self.lock:
            n = self.attempts[key] = self.attempts.get(key, 0) + 1
        if h.path != "/v1/chat/completions":
            return 404, {"error": "not found"}
        if key == "429once" and n == 1:
            return 429, {"error": "rate limited"}, {"Retry-After": "0"}
        if key == "500twice" and n <= 2:
            return 500, {"error": "internal"}
        if key == "400":
            return 400, {"error": {"message": "bad request: unknown field"}}
        if key == "nochoices":
            return 200, {"id": "x", "object": "chat.completion"}
        if key == "sleep":
            time.sleep(self.sleep_s)
        if key == "slow":
            time.sleep(self.slow_s)
        return 200, {
            "id": "cmpl-1", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"echo: {script}"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}

    @staticmethod
    def send(h, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        try:
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def make(server, **opts) -> OpenAIBackend:
    options = {"base_url": server.base_url, "backoff_s": 0.01, "timeout_s": 5, **opts}
    return build_backend(BackendSpec(backend="openai", model="judge-model", options=options))


def req(text: str, schema=None, **sampling) -> ChatRequest:
    return ChatRequest(messages=[{"role": "system", "content": "You judge."},
                                 {"role": "user", "content": text}],
                       sampling=SamplingParams(**sampling), json_schema=schema)


def test_normal_answer_and_body(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    b = make(server)
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}}
    res = b.generate([req("ok hello", schema=schema, temperature=0.5, top_p=0.9,
                          max_tokens=33, seed=7)])[0]
    b.close()
    assert res.ok and res.text == "echo: ok hello"
    assert (res.prompt_tokens, res.completion_tokens, res.finish_reason) == (7, 3, "stop")
    assert res.seconds > 0
    body = server.bodies[0]
    assert body["model"] == "judge-model"
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.5, 0.9, 33, 7)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": schema, "strict": True}}
    assert "authorization" not in {k.lower() for k in server.headers[0]}


def test_no_schema_no_response_format_and_extra_body(server):
    b = make(server, extra_body={"top_k": 5, "chat_template_kwargs": {"x": 1}})
    assert b.generate([req("ok plain")])[0].ok
    b.close()
    assert "response_format" not in server.bodies[0]
    assert server.bodies[0]["top_k"] == 5 and server.bodies[0]["chat_template_kwargs"] == {"x": 1}


def test_api_key_header(server, monkeypatch):
    b = make(server, api_key="sk-test-123")
    assert b.generate([req("ok key")])[0].ok
    b.close()
    assert server.headers[0]["Authorization"] == "Bearer sk-test-123"
    monkeypatch.setenv("MY_KEY_VAR", "sk-env")
    b = make(server, api_key_env="MY_KEY_VAR")
    assert b.generate([req("ok env")])[0].ok
    b.close()
    assert server.headers[1]["Authorization"] == "Bearer sk-env"


def test_retries_and_non_retries(server):
    b = make(server, max_retries=4)
    results = b.generate([req("429once"), req("500twice"), req("400"), req("nochoices")])
    b.close()
    r429, r500, r400, rbad = results
    assert r429.ok and server.attempts["429once"] == 2
    assert r500.ok and server.attempts["500twice"] == 3
    assert not r400.ok and server.attempts["400"] == 1
    assert "HTTP 400" in r400.error and "unknown field" in r400.error
    assert not rbad.ok and "malformed response" in rbad.error
    assert server.attempts["nochoices"] == 1


def test_gives_up_after_max_retries(server):
    b = make(server, max_retries=1)
    res = b.generate([req("500twice")])[0]
    b.close()
    assert not res.ok and "HTTP 500" in res.error and server.attempts["500twice"] == 2


def test_timeout_is_retried_then_error(server):
    server.sleep_s = 1.0
    b = make(server, timeout_s=0.2, max_retries=1)
    t0 = time.perf_counter()
    res = b.generate([req("sleep"), req("ok fine")])
    b.close()
    assert not res[0].ok and "timeout" in res[0].error
    assert res[1].ok
    assert server.attempts["sleep"] == 2
    assert time.perf_counter() - t0 < 3


def test_connection_refused_is_an_error_result():
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = build_backend(BackendSpec(backend="openai", model="m", options={
        "base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 1, "backoff_s": 0.01}))
    res = b.generate([req("ok x")])[0]
    b.close()
    assert not res.ok and "connection error" in res.error


def test_concurrency_cap(server):
    b = make(server, concurrency=3)
    results = b.generate([req(f"slow {i}") for i in range(10)])
    b.close()
    assert all(r.ok for r in results)
    assert [r.text for r in results] == [f"echo: slow {i}" for i in range(10)]
    assert 1 < server.peak <= 3


def test_base_url_required():
    with pytest.raises(ValueError, match="base_url"):
        build_backend(BackendSpec(backend="openai", model="m"))


def test_retry_after_parsing():
    assert _retry_after("0") == 0.0 and _retry_after("2.5") == 2.5
    assert _retry_after(None) is None and _retry_after("soon") is None
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
