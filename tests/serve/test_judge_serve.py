"""The LLM judge deployment on 127.0.0.1: answers through the handle, over HTTP and
through the `serve` backend equal the in-process backend's; concurrent calls share
generate() calls; bad requests get 4xx; overload gets 503s the client retries;
JudgeService leaves Serve as it found it; an OpenAI-compatible upstream is forwarded.

Serve apps are slow to start on 2 cores: one module-scoped app serves most tests; the
last test shuts Serve down on purpose (it checks a job that starts Serve itself)."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from rexeval.models.llm.base import BackendSpec, ChatRequest, SamplingParams, build_backend
from rexeval.serve.judge import APP_NAME, JudgeLimits, JudgeServeConfig, parse_judge_body, start_judge_service
from rexeval.serve.judge_client import JudgeService, ServeJudgeLLM
from rexeval.serve.common import RequestError, running_apps, serve_running
from tests.doubles.llm import ScriptedLLM
from tests.doubles.ports import free_port

RULES = [["strings", '{"verdict": "yes"}'], ["broken", "!error"], ["case", '{"verdict": "no"}']]
SCRIPTED = BackendSpec(backend="tests.doubles.llm:ScriptedLLM", model="scripted-judge",
                       options={"rules": RULES, "default": '{"verdict": "unsure"}', "delay_s": 0.05})



def chat(text: str, temperature: float = 0.0, max_tokens: int = 64) -> ChatRequest:
    return ChatRequest(messages=[{"role": "system", "content": "You judge explanations."},
                                 {"role": "user", "content": text}],
                       sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens))


def essentials(results) -> list[tuple]:
    """What must agree between transports (timing and cache flags may differ)."""
    return [(r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason, r.error is None)
            for r in results]


# -- request validation and the client's retries (no Serve) ----------------------------


def test_parse_judge_body_limits_and_shapes():
    lim = JudgeLimits(max_body_bytes=400, max_requests=2, max_chars=10, max_messages=2, max_tokens=600)
    ok = json.dumps({"requests": [{"messages": [{"role": "user", "content": "hi"}]}]}).encode()
    assert parse_judge_body(ok, lim)[0].messages[-1]["content"] == "hi"
    msg = [{"role": "user", "content": "a"}]
    cases = [(b"{not json", 400), (b'[1, 2]', 422), (b'{"requests": "x"}', 422),
             (b'{"requests": [{"messages": "x"}]}', 422),
             (b'{"requests": [{"messages": [], "temperature": 1}]}', 422),
             (json.dumps({"requests": [{"messages": msg}] * 3}).encode(), 413),
             (json.dumps({"requests": [{"messages": [{"role": "user", "content": "x" * 11}]}]}).encode(), 413),
             (json.dumps({"requests": [{"messages": msg * 3}]}).encode(), 413),
             (json.dumps({"requests": [{"messages": msg, "sampling": {"max_tokens": 601}}]}).encode(), 413),
             (b" " * 401, 413)]
    for body, status in cases:
        with pytest.raises(RequestError) as err:
            parse_judge_body(body, lim)
        assert err.value.status == status, body


class FakeJudge:
    """A fake judge HTTP service for httpx.MockTransport: answers 503 `busy` times, then
    echoes; records the POST bodies."""

    def __init__(self, busy: int = 0, status: int = 200, limits: JudgeLimits | None = None):
        self.busy, self.status, self.posts = busy, status, []
        self.limits = limits or JudgeLimits()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"model_id": "fake-judge", "limits": self.limits.model_dump()})
        if self.busy > 0:
            self.busy -= 1
            return httpx.Response(503, text="busy")
        if self.status != 200:
            return httpx.Response(self.status, json={"error": "nope"})
        reqs = json.loads(request.content)["requests"]
        self.posts.append(reqs)
        return httpx.Response(200, json={"results": [
            {"text": "echo " + r["messages"][-1]["content"], "prompt_tokens": 7, "completion_tokens": 2,
             "seconds": 0.5} for r in reqs]})


def fake_client(fake: FakeJudge, model: str = "fake-judge", **options) -> ServeJudgeLLM:
    spec = BackendSpec(backend="serve", model=model,
                       options={"address": "http://judge.test/judge", "backoff_s": 0.001, **options})
    return ServeJudgeLLM(spec, transport=httpx.MockTransport(fake))


def test_http_client_retries_503_and_keeps_order():
    fake = FakeJudge(busy=3)
    llm = fake_client(fake, chunk=2, concurrency=1, max_retries=4)
    out = llm.generate([chat(f"q{i}") for i in range(5)])
    assert [r.text for r in out] == [f"echo q{i}" for i in range(5)]
    assert [len(p) for p in fake.posts] == [2, 2, 1]
    assert out[0].prompt_tokens == 7 and out[0].seconds == 0.5
    assert llm.model_id == "fake-judge"
    llm.close()


def test_http_client_gives_error_results_not_exceptions():
    gave_up = fake_client(FakeJudge(busy=100), max_retries=2).generate([chat("a"), chat("b")])
    assert all(r.error and "overloaded" in r.error for r in gave_up)
    failed = fake_client(FakeJudge(status=500)).generate([chat("a")])
    assert "500" in failed[0].error
    # a request over the service's limits is refused locally; the others go out
    fake = FakeJudge(limits=JudgeLimits(max_chars=30))
    out = fake_client(fake).generate([chat("fine"), chat("x" * 31), chat("also fine")])
    assert out[0].text == "echo fine" and out[2].text == "echo also fine"
    assert "limits" in out[1].error and len(fake.posts[0]) == 2


def test_client_refuses_a_service_that_serves_another_model():
    with pytest.raises(ValueError, match="serves 'fake-judge'"):
        fake_client(FakeJudge(), model="other-model")
    assert fake_client(FakeJudge(), model="auto").model_id == "fake-judge"
    with pytest.raises(ValueError, match="address"):
        ServeJudgeLLM(BackendSpec(backend="serve", model="m", options={"address": "judge:8000"}))


# -- the deployment ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def judge(ray_session, tmp_path_factory):
    """One judge app (scripted backend, call cache) for the module's tests."""
    from ray import serve

    serve.shutdown()  # a Serve left running keeps its old HTTP port; start from a clean state
    port = free_port()
    cfg = JudgeServeConfig(backend=SCRIPTED, cache=str(tmp_path_factory.mktemp("judge") / "calls.sqlite"),
                           max_batch_requests=8, batch_wait_timeout_s=0.2, num_cpus=0.5,
                           limits=JudgeLimits(max_requests=32, max_chars=2000))
    handle = start_judge_service(cfg, port=port)
    yield handle, f"http://127.0.0.1:{port}/judge", cfg
    serve.shutdown()


@pytest.mark.slow
def test_handle_http_and_client_answers_equal_in_process(judge):
    handle, url, _ = judge
    reqs = [chat("the strings are bright"), chat("a broken amp"), chat("the case fits"),
            chat("anything else"), chat("the strings are bright")]
    local = ScriptedLLM(SCRIPTED).generate(reqs)
    assert local[1].error  # the scripted "!error" rule

    from rexeval.models.llm.base import LLMResult

    via_handle = [LLMResult(**r) for r in handle.generate.remote([r.model_dump() for r in reqs]).result()]
    assert essentials(via_handle) == essentials(local)
    fresh = [r for r in via_handle if r.ok and not r.cached]
    assert fresh and all(r.seconds > 0 for r in fresh)  # timed on the replica

    http = httpx.post(url, json={"requests": [r.model_dump() for r in reqs]}, timeout=60)
    assert http.status_code == 200 and http.json()["model_id"] == "scripted-judge"
    via_http = [LLMResult(**r) for r in http.json()["results"]]
    assert essentials(via_http) == essentials(local)
    # greedy answers were cached by the first call: no model time, flagged as cached
    assert all(r.cached and r.seconds == 0 for r in via_http if r.ok)

    for address in (f"serve:{APP_NAME}", url):
        llm = build_backend(BackendSpec(backend="serve", model="scripted-judge",
                                        options={"address": address, "chunk": 2}))
        assert isinstance(llm, ServeJudgeLLM) and llm.model_id == "scripted-judge"
        assert essentials(llm.generate(reqs)) == essentials(local)
        llm.close()

    info = httpx.get(url, timeout=30).json()
    assert info["model_id"] == "scripted-judge" and info["limits"]["max_requests"] == 32
    # a request the handle cannot validate fails alone
    mixed = handle.generate.remote([{"messages": "nope"}, reqs[0].model_dump()]).result()
    assert "invalid chat request" in mixed[0]["error"] and mixed[1]["text"] == '{"verdict": "yes"}'


@pytest.mark.slow
def test_concurrent_calls_share_generate_calls(judge):
    handle, _, cfg = judge
    before = handle.info.remote().result()
    reqs = [chat(f"sampled {i}", temperature=0.7) for i in range(6)]  # sampled: never cached
    calls = [handle.generate.remote([r.model_dump()]) for r in reqs]
    answers = [c.result()[0] for c in calls]
    after = handle.info.remote().result()
    assert all(a["text"] == '{"verdict": "unsure"}' for a in answers)
    assert after["requests_served"] - before["requests_served"] == 6
    assert after["generate_calls"] - before["generate_calls"] < 6
    assert after["largest_batch"] >= 2

    # a call larger than one batch (8) is split in the replica, order kept
    big = [chat(f"big {i} case" if i % 3 == 0 else f"big {i}", temperature=0.5) for i in range(20)]
    llm = ServeJudgeLLM(BackendSpec(backend="serve", model="auto",
                                    options={"address": f"serve:{APP_NAME}", "chunk": 20}))
    got = llm.generate(big)
    assert [r.text for r in got] == [r.text for r in ScriptedLLM(SCRIPTED).generate(big)]
    assert all(r.prompt_tokens == 100 and r.completion_tokens >= 1 for r in got)
    llm.close()
    assert handle.info.remote().result()["largest_batch"] <= cfg.max_batch_requests


@pytest.mark.slow
def test_replicas_share_a_call_cache_at_a_uri(judge, s3_root, tmp_path):
    """A judge app's cache may be a URI (one object per call in the bucket): a new app,
    whose replicas may run on another node, answers what an earlier one cached without
    asking its model."""
    from ray import serve

    from rexeval.models.llm.base import LLMResult

    log = tmp_path / "model-calls.jsonl"
    spec = SCRIPTED.model_copy(update={"options": {**SCRIPTED.options, "log": str(log)}})
    reqs = [chat("the strings are bright"), chat("the case fits"), chat("anything else")]
    answers = []
    for name in ("rexeval-judge-uri-a", "rexeval-judge-uri-b"):
        handle = start_judge_service(JudgeServeConfig(backend=spec, cache=f"{s3_root}/judge-cache", num_cpus=0.25,
                                                      batch_wait_timeout_s=0.0), name=name)
        try:
            answers.append([LLMResult(**r) for r in handle.generate.remote([r.model_dump() for r in reqs]).result()])
        finally:
            serve.delete(name)
    assert len(log.read_text().splitlines()) == 3, "the second app asked its model again"
    assert essentials(answers[1]) == essentials(answers[0]) and all(r.cached for r in answers[1])


@pytest.mark.slow
def test_http_bad_requests_get_4xx(judge):
    _, url, _ = judge
    bad = httpx.post(url, content=b"{oops", timeout=30)
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]
    shape = httpx.post(url, json={"requests": [{"messages": "x"}]}, timeout=30)
    assert shape.status_code == 422
    many = httpx.post(url, json={"requests": [chat("a").model_dump()] * 33}, timeout=30)
    assert many.status_code == 413
    long = httpx.post(url, json={"requests": [chat("x" * 2001).model_dump()]}, timeout=30)
    assert long.status_code == 413 and "2000" in long.json()["error"]
    assert httpx.put(url, json={}, timeout=30).status_code == 405


@pytest.mark.slow
def test_judge_service_reuses_a_running_app_and_leaves_it(judge):
    _, _, cfg = judge
    lines = []
    with JudgeService(cfg, progress=lines.append) as svc:
        assert svc.address() == f"serve:{APP_NAME}" and svc.started is None
        assert svc.check() == "scripted-judge" and svc.cache_path() is None
        llm = build_backend(svc.backend_spec())
        assert llm.generate([chat("the case fits")])[0].text == '{"verdict": "no"}'
        llm.close()
    assert APP_NAME in running_apps() and "using the running" in lines[0]
    other = cfg.model_copy(update={"backend": SCRIPTED.model_copy(update={"model": "another-judge"})})
    with pytest.raises(ValueError, match="serves 'scripted-judge'"):
        JudgeService(other).check()
    with pytest.raises(ValueError, match="no Serve application named 'missing'"):
        JudgeService(cfg, service="serve:missing").check()
    none = JudgeService(cfg, service="none")
    assert none.backend_spec() == cfg.backend and none.cache_path() == cfg.cache


class FakeOpenAI:
    """A tiny OpenAI-compatible /v1/chat/completions server in a thread."""

    def __init__(self):
        self.bodies: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                fake.bodies.append(body)
                text = "upstream: " + body["messages"][-1]["content"]
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text},
                                                "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 11, "completion_tokens": len(text.split())}})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.slow
def test_openai_upstream_is_forwarded_and_the_started_app_removed(judge):
    fake = FakeOpenAI()
    try:
        spec = BackendSpec(backend="openai", model="upstream-judge",
                           options={"base_url": fake.base_url, "max_retries": 0, "concurrency": 4})
        cfg = JudgeServeConfig(backend=spec, num_cpus=0.25, batch_wait_timeout_s=0.05)
        name = "rexeval-judge-upstream"
        reqs = [chat("is it loud?"), chat("does it fit?"), chat("is it cheap?")]
        direct = build_backend(spec)
        local = direct.generate(reqs)
        direct.close()
        with JudgeService(cfg, app_name=name, progress=lambda _: None) as svc:
            assert svc.started == name and not svc.started_serve
            llm = build_backend(svc.backend_spec())
            got = llm.generate(reqs)
            assert llm.model_id == "upstream-judge"
            llm.close()
        assert essentials(got) == essentials(local)
        assert got[0].text == "upstream: is it loud?" and got[0].prompt_tokens == 11
        assert all(r.seconds > 0 for r in got)
        assert {b["model"] for b in fake.bodies} == {"upstream-judge"} and len(fake.bodies) == 6
        assert name not in running_apps() and APP_NAME in running_apps() and serve_running()
    finally:
        fake.close()


@pytest.mark.slow
def test_service_that_started_serve_shuts_it_down_and_client_rides_out_503(ray_session):
    """Runs last on purpose: it shuts Serve down (the module's app with it)."""
    from ray import serve

    serve.shutdown()
    port = free_port()
    slow = SCRIPTED.model_copy(update={"options": {**SCRIPTED.options, "delay_s": 0.4}})
    cfg = JudgeServeConfig(backend=slow, max_batch_requests=1, max_ongoing_requests=1,
                           max_queued_requests=1, num_cpus=0.5)
    with JudgeService(cfg, port=port, progress=lambda _: None) as svc:
        assert svc.started_serve and svc.address() == f"serve:{APP_NAME}"
        url = f"http://127.0.0.1:{port}/judge"
        body = {"requests": [chat("sampled", temperature=1.0).model_dump()]}

        async def burst(n):
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(*[client.post(url, json=body) for _ in range(n)])

        codes = [r.status_code for r in asyncio.run(burst(8))]
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
        llm = ServeJudgeLLM(BackendSpec(backend="serve", model="scripted-judge",
                                        options={"address": url, "chunk": 1, "concurrency": 6,
                                                 "backoff_s": 0.1, "max_retries": 10}))
        out = llm.generate([chat(f"the strings {i}", temperature=1.0) for i in range(6)])
        llm.close()
        assert [r.text for r in out] == ['{"verdict": "yes"}'] * 6
    assert not serve_running()
