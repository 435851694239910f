"""The one-stream LLM path (`pipelines/core/llm/stream.py`, `llm/engines.py`): every turn,
repair and transport retry of a job goes to one engine group per model, started once; the
same extraction through a running judge app, by handle and by URL, as through in-process
actors; with a Serve timeout, a fifth of the calls failing as 503s do and the replica
killed, the job exits 75 and a plain re-run finishes to a fault-free run's tables. The
vLLM engines are checked by the app they would deploy (no GPU here)."""
from __future__ import annotations

import json

import pytest

from rexeval.failures import AwaitingRerun
from rexeval.pipelines.core.llm.calls_plan import CallPlan
from rexeval.pipelines.core.llm.engines import EngineGroup
from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.pipelines.extract.pipeline import run_extract
from tests.pipelines.extract.test_pipeline import BACKEND, TRIPLETS, config, write_reviews
from tests.doubles.ports import free_port

QUIET = {"progress": lambda s: None}
APP = "rexeval-judge-stream-test"
# Review 7's call kills the replica while the flag exists; otherwise it is answered "[]".
KILLER = {"rules": [["Review number 7:", "!exit"]]}
CANDS = json.dumps({"statements": [{"statement": "the zipper sticks", "sentiment": "negative"}]})
VERIFIED = json.dumps({"statements": [{"statement": "the zipper of the product sticks", "sentiment": "negative"}]})


@pytest.mark.slow
def test_one_engine_start_per_model_across_repairs_and_retries(tmp_path, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 12)  # 3 shards of 4; every 5th review is empty
    starts = tmp_path / "starts"
    # STAR: candidates, then verification (a second role of the same model). Review 3's
    # first answer is unreadable (a repair turn); a third of the calls fail in transport once.
    options = {"rules": [["could not be used", CANDS], ["Review number 3:", "not json at all"],
                         ['"statements"', VERIFIED]],
               "default": CANDS, "flaky": 0.3, "starts": str(starts), "backoff_s": 0.05}
    cfg = ExtractConfig(input=str(tmp_path / "reviews.parquet"), out=str(tmp_path / "out"), method="star",
                        backend=BACKEND, backend_options=options, models={"embedder": "none"},
                        use_cache=False, shard_size=4)
    lines: list[str] = []
    m = run_extract(cfg, progress=lines.append)
    assert m["status"] == "complete" and m["counts"]["in"] == 12
    assert len(starts.read_text().splitlines()) == 1, "the model loaded more than once in one job"
    [engines] = m["llm_engines"].values()
    asked = 12 - 3  # reviews with text
    assert engines["engine_starts"] == 1 and sorted(engines["roles"]) == ["llm", "verify"]
    # Two turns per review, plus review 3's repair; the flaky calls were asked again.
    assert engines["turns"] == 2 * asked + 1
    assert engines["retries"] >= 1 and engines["calls"] == engines["turns"] + engines["retries"]
    assert any("started 1x" in line for line in lines)


@pytest.fixture(scope="module")
def flaky_judge(ray_session, tmp_path_factory):
    """A judge app whose scripted model fails a fifth of its calls once (transient, as a
    503 would), whose replica dies on review 7's call once while the flag file `kill`
    exists, and whose call holding review 5 hangs past the client's timeout while the flag
    file `hang` exists."""
    from ray import serve

    from rexeval.models.llm.base import BackendSpec
    from rexeval.serve.judge import JudgeServeConfig, start_judge_service

    serve.shutdown()
    port = free_port()
    flags = tmp_path_factory.mktemp("flags")
    spec = BackendSpec(backend=BACKEND, model="scripted-judge",
                       options={"default": TRIPLETS, "flaky": 0.2, "exit_flag": str(flags / "kill"),
                                "exit_once": True, "hang_while": str(flags / "hang"),
                                "hang_for": "Review number 5:", "hang_s": 4, **KILLER})
    cfg = JudgeServeConfig(backend=spec, cache=None, max_batch_requests=8, batch_wait_timeout_s=0.05,
                           num_cpus=0.25)
    start_judge_service(cfg, port=port, name=APP)
    yield f"http://127.0.0.1:{port}/{APP}", flags
    serve.shutdown()


def rows(root) -> tuple:
    """The statements and error rows (provenance names the backend, which differs)."""
    import pyarrow.parquet as pq

    st = pq.read_table(root / "statements").drop_columns(["provenance"]).to_pylist()
    return st, pq.read_table(root / "errors").to_pylist()


def _through(tmp_path, name: str, address: str, **options):
    return ExtractConfig(input=str(tmp_path / "reviews.parquet"), out=str(tmp_path / name), backend="serve",
                         backend_options={"address": address, "backoff_s": 0.2, **options},
                         models={"embedder": "none"}, cache=str(tmp_path / f"{name}.sqlite"), shard_size=4)


@pytest.mark.slow
def test_serve_timeout_503s_and_a_killed_replica_exit_75_and_a_rerun_finishes(tmp_path, flaky_judge):
    from rexeval.ray_jobs.common import EXIT_CODES

    url, flags = flaky_judge
    write_reviews(tmp_path / "reviews.parquet", 12)
    run_extract(config(tmp_path, "local", "l.sqlite", "l.log", options=KILLER), **QUIET)  # no faults
    (flags / "kill").write_text("once")  # the replica dies mid-job, once; Serve starts another
    (flags / "hang").write_text("on")  # review 5's calls outlast the 1.5 s timeout
    cfg = _through(tmp_path, "handle", f"serve:{APP}", timeout_s=1.5, transport_retries=1)
    lines: list[str] = []
    with pytest.raises(AwaitingRerun) as err:
        run_extract(cfg, progress=lines.append)
    assert err.value.exit_code == EXIT_CODES["work left for a re-run"] == 75
    assert not (flags / "kill").exists(), "the replica was never killed"
    assert "run the same command again" in str(err.value)
    (flags / "hang").unlink()
    m = run_extract(cfg, progress=lines.append)  # the same command
    assert m["status"] == "complete" and m["counts"]["in"] == 12
    assert rows(tmp_path / "local") == rows(tmp_path / "handle")
    # The judge app was standing: the job started no engine, and it retried in transport.
    [engines] = m["llm_engines"].values()
    assert engines["engine_starts"] == 0 and engines["kind"] == "serve"
    assert any("transport retr" in line and "standing service" in line for line in lines)
    # The app by URL (HTTP) gives the same tables.
    via_http = run_extract(_through(tmp_path, "http", url), **QUIET)
    assert via_http["status"] == "complete" and rows(tmp_path / "local") == rows(tmp_path / "http")


def test_a_missing_judge_app_is_a_mistake_not_a_rerun(tmp_path, ray_session):
    from rexeval.failures import WorkerFailed

    write_reviews(tmp_path / "reviews.parquet", 4)
    with pytest.raises((ValueError, WorkerFailed), match="no Serve application named 'nowhere'"):
        run_extract(_through(tmp_path, "out", "serve:nowhere"), **QUIET)


def test_clients_by_kind(ray_session):
    serve_plan = CallPlan(backend="serve", model="m", address="serve:app", concurrency=(1, 3),
                          options={"deployment": "D"}, cache="/c.sqlite")
    http_plan = CallPlan(backend="openai", model="gpt-x", options={"base_url": "http://h:1/v1/"}, cache="/c.sqlite")
    judge_url = CallPlan(backend="serve", model="m", address="http://h:2/judge")
    assert (serve_plan.kind, http_plan.kind, judge_url.kind) == ("serve", "http", "http")
    s = EngineGroup(serve_plan).client_spec()
    # A judge deployment answers with whatever it serves, behind the job's own call cache.
    assert (s["backend"], s["model"], s["cache"], s["inflight"]) == ("serve", "auto", "/c.sqlite", 3)
    assert s["options"]["address"] == "serve:app" and s["options"]["deployment"] == "D"
    h = EngineGroup(http_plan).client_spec()
    assert (h["backend"], h["model"], h["cache"]) == ("openai", "gpt-x", "/c.sqlite")
    assert EngineGroup(judge_url).client_spec()["options"]["address"] == "http://h:2/judge"


def test_the_vllm_engines_are_one_serve_llm_app_for_the_job(monkeypatch):
    import rexeval.models.refs as refs
    from rexeval.pipelines.core.llm.engines import vllm_app_args

    class Ref:
        location = "/models/qwen"

    monkeypatch.setattr(refs, "resolve", lambda model, **kw: Ref())
    plan = CallPlan(backend="vllm", model="qwen", concurrency=(1, 4), batch_size=64,
                    options={"accelerator_type": "H100", "tensor_parallel_size": 2, "backoff_s": 2,
                             "transport_retries": 5, "shards_in_flight": 4})
    assert plan.kind == "vllm"
    # serve judge --backend vllm's LLMConfig; the stream's own options are not engine settings.
    cfg = vllm_app_args(plan)
    assert cfg["model_loading_config"] == {"model_id": "qwen", "model_source": "/models/qwen"}
    # The job's own engines start with its min replicas and fall to zero while it leaves them idle.
    assert cfg["deployment_config"]["autoscaling_config"] == {"min_replicas": 0, "initial_replicas": 1,
                                                              "max_replicas": 4}
    assert cfg["accelerator_type"] == "H100" and cfg["engine_kwargs"]["tensor_parallel_size"] == 2
    g = EngineGroup(plan, app="rexeval-vllm-x", url="http://127.0.0.1:8000/rexeval-vllm-x/v1", starts=1,
                    served="qwen")
    spec = g.client_spec()
    assert spec["backend"] == "openai" and spec["options"]["base_url"] == g.url
    assert spec["options"]["served_model"] == "qwen" and spec["options"]["backoff_s"] == 2
    # Enough requests in flight for 4 replicas' continuous batching.
    assert spec["inflight"] == 4 * 8 and spec["options"]["concurrency"] == 256


class FlakyOpenAI:
    """An OpenAI-compatible server that answers every chat with `answer`, except: a fifth
    of the requests get a 503 the first time (by a hash of the body), and any request
    holding `down_for` gets a 503 while the file `down_while` exists."""

    def __init__(self, answer: str, down_for: str, down_while):
        import hashlib
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen: set[str] = set()
        lock = threading.Lock()
        self.statuses: list[int] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                share = int(hashlib.sha256(raw).hexdigest()[:8], 16) / 0xFFFFFFFF
                last = body["messages"][-1]["content"]
                with lock:
                    first = raw not in seen
                    seen.add(raw)
                if (share < 0.2 and first) or (down_for in last and down_while.exists()):
                    status, payload = 503, {"error": {"message": "overloaded", "type": "server_error"}}
                else:
                    status, payload = 200, {"choices": [{"index": 0, "finish_reason": "stop",
                                                         "message": {"role": "assistant", "content": answer}}],
                                            "usage": {"prompt_tokens": 9, "completion_tokens": 5}}
                outer.statuses.append(status)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        outer = self
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.slow
def test_503s_over_http_heal_and_an_outage_waits_for_the_same_command(tmp_path, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 12)
    run_extract(config(tmp_path, "local", "l.sqlite", "l.log"), **QUIET)  # no faults
    down = tmp_path / "outage"
    down.write_text("on")
    server = FlakyOpenAI(TRIPLETS, "Review number 6:", down)
    try:
        # The backend's own retries off: every 503 reaches the stream, which asks again.
        cfg = ExtractConfig(input=str(tmp_path / "reviews.parquet"), out=str(tmp_path / "http"), backend="openai",
                            backend_options={"base_url": server.base_url, "max_retries": 0, "backoff_s": 0.05,
                                             "transport_retries": 2},
                            models={"llm": "scripted-model", "embedder": "none"}, cache=str(tmp_path / "h.sqlite"),
                            shard_size=4)
        with pytest.raises(AwaitingRerun) as err:
            run_extract(cfg, **QUIET)
        assert err.value.exit_code == 75 and err.value.awaiting == 1  # review 6, in shard 1
        assert 503 in server.statuses and server.statuses.count(200) >= 8
        down.unlink()
        m = run_extract(cfg, **QUIET)
    finally:
        server.close()
    assert m["status"] == "complete" and m["counts"]["in"] == 12
    assert rows(tmp_path / "local") == rows(tmp_path / "http")
    [engines] = m["llm_engines"].values()
    assert engines["kind"] == "http" and engines["engine_starts"] == 0


def test_the_batcher_merges_requests_sends_earlier_shards_first_and_turns_a_failed_call_transient():
    import asyncio

    from rexeval.models.llm.base import ChatRequest, LLMResult
    from rexeval.pipelines.core.llm.engines import Batcher

    sent: list[list[str]] = []

    async def send(reqs):
        texts = [r.messages[0]["content"] for r in reqs]
        sent.append(texts)
        await asyncio.sleep(0.01)
        if "boom" in texts:
            raise ConnectionError("replica died")
        return [LLMResult(text=t.upper()) for t in texts]

    def ask(b, text, priority):
        return asyncio.ensure_future(b.ask(ChatRequest(messages=[{"role": "user", "content": text}]), priority))

    async def main():
        b = Batcher(send, size=3, inflight=1)
        late = [ask(b, f"late{i}", 5) for i in range(3)]
        early = [ask(b, f"early{i}", 1) for i in range(2)]
        got = await asyncio.gather(*late, *early)
        failed = await asyncio.gather(ask(b, "boom", 0), ask(b, "x", 0))
        return got, failed

    got, failed = asyncio.run(main())
    # One slot: the first call takes three, the earlier shard's two first; then the rest.
    assert sent[:2] == [["early0", "early1", "late0"], ["late1", "late2"]]
    assert [r.text for r in got] == ["LATE0", "LATE1", "LATE2", "EARLY0", "EARLY1"]
    assert all(r.transient and "replica died" in r.error for r in failed)


@pytest.mark.slow
def test_a_serve_routed_rerun_on_a_fresh_replica_makes_no_call(tmp_path, s3_root, ray_session):
    """A judge job whose calls a judge deployment answers keeps the job's call cache (a
    URI) in its workers, in front of the deployment: run again against a new deployment
    whose replicas have an empty cache of their own (another node's disk), it makes no
    call and writes the same verdicts."""
    import pyarrow.parquet as pq
    from ray import serve

    from rexeval.models.llm.base import BackendSpec
    from rexeval.pipelines.judge.config import PairwiseJobConfig
    from rexeval.pipelines.judge.jobs import run_pairwise
    from rexeval.storage import location
    from rexeval.serve.judge import JudgeServeConfig, start_judge_service
    from tests.pipelines.judge.test_jobs_uri import CHUNK, SCRIPTED, _calls, _planted

    inputs = _planted(tmp_path / "inputs")
    log = tmp_path / "model-calls.jsonl"
    model = BackendSpec(backend=SCRIPTED, model="scripted-judge",
                        options={"rules": [["great", "Better.\n[[A]]"]], "default": "Fair.\n[[C]]", "log": str(log)})

    def judged(app: str, replica_cache: str, out: str) -> dict:
        start_judge_service(JudgeServeConfig(backend=model, cache=replica_cache, num_cpus=0.25,
                                             batch_wait_timeout_s=0.0), port=free_port(), name=app)
        try:
            return run_pairwise(PairwiseJobConfig(
                explanations=[inputs["explanations"]], reviews=[inputs["reviews"]], baseline="base", divide=False,
                out=out, judge_service=f"serve:{app}", chunk_size=CHUNK, backend=SCRIPTED,
                models={"judge_llm": "scripted-judge"}, cache=f"{s3_root}/job-cache"), progress=lambda m: None)
        finally:
            serve.delete(app)

    try:
        first = judged("rexeval-judge-node-a", str(tmp_path / "node-a" / "calls.sqlite"), f"{s3_root}/first")
        asked = len(_calls(log))
        again = judged("rexeval-judge-node-b", str(tmp_path / "node-b" / "calls.sqlite"), f"{s3_root}/second")
    finally:
        serve.shutdown()  # later tests start Serve on ports of their own
    assert asked > 0 and first["usage"]["calls"] == asked
    assert len(_calls(log)) == asked, "the re-run asked the model again"
    assert again["usage"]["calls"] == asked and again["usage"]["cached_calls"] == asked

    def verdicts(out: str) -> list:
        with location(f"{out}/verdicts.parquet").open_input() as fh:
            return pq.read_table(fh).to_pylist()

    assert verdicts(f"{s3_root}/first") == verdicts(f"{s3_root}/second")
