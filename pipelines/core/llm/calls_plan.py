"""Where one model's calls go in a streaming LLM job: a `CallPlan` (backend, model,
where it runs, how wide), and the job's own model actors for the local kind.

`CallPlan.kind` is where the model is, as `pipelines/core/llm/placement.py` decides for
every LLM stage (`job_plan` here and `llm.chunks.chunk_plan` only wrap its `place_llm`):
"local" (the job's model actors, `LocalCaller`), "vllm" (a `ray.serve.llm` app the job
deploys), "serve" (a running rexeval judge deployment) or "http" (an OpenAI-compatible
server, or a judge app by URL). `pipelines/core/llm/engines.py` starts each plan's engine
group once per job and gives the stream's workers their clients to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rexeval.models.llm.base import ChatRequest, LLMResult
from rexeval.pipelines.core.llm.placement import Placement, actors_now, call_kind, describe, place_llm
from rexeval.pipelines.core.stage import Resources


@dataclass(frozen=True)
class CallPlan:
    """One model's calls in a streaming job: backend, model, where it runs, how wide."""

    backend: str
    model: str
    options: dict[str, Any] = field(default_factory=dict)
    cache: str | None = None
    address: str = "none"  # "none" (the model here), "serve:APP", or an http(s) URL of a judge app
    resources: Resources = Resources()  # one local actor's share
    concurrency: tuple[int, int] = (1, 1)
    batch_size: int = 16
    reason: str = field(default="", compare=False)  # why it runs there (`llm.placement.place_llm`)

    @classmethod
    def placed(cls, placement: Placement, model: str, options: dict[str, Any] | None,
               cache: str | None) -> CallPlan:
        """A model's plan where `placement` (`llm.placement.place_llm`) puts it, with the
        job's call cache in front of it wherever it runs."""
        opts = dict(options or {})
        return cls(backend=placement.backend, model=model, options=opts,
                   cache=cache, address=placement.address,
                   resources=placement.resources, concurrency=placement.concurrency,
                   batch_size=int(opts.get("batch_size", 16)), reason=placement.reason)

    @property
    def kind(self) -> str:
        return call_kind(self.backend, self.address)

    @property
    def model_id(self) -> str:
        return self.model

    def describe(self, actors: int | None = None) -> str:
        """Where the calls go, for a progress line (`llm.placement.describe`)."""
        return describe(self.kind, self.backend, self.address, self.concurrency, self.resources, actors,
                        self.reason)


def job_plan(cfg, backend: str, model: str) -> CallPlan:
    """Where one model's calls go for a streamed LLM job's settings (`cfg`: backend
    options, workers, cache), as `llm.placement.place_llm` decides for every LLM stage:
    in-process actors for hf (or a backend of your own), vLLM engines, a judge deployment
    (`backend: serve` with `backend_options.address` serve:APP or a URL), or an
    OpenAI-compatible server."""
    where = place_llm(backend, cfg.backend_options, cfg, job="stream")
    return CallPlan.placed(where, model, cfg.backend_options, cfg.cache_path())


# -- results as text ----------------------------------------------------------------------


def result_json(res: LLMResult) -> str:
    return res.model_dump_json()


def transient_result(why: str) -> str:
    return result_json(LLMResult(error=why, transient=True))


# -- the local kind: an in-process backend on an actor pool ---------------------------------


class LocalCaller:
    """A model actor of the job (local kind): one backend behind the call cache, loaded
    once, answering calls from every conversation worker of the job for its whole run.
    Transient failures come back as they are: the stream retries them."""

    def __init__(self, plan: CallPlan):
        from rexeval.models.llm.cache import build_cached_backend
        from rexeval.pipelines.core.stage import use_cpus

        use_cpus(plan.resources)
        self.plan = plan
        self.llm = build_cached_backend(plan.backend, plan.model, plan.options, plan.cache)

    def ready(self) -> bool:
        """Answers once the model is loaded (the constructor has run)."""
        return True

    def generate(self, requests: list[str]) -> list[str]:
        """ChatRequests as JSON -> LLMResults as JSON, in order."""
        reqs = [ChatRequest.model_validate_json(r) for r in requests]
        try:
            results = list(self.llm.generate(reqs))
        except Exception as exc:  # noqa: BLE001  (the backend failed the call, not the model)
            results = [LLMResult(error=f"{type(exc).__name__}: {exc}", transient=True) for _ in reqs]
        if len(results) != len(reqs):
            results = [LLMResult(error=f"backend returned {len(results)} results for {len(reqs)} requests",
                                 transient=True) for _ in reqs]
        return [result_json(r) for r in results]


def start_hosts(plan: CallPlan) -> list:
    """The job's in-process model actors (local kind): started once, so the model loads
    once per job, however many passes call it (a Ray Data actor pool would load it again
    for every pass). Up to `plan.concurrency[1]` of them, as many as fit now."""
    import ray

    n = actors_now(plan.concurrency, plan.resources)
    # The actors reserve 3/4 of the CPUs they use as torch threads: Ray Data schedules
    # nothing, not even the stream's 0-CPU tasks, on a cluster with no CPU free.
    actor = ray.remote(num_cpus=plan.resources.cpus * 0.75, num_gpus=plan.resources.gpus or 0,
                       resources=plan.resources.ray_resources, memory=plan.resources.memory or None)(LocalCaller)
    return [actor.remote(plan) for _ in range(n)]


def stop_hosts(hosts: list) -> None:
    import ray

    for h in hosts:
        ray.kill(h)
