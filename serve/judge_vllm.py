"""The judge on vLLM the Ray way: `ray.serve.llm`'s OpenAI app, not vLLM in our replica.

rexeval's own judge deployment (`serve/judge.py`) holds its model in the replica (hf, or
a client of an OpenAI-compatible upstream). vLLM cannot live there: our `vllm` backend
starts its engines as Ray Data actors of their own, which would ask for a second GPU
while the replica holds the first. So `rexeval serve judge --backend vllm` builds Ray's
LLM serving app instead (`LLMConfig` + `build_openai_app`: vLLM engines as Serve
replicas, autoscaled, OpenAI routes), under the same route (`/judge`). Jobs reach it, and
any OpenAI-compatible server, through the OpenAI shape: `--backend openai --backend-option
base_url=http://HOST:PORT/judge/v1 --judge-service none`, over HTTP from the job's
stream (`pipelines/core/llm/engines.py`). A job with `--backend vllm` deploys this same
app for itself, once per job (`llm.engines.vllm_app_args`).

`llm_config_args` is pure (what the app would run, checked on machines without vLLM);
`vllm_judge_app` imports `ray.serve.llm`, which needs vLLM installed (the `[gpu]` extra).
The same dict is what `deploy/serve/cluster.yaml` gives `ray.serve.llm:build_openai_app`.
"""
from __future__ import annotations

from typing import Any

from rexeval.models.llm.base import BackendSpec

# Options of our vllm backend that map onto Ray's LLMConfig; any other is refused, so a
# setting is never silently dropped.
ENGINE_OPTIONS = ("engine_kwargs", "tensor_parallel_size", "accelerator_type", "model_id")


def llm_config_args(spec: BackendSpec, *, min_replicas: int = 1, max_replicas: int = 1,
                    max_ongoing_requests: int | None = None, initial_replicas: int | None = None) -> dict[str, Any]:
    """The `LLMConfig` (as a dict) serving `spec` (backend vllm): the model's resolved
    folder as `model_source` (a model URI as itself: Ray's replicas download it where
    they run), its id (`model_id` option, else the reference) for the
    OpenAI routes, our engine defaults under the spec's `engine_kwargs`. `initial_replicas`
    (None: min_replicas) is what the app starts with: a job's own app has min_replicas 0
    (it gives its GPUs back when idle) and starts with one or more."""
    from rexeval.models.llm.vllm_backend import DEFAULT_ENGINE_KWARGS
    from rexeval.models.refs import NoModelAtPath, shipped_location

    if spec.backend != "vllm":
        raise ValueError(f"a vLLM judge app serves backend vllm, not {spec.backend!r}")
    opts = dict(spec.options)
    unknown = sorted(set(opts) - set(ENGINE_OPTIONS) - {"batch_size", "concurrency", "max_concurrent_batches"})
    if unknown:
        raise ValueError(f"backend option(s) {', '.join(unknown)} have no meaning for a vLLM judge app "
                         f"(known: {', '.join(ENGINE_OPTIONS)})")
    engine = {**DEFAULT_ENGINE_KWARGS, **(opts.get("engine_kwargs") or {})}
    if opts.get("tensor_parallel_size"):
        engine["tensor_parallel_size"] = int(opts["tensor_parallel_size"])
    scaling = {"min_replicas": int(min_replicas), "max_replicas": int(max(min_replicas, max_replicas))}
    if initial_replicas is not None:
        scaling["initial_replicas"] = min(max(int(initial_replicas), scaling["min_replicas"]), scaling["max_replicas"])
    deployment: dict[str, Any] = {"autoscaling_config": scaling}
    if max_ongoing_requests:
        deployment["max_ongoing_requests"] = int(max_ongoing_requests)
    try:
        source = shipped_location(spec.model)  # a URI stays one: each replica copies it on its node
    except NoModelAtPath:  # a folder the GPU nodes mount, which this node (a head) may not
        source = spec.model
    args: dict[str, Any] = {
        "model_loading_config": {"model_id": str(opts.get("model_id") or spec.model),
                                 "model_source": source},
        "engine_kwargs": engine,
        "deployment_config": deployment,
    }
    if opts.get("accelerator_type"):
        args["accelerator_type"] = str(opts["accelerator_type"])
    return args


def vllm_judge_app(llm_config: dict[str, Any]):
    """Ray's OpenAI app for one LLMConfig dict (needs vLLM: the `[gpu]` extra)."""
    try:
        from ray.serve.llm import LLMConfig, build_openai_app
    except ImportError as exc:
        from rexeval.models.refs import PackageNotInstalled

        raise PackageNotInstalled("a vLLM judge app needs vLLM on this machine (pip install 'rexeval[gpu]'); "
                           "on a CPU machine serve the hf backend, or point jobs at an OpenAI-compatible "
                           f"server with --backend openai ({exc})") from None
    return build_openai_app({"llm_configs": [LLMConfig(**llm_config)]})


def start_vllm_judge(app, host: str = "127.0.0.1", port: int | None = None,
                     route: str = "/judge", name: str = "rexeval-judge"):
    """Serve's HTTP proxy and Ray's OpenAI app (`vllm_judge_app`) under `route`."""
    from rexeval.serve.deployment import start_app

    return start_app(lambda: app, name, route, host, port)


VLLM_IN_REPLICA = (
    "the vllm backend cannot run inside rexeval's judge replica: it starts its engines as "
    "Ray Data actors of their own, which would want a second GPU while the replica holds "
    "the first. Serve a vLLM judge with `rexeval serve judge --backend vllm` (Ray's "
    "ray.serve.llm OpenAI app; in a Serve config, import_path ray.serve.llm:build_openai_app "
    "as in deploy/serve/cluster.yaml) and point jobs at it with --backend openai "
    "--backend-option base_url=http://HOST:PORT/judge/v1 --judge-service none; batch jobs "
    "can also run vLLM themselves with --backend vllm --judge-service none")
