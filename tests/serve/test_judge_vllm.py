"""The judge on vLLM the Ray way, checked without vLLM: the LLMConfig `serve judge
--backend vllm` would give Ray's OpenAI app, the shipped Serve config that carries the
same, rexeval's judge replica refusing vLLM with a message that says what to use, and a
judge job on vLLM running its own engine pool instead of a judge app."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rexeval.models.llm.base import BackendSpec
from rexeval.serve.judge_vllm import VLLM_IN_REPLICA, llm_config_args, vllm_judge_app

REPO = Path(__file__).resolve().parents[2]
VLLM_YAML = REPO / "deploy" / "serve" / "gpu" / "judge-vllm.yaml"


def test_the_llm_config_names_the_model_its_engine_and_its_replicas(tmp_path):
    spec = BackendSpec(backend="vllm", model=str(tmp_path), options={
        "model_id": "judge-8b", "tensor_parallel_size": 2, "engine_kwargs": {"max_model_len": 8192},
        "accelerator_type": "H100"})
    args = llm_config_args(spec, min_replicas=1, max_replicas=3, max_ongoing_requests=64)
    assert args["model_loading_config"] == {"model_id": "judge-8b", "model_source": str(tmp_path)}
    # Our engine defaults, the user's engine_kwargs over them, tensor parallelism from its option.
    assert args["engine_kwargs"] == {"max_model_len": 8192, "enable_prefix_caching": True,
                                     "enable_chunked_prefill": True, "tensor_parallel_size": 2}
    assert args["deployment_config"] == {"autoscaling_config": {"min_replicas": 1, "max_replicas": 3},
                                         "max_ongoing_requests": 64}
    assert args["accelerator_type"] == "H100"
    # Without a model_id the OpenAI routes name the model as referenced.
    assert llm_config_args(BackendSpec(backend="vllm", model=str(tmp_path)))[
        "model_loading_config"]["model_id"] == str(tmp_path)


def test_settings_that_mean_nothing_there_are_refused(tmp_path):
    with pytest.raises(ValueError, match="device"):
        llm_config_args(BackendSpec(backend="vllm", model=str(tmp_path), options={"device": "cuda"}))
    with pytest.raises(ValueError, match="backend vllm"):
        llm_config_args(BackendSpec(backend="hf", model=str(tmp_path)))


def test_without_vllm_the_app_says_what_to_install(tmp_path):
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    from rexeval.models.refs import PackageNotInstalled

    with pytest.raises(PackageNotInstalled, match=r"rexeval\[gpu\]"):
        vllm_judge_app(llm_config_args(BackendSpec(backend="vllm", model=str(tmp_path))))


def test_the_judge_replica_refuses_vllm_before_anything_is_deployed():
    from rexeval.serve.judge import JudgeServeConfig, judge_app

    cfg = JudgeServeConfig(backend=BackendSpec(backend="vllm", model="/models/x"))
    with pytest.raises(ValueError) as err:
        judge_app(cfg)
    assert str(err.value) == VLLM_IN_REPLICA
    assert "serve judge --backend vllm" in VLLM_IN_REPLICA and "--backend openai" in VLLM_IN_REPLICA


def test_the_shipped_vllm_serve_config_is_rays_llm_app_with_our_engine_settings():
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load(VLLM_YAML.read_text())
    ServeDeploySchema.model_validate(config)
    (app,) = config["applications"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    (llm_config,) = app["args"]["llm_configs"]
    source = llm_config["model_loading_config"]["model_source"]
    expected = llm_config_args(BackendSpec(backend="vllm", model=source, options={"model_id": "Qwen3-8B"}),
                               min_replicas=1, max_replicas=4)
    assert llm_config == expected
    # Beside cluster.yaml's applications, on a route of its own.
    cluster = yaml.safe_load((REPO / "deploy" / "serve" / "cluster.yaml").read_text())
    assert app["route_prefix"] not in {a["route_prefix"] for a in cluster["applications"]}
    assert app["name"] not in {a["name"] for a in cluster["applications"]}


def test_a_judge_job_on_vllm_runs_its_own_engines_not_a_judge_app(tmp_path):
    from rexeval.pipelines.core.llm.chunks import JudgeService, chunk_plan
    from rexeval.pipelines.judge.config import PairwiseJobConfig

    cfg = PairwiseJobConfig(explanations=[str(tmp_path / "e.parquet")], baseline="b", out=str(tmp_path / "o"),
                            backend="vllm", backend_options={"concurrency": [1, 2]})
    spec = {"backend": "vllm", "model": str(tmp_path), "options": {"concurrency": [1, 2]}, "cache": None}
    lines: list[str] = []
    service = JudgeService(cfg, spec, lines.append)
    assert service.app() is None and service.address() == "none"  # nothing started
    assert any("its own vLLM engines" in line for line in lines)
    plan = chunk_plan(spec, "none", cfg)
    assert (plan.kind, plan.concurrency) == ("vllm", (1, 2))
