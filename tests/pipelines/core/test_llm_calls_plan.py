"""The streaming path's processors: the same extraction through a running judge app by
`ray.data.llm`'s ServeDeploymentProcessor and HttpRequestProcessor as through in-process
actors; faults in the app (a fifth of its calls failing, its replica killed mid-job) heal; the vLLM processor is
checked by the plan it builds (no GPU here)."""
from __future__ import annotations

import pytest

from rexeval.failures import AwaitingRerun
from rexeval.models.llm.base import BackendSpec
from rexeval.pipelines.core.llm_calls_plan import CallPlan, chat_url, processor_for
from rexeval.pipelines.extract.pipeline import run_extract
from tests.pipelines.extract.test_pipeline import TRIPLETS, config, write_reviews
from tests.serve.test_judge_serve import free_port

QUIET = {"progress": lambda s: None}
APP = "rexeval-judge-stream-test"
# Review 7's call kills the replica while the flag exists; otherwise it is answered "[]".
KILLER = {"rules": [["Review number 7:", "!exit"]]}


@pytest.fixture(scope="module")
def flaky_judge(ray_session, tmp_path_factory):
    """A judge app whose scripted model fails a fifth of its calls once (transient), and
    whose replica dies on review 7's call once while the flag file `KILL` exists."""
    from ray import serve

    from rexeval.serve.judge import JudgeServeConfig, start_judge_service

    serve.shutdown()
    port = free_port()
    flag = tmp_path_factory.mktemp("kill") / "kill"
    spec = BackendSpec(backend="tests.doubles.llm:ScriptedLLM", model="scripted-judge",
                       options={"default": TRIPLETS, "flaky": 0.2, "exit_flag": str(flag), "exit_once": True,
                                **KILLER})
    cfg = JudgeServeConfig(backend=spec, cache=None, max_batch_requests=8, batch_wait_timeout_s=0.05,
                           num_cpus=0.25)
    start_judge_service(cfg, port=port, name=APP)
    yield f"http://127.0.0.1:{port}/{APP}", flag
    serve.shutdown()


def rows(root) -> tuple:
    """The statements and error rows (provenance names the backend, which differs)."""
    import pyarrow.parquet as pq

    st = pq.read_table(root / "statements").drop_columns(["provenance"]).to_pylist()
    return st, pq.read_table(root / "errors").to_pylist()


def _through(tmp_path, name: str, address: str):
    from rexeval.pipelines.extract.config import ExtractConfig

    return ExtractConfig(input=str(tmp_path / "reviews.parquet"), out=str(tmp_path / name), backend="serve",
                         backend_options={"address": address, "backoff_s": 0.5}, models={"embedder": "none"},
                         cache=str(tmp_path / f"{name}.sqlite"), shard_size=4)


def test_serve_and_http_processors_give_the_local_tables_through_faults(tmp_path, flaky_judge):
    url, kill = flaky_judge
    write_reviews(tmp_path / "reviews.parquet", 12)
    run_extract(config(tmp_path, "local", "l.sqlite", "l.log", options=KILLER), **QUIET)
    lines: list[str] = []
    kill.write_text("once")  # the replica dies mid-job, once; Serve starts another
    try:
        via_handle = run_extract(_through(tmp_path, "handle", f"serve:{APP}"), progress=lines.append)
    except AwaitingRerun:  # the replica came back only after the pass's retries: a plain re-run
        via_handle = run_extract(_through(tmp_path, "handle", f"serve:{APP}"), progress=lines.append)
    assert not kill.exists(), "the replica was never killed"
    via_http = run_extract(_through(tmp_path, "http", url), **QUIET)
    assert "calls: serve" in lines[0]
    assert rows(tmp_path / "local") == rows(tmp_path / "handle") == rows(tmp_path / "http")
    for m in (via_handle, via_http):
        assert m["status"] == "complete" and m["counts"]["in"] == 12
    # The fifth of the calls that failed were asked again in a later pass.
    assert any("failed in transport" in line for line in lines)


def test_plans_pick_the_processor_by_backend(ray_session):
    from ray.data.llm import HttpRequestProcessorConfig, ServeDeploymentProcessorConfig

    serve_plan = CallPlan(backend="serve", model="m", address="serve:app", concurrency=(1, 3))
    http_plan = CallPlan(backend="openai", model="gpt-x", options={"base_url": "http://h:1/v1/"})
    judge_url = CallPlan(backend="serve", model="m", address="http://h:2/judge")
    assert (serve_plan.kind, http_plan.kind, judge_url.kind) == ("serve", "http", "http")
    assert chat_url(http_plan) == ("http://h:1/v1/chat/completions", "gpt-x")
    assert chat_url(judge_url) == ("http://h:2/judge/v1/chat/completions", "auto")
    cfg = processor_for(serve_plan).config
    assert isinstance(cfg, ServeDeploymentProcessorConfig) and cfg.app_name == "app"
    assert cfg.should_continue_on_error
    assert isinstance(processor_for(http_plan).config, HttpRequestProcessorConfig)
    # Clients of a model elsewhere hold no CPU: a crashed judge replica can restart.
    for plan in (serve_plan, http_plan):
        processor = processor_for(plan)
        assert [st.map_batches_kwargs["num_cpus"] for st in processor.stages.values()] == [0]
        assert processor.preprocess_map_kwargs["num_cpus"] == processor.postprocess_map_kwargs["num_cpus"] == 0


def test_the_vllm_plan_is_one_engine_pool_per_pass(ray_session, monkeypatch):
    from ray.data.llm import vLLMEngineProcessorConfig

    import rexeval.models.refs as refs

    class Ref:
        location = "/models/qwen"

    monkeypatch.setattr(refs, "resolve", lambda model, **kw: Ref())
    plan = CallPlan(backend="vllm", model="qwen", options={"accelerator_type": "H100"}, concurrency=(1, 4),
                    batch_size=64)
    assert plan.kind == "vllm"
    cfg = processor_for(plan).config
    assert isinstance(cfg, vLLMEngineProcessorConfig)
    assert cfg.model_source == "/models/qwen" and cfg.batch_size == 64 and cfg.accelerator_type == "H100"
    assert tuple(cfg.concurrency) == (1, 4) and cfg.should_continue_on_error
