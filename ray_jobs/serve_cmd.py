"""`rexeval serve nli|judge`: a standing scoring endpoint that other jobs and teams share.

A batch job starts the NLI or judge deployment for itself and stops it when done; this
command keeps one up until it is stopped (Ctrl-C or SIGTERM), so that many jobs
(`--nli-service URL`, `--judge-service URL`) and other services call the same replicas.
With `--detach` on a running cluster (RAY_ADDRESS) it deploys and returns; the
application then runs until `serve delete` / `serve shutdown`.
"""
from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import click

from rexeval.pipelines.core.runtime import init_ray
from rexeval.ray_jobs.common import parse_backend_options, user_errors
from rexeval.serve.common import SERVE_PORT_ENV, TOKEN_ENV, bind_token_sha256, serve_running


def _endpoint_options(default_route: str, default_name: str):
    """Where the endpoint listens, how it scales and how it authenticates."""
    options = [
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="Address the HTTP proxy binds. Anything but 127.0.0.1 needs a bearer token in "
                          f"${TOKEN_ENV} (or --token-env): the command refuses to start without one."),
        click.option("--port", type=int, default=8000, show_default=True, envvar=SERVE_PORT_ENV, show_envvar=True,
                     help="HTTP port of the proxy."),
        click.option("--route", default=default_route, show_default=True, help="Route prefix of the endpoint."),
        click.option("--name", default=default_name, show_default=True, help="Serve application name."),
        click.option("--min-replicas", type=int, default=1, show_default=True, help="Autoscaling floor."),
        click.option("--max-replicas", type=int, default=1, show_default=True, help="Autoscaling ceiling."),
        click.option("--num-cpus", type=float, default=1, show_default=True, help="CPUs per replica."),
        click.option("--num-gpus", type=float, default=0, show_default=True, help="GPUs per replica."),
        click.option("--max-ongoing-requests", type=int, help="Requests in flight per replica (default 64)."),
        click.option("--max-queued-requests", type=int,
                     help="Requests queued beyond that before the endpoint answers 503 (default 256)."),
        click.option("--token-env", default=TOKEN_ENV, show_default=True,
                     help="Environment variable holding the bearer token clients must send. When it is "
                          "set, every route but <route>/healthz asks for 'Authorization: Bearer <token>'."),
        click.option("--detach", is_flag=True,
                     help="Deploy on the running cluster (RAY_ADDRESS) and return instead of serving "
                          "until stopped."),
    ]

    def wrap(fn):
        for o in reversed(options):
            fn = o(fn)
        return fn

    return wrap


def _replica_settings(flags: dict) -> dict:
    out = {k: flags[k] for k in ("min_replicas", "max_replicas", "num_cpus", "num_gpus")}
    out.update({k: flags[k] for k in ("max_ongoing_requests", "max_queued_requests") if flags[k] is not None})
    out["token_sha256"] = flags["token_sha256"] = bind_token_sha256(flags["host"], flags["token_env"])
    return out


def _stop_event() -> threading.Event:
    """Set by Ctrl-C or SIGTERM (a container's stop, `kill`); installed before the
    application starts, so a stop that comes while it starts is not lost."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _serve(kind: str, flags: dict, start: Callable[[], object], info_lines: list[str]) -> None:
    """Start the app, say how to call it, serve until stopped; leave the cluster as found."""
    from ray import serve

    detach = flags["detach"]
    if detach and not os.environ.get("RAY_ADDRESS"):
        raise ValueError("--detach needs a running cluster to leave the endpoint on: set RAY_ADDRESS "
                         "(e.g. ray start --head, then RAY_ADDRESS=127.0.0.1:6379)")
    init_ray()
    stop = _stop_event()
    started_serve = not serve_running()
    if not started_serve:
        click.echo(f"Serve already runs on this cluster: its proxy keeps its own host and port "
                   f"(--host/--port {flags['host']}:{flags['port']} apply only to a new Serve)", err=True)
    try:
        start()
    except BaseException:
        if started_serve and serve_running():  # a failed start leaves nothing behind
            serve.shutdown()
        raise
    try:
        base = f"http://{flags['host']}:{flags['port']}{flags['route']}"
        token = flags.get("token_sha256") is not None
        click.echo(f"rexeval {kind} endpoint {flags['name']!r} is up at {base}")
        click.echo(f"  health:  GET {base}/healthz   (no token)")
        for line in info_lines:
            click.echo(f"  {line.replace('{base}', base)}")
        click.echo(f"  auth:    {'Authorization: Bearer $' + flags['token_env'] if token else 'none (127.0.0.1 only)'}")
        if detach:
            click.echo(f"Detached: it runs until `serve delete {flags['name']}` (or `serve shutdown`).")
            return
        click.echo("Serving until Ctrl-C or SIGTERM.")
        while not stop.wait(3600):
            pass
    except BaseException:
        detach = False  # a crash leaves nothing behind
        raise
    finally:
        if not detach:
            if started_serve:
                serve.shutdown()
            else:
                serve.delete(flags["name"])
            click.echo(f"Stopped {flags['name']!r}.")


@click.group("serve")
def serve_group():
    """Standing Ray Serve endpoints: the NLI scorer and the LLM judge, shared by jobs and services.

    Each runs until stopped (Ctrl-C or SIGTERM), on 127.0.0.1 unless --host says otherwise;
    a public address needs a bearer token (REXEVAL_SERVE_TOKEN). Jobs use them with
    `--nli-service URL` / `--judge-service URL`, and send the same token. For `serve run` /
    `serve deploy` and KubeRay, the same applications are built from config files
    (deploy/serve/*.yaml: import paths rexeval.serve.nli:app and rexeval.serve.judge:app).
    """


@serve_group.command("nli")
@click.option("--model", help="NLI checkpoint (path or reference; default: the profile's nli model).")
@click.option("--profile", default="local", show_default=True, help="Model profile giving the default model.")
@click.option("--scorer", help="package.module:Class building the scorer (default: rexeval's NLIScorer).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--max-batch-pairs", type=int, help="Pairs per model batch, merged across requests (default 64).")
@_endpoint_options("/nli", "rexeval-nli")
@user_errors
def serve_nli_cmd(model, profile, scorer, device, max_batch_pairs, **flags):
    """Serve NLI scores (entailment, neutral, contradiction) over HTTP until stopped.

    API: POST <route> {"pairs": [[premise, hypothesis], ...]} -> {"probs": [[E, N, C], ...],
    "labels": [...]}; GET <route> (model, limits); GET <route>/healthz. Errors: 400 bad JSON,
    401 token, 413 over the limits, 422 wrong shape, 503 overloaded (retry later).

    Examples:

      rexeval serve nli --model /models/deberta-large-mnli

      REXEVAL_SERVE_TOKEN=$(openssl rand -hex 32) rexeval serve nli --model /models/deberta-large-mnli \\
          --host 0.0.0.0 --max-replicas 4 --num-gpus 1

      rexeval evaluate runs/mi/explanations --out runs/mi/eval --nli-service http://127.0.0.1:8000/nli
    """
    from rexeval.models.profiles import load_profile
    from rexeval.serve.nli import NLIServeConfig, start_nli_service

    from rexeval.models.refs import resolve

    model = model or load_profile(profile).require("nli")
    resolve(model, prepare=False)  # in the driver first: a missing model package is named here
    settings = _replica_settings(flags)
    extra = {k: v for k, v in {"scorer": scorer, "max_batch_pairs": max_batch_pairs}.items() if v is not None}
    cfg = NLIServeConfig(model=model, device=device, **extra, **settings)
    _serve("NLI", flags,
           lambda: start_nli_service(cfg, host=flags["host"], port=flags["port"], route=flags["route"],
                                     name=flags["name"]),
           [f"model:   {model}",
            "score:   POST {base}  {\"pairs\": [[premise, hypothesis], ...]}"])


@serve_group.command("judge")
@click.option("--model", help="Judge model reference (default: the profile's judge_llm).")
@click.option("--profile", default="local", show_default=True, help="Model profile giving the default model "
                                                                    "and backend.")
@click.option("--backend", help="LLM backend: hf, openai, vllm, package.module:Class (default: the profile's).")
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE",
              help="Backend setting, e.g. batch_size=8, device=cuda, base_url=http://upstream/v1.")
@click.option("--cache", help="The replicas' LLM-call cache: a URI (s3://bucket/llm-calls, one object per call, "
              "read by a replica on any node) or a SQLite file on each replica's node "
              "(default $REXEVAL_CACHE, else ~/.cache/rexeval/llm-calls.sqlite).")
@click.option("--no-cache", is_flag=True, help="Answer every call afresh.")
@click.option("--max-batch-requests", type=int, help="Chat requests merged into one generate() (default 32).")
@_endpoint_options("/judge", "rexeval-judge")
@user_errors
def serve_judge_cmd(model, profile, backend, backend_options, cache, no_cache, max_batch_requests, **flags):
    """Serve an LLM judge (any chat model) over HTTP until stopped, in rexeval's and OpenAI's shapes.

    API: POST <route> {"requests": [ChatRequest, ...]} -> {"results": [...], "model_id"};
    POST <route>/v1/chat/completions and GET <route>/v1/models (OpenAI's shape: point any
    OpenAI client at base_url http://HOST:PORT<route>/v1); GET <route> (model, limits,
    counters); GET <route>/healthz. Calls from all clients are batched together.

    With --backend vllm the endpoint is Ray's own LLM app (ray.serve.llm's
    build_openai_app: vLLM engines as autoscaled replicas) under the same route, in the
    OpenAI shape only; jobs reach it with --backend openai and its base_url.

    Examples:

      rexeval serve judge                      # the local profile's SmolLM2 on the CPU

      rexeval serve judge --profile paper --backend vllm --max-replicas 4   # Ray's vLLM OpenAI app (ray.serve.llm)

      rexeval judge likert runs/mi/explanations --out runs/mi/likert --judge-service http://127.0.0.1:8000/judge
    """
    from rexeval.models.llm.base import BackendSpec, check_model_here
    from rexeval.models.profiles import load_profile
    from rexeval.pipelines.core.llm.job import LLMJobSettings
    from rexeval.serve.judge import JudgeServeConfig, start_judge_service

    prof = load_profile(profile)
    model = model or prof.require("judge_llm")
    # A URI stays a URI: the replicas keep one object per call there, so a replica on any
    # node answers from what another cached (models/llm/cache.py, ObjectCallCache).
    job = LLMJobSettings(profile=profile, cache=cache, use_cache=not no_cache).with_resolved_cache()
    spec = BackendSpec(backend=backend or prof.llm_backend, model=model,
                       options=parse_backend_options(backend_options))
    check_model_here(spec.backend, spec.model)  # in the driver first: a missing model package is named here
    if spec.backend == "vllm":
        _serve_vllm_judge(spec, flags)
        return
    settings = _replica_settings(flags)
    extra = {"max_batch_requests": max_batch_requests} if max_batch_requests else {}
    cfg = JudgeServeConfig(backend=spec, cache=job.cache_path(), **extra, **settings)
    _serve("judge", flags,
           lambda: start_judge_service(cfg, host=flags["host"], port=flags["port"], route=flags["route"],
                                       name=flags["name"]),
           [f"model:   {model} ({spec.backend})",
            "judge:   POST {base}  {\"requests\": [{\"messages\": [...], \"sampling\": {...}}]}",
            "openai:  base_url {base}/v1  (POST /chat/completions, GET /models)"])


def _serve_vllm_judge(spec, flags: dict) -> None:
    """`serve judge --backend vllm`: Ray's OpenAI LLM app (`serve.judge_vllm`), not
    vLLM inside rexeval's replica. It checks no bearer token: off 127.0.0.1, put it
    behind your gateway."""
    from rexeval.serve.judge_vllm import llm_config_args, start_vllm_judge, vllm_judge_app

    if flags.get("num_gpus"):
        click.echo("--num-gpus: vLLM engines take their GPUs from the engine settings "
                   "(--backend-option tensor_parallel_size=N), not from --num-gpus", err=True)
    args = llm_config_args(spec, min_replicas=flags["min_replicas"], max_replicas=flags["max_replicas"],
                           max_ongoing_requests=flags.get("max_ongoing_requests"))
    if flags["host"] not in ("127.0.0.1", "localhost"):
        click.echo(f"warning: Ray's OpenAI app checks no token; on {flags['host']} anyone who reaches the port "
                   "can call it", err=True)
    app = vllm_judge_app(args)  # before Ray starts: without vLLM this says what to install
    model_id = args["model_loading_config"]["model_id"]
    _serve("judge (vLLM, ray.serve.llm)", {**flags, "token_sha256": None},
           lambda: start_vllm_judge(app, host=flags["host"], port=flags["port"], route=flags["route"],
                                    name=flags["name"]),
           [f"model:   {model_id} (vllm engines: {args['engine_kwargs']})",
            "openai:  base_url {base}/v1  (POST /chat/completions, GET /models)",
            "jobs:    --backend openai --backend-option base_url={base}/v1 --model " + model_id
            + " --judge-service none"])


def main():  # python -m rexeval.ray_jobs.serve_cmd
    serve_group()


if __name__ == "__main__":
    main()

