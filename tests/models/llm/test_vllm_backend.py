"""The vLLM backend's ray.data.llm plan, inspected on CPU; a real run only on a GPU."""
from __future__ import annotations

import json
import os
import sys

import pytest

from rexeval.models.llm import BackendSpec, ChatRequest, SamplingParams, build_backend
from rexeval.models.llm.vllm_backend import (DEFAULT_ENGINE_KWARGS, ERROR_COLUMN, build_request_processor,
                                     from_vllm_row, processor_config, request_rows, to_vllm_row)

SCHEMA = {"type": "object", "properties": {"score": {"type": "integer"}},
          "required": ["score"], "additionalProperties": False}


@pytest.fixture
def spec(tiny_model_dir):
    return BackendSpec(backend="vllm", model=str(tiny_model_dir), options={
        "engine_kwargs": {"max_model_len": 2048, "gpu_memory_utilization": 0.5},
        "tensor_parallel_size": 1, "batch_size": 16, "concurrency": 2})


def test_processor_config_from_options(spec, tiny_model_dir):
    cfg = processor_config(spec)
    assert cfg.model_source == str(tiny_model_dir)
    assert cfg.engine_kwargs["max_model_len"] == 2048  # option over default
    assert cfg.engine_kwargs["enable_prefix_caching"] is True  # default kept
    assert cfg.engine_kwargs["gpu_memory_utilization"] == 0.5
    assert cfg.batch_size == 16 and cfg.concurrency == 2 and cfg.should_continue_on_error
    cfg = processor_config(spec, batch_size=4, concurrency=[1, 3])
    assert cfg.batch_size == 4 and cfg.concurrency == (1, 3)
    assert "vllm" not in sys.modules


def test_processor_plan_without_vllm(spec, tiny_model_dir, ray_session):
    proc = build_request_processor(spec, json_schema=SCHEMA)
    names = proc.processor.list_stage_names()
    assert "vLLMEngineStage" in names and names[0] == "ChatTemplateStage"
    engine = proc.processor.get_stage_by_name("vLLMEngineStage")
    kw = engine.fn_constructor_kwargs
    assert kw["model"] == str(tiny_model_dir)
    assert kw["batch_size"] == 16 and kw["should_continue_on_error"] is True
    assert kw["engine_kwargs"]["max_model_len"] == 2048
    assert kw["engine_kwargs"]["enable_prefix_caching"] is True
    assert kw["engine_kwargs"].get("tensor_parallel_size") == 1
    mb = engine.map_batches_kwargs
    assert mb["num_gpus"] == 1
    assert (mb["compute"].min_size, mb["compute"].max_size) == (1, 2)
    assert proc.processor.get_stage_by_name("ChatTemplateStage").fn_constructor_kwargs["model"] == str(tiny_model_dir)

    # preprocess: a request row -> messages + sampling params with the structured output.
    row = request_rows([ChatRequest(messages=[{"role": "user", "content": "hi"}],
                                    sampling=SamplingParams(max_tokens=9, seed=4))])[0]
    data = proc.processor.preprocess(row)["__data"]  # Ray's wrapper nests our columns
    sp = data["sampling_params"]
    assert sp["max_tokens"] == 9 and sp["seed"] == 4 and sp["temperature"] == 0.0
    assert json.loads(sp["structured_outputs"]["json"]) == SCHEMA  # the default schema
    own = {"type": "object", "properties": {"x": {"type": "string"}}}
    sp = proc.processor.preprocess({**row, "json_schema": json.dumps(own)})["__data"]["sampling_params"]
    assert json.loads(sp["structured_outputs"]["json"]) == own

    # success rows and engine-failed rows end with the same columns.
    ok = proc.finish(proc.processor.postprocess({"__data": {
        "request_index": 3, "generated_text": "{}", "num_input_tokens": 11, "num_generated_tokens": 9,
        "max_tokens": 9, "prompt": "p"}}))
    assert ok == {"request_index": 3, "text": "{}", "prompt_tokens": 11, "completion_tokens": 9,
                  "finish_reason": "length", "error": None}
    # (Ray gives an engine-failed row to the output as it is, internal columns and all.)
    bad = proc.finish({"request_index": 5, "generated_text": "", ERROR_COLUMN: "ValueError: prompt too long",
                              "prompt": "p", "sampling_params": sp})
    assert bad == {"request_index": 5, "text": None, "prompt_tokens": 0, "completion_tokens": 0,
                   "finish_reason": None, "error": "ValueError: prompt too long"}
    assert "vllm" not in sys.modules


def test_rows_without_schema_and_stop_reason():
    row = request_rows([ChatRequest(messages=[{"role": "user", "content": "hi"}],
                                    sampling=SamplingParams(temperature=0.3, top_p=0.8))])[0]
    assert row["json_schema"] is None and row["request_index"] == 0
    sp = to_vllm_row(row)["sampling_params"]
    assert sp["structured_outputs"] is None and sp["temperature"] == 0.3 and sp["top_p"] == 0.8
    out = from_vllm_row({"generated_text": "ok", "num_generated_tokens": 2, "max_tokens": 512,
                         "num_input_tokens": 5, "request_index": 0})
    assert out["finish_reason"] == "stop" and out["error"] is None


def test_default_engine_kwargs_are_sane():
    assert DEFAULT_ENGINE_KWARGS["max_model_len"] == 4096
    assert DEFAULT_ENGINE_KWARGS["enable_prefix_caching"] is True


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not os.environ.get("REXEVAL_TEST_VLLM_MODEL") or not _cuda(),
                    reason="needs CUDA and REXEVAL_TEST_VLLM_MODEL (a small chat model path)")
def test_vllm_answers_through_the_stream_processor_on_gpu(ray_session):
    pytest.importorskip("vllm")
    import ray

    from rexeval.models.llm import LLMResult
    from rexeval.pipelines.core.llm.calls_plan import CallPlan, call

    plan = CallPlan(backend="vllm", model=os.environ["REXEVAL_TEST_VLLM_MODEL"],
                    options={"engine_kwargs": {"max_model_len": 2048, "gpu_memory_utilization": 0.4}})
    schema = {"type": "object", "additionalProperties": False, "required": ["sentiment"],
              "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative"]}}}
    reqs = [ChatRequest(messages=[{"role": "user", "content": f"Say hello number {i}."}],
                        sampling=SamplingParams(max_tokens=16)) for i in range(3)]
    reqs.append(ChatRequest(messages=[{"role": "user", "content": "Great strings! Sentiment?"}],
                            sampling=SamplingParams(max_tokens=32), json_schema=schema))
    # Through the streaming path's vLLM processor, as every job sends its calls.
    rows = call(ray.data.from_items([{"key": str(i), "request": r.model_dump_json()} for i, r in enumerate(reqs)]),
                plan).take_all()
    results = [LLMResult.model_validate_json(r["result"]) for r in sorted(rows, key=lambda r: int(r["key"]))]
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in results)
    assert json.loads(results[-1].text)["sentiment"] in {"positive", "negative"}


def test_the_vllm_backend_has_no_per_call_path(spec):
    with pytest.raises(ValueError, match="Ray Data stream"):
        build_backend(spec).generate([ChatRequest(messages=[{"role": "user", "content": "hi"}])])


def test_a_model_uri_reaches_the_engines_as_the_uri(tiny_model_dir, s3_root, ray_session, monkeypatch, tmp_path):
    """Weights in a bucket are never copied to the driver: the engine stage gets the URI,
    and Ray's vLLM stage downloads it on the node where each engine starts (building the
    processor, Ray reads the tokenizer's files only, into the Hugging Face cache and a
    lock in the home folder: both kept in this test's folder)."""
    import huggingface_hub.constants

    from rexeval.models import fetch
    from rexeval.storage import location

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    uri = f"{s3_root}/models/tiny-chat"
    location(uri).upload(tiny_model_dir)
    monkeypatch.setattr(fetch, "fetch", lambda *a, **k: pytest.fail("the driver copied the model"))
    spec = BackendSpec(backend="vllm", model=uri, options={"concurrency": [1, 2]})
    assert processor_config(spec).model_source == uri
    proc = build_request_processor(spec)
    for stage in ("ChatTemplateStage", "vLLMEngineStage"):
        assert proc.processor.get_stage_by_name(stage).fn_constructor_kwargs["model"] == uri, stage
    assert "vllm" not in sys.modules
