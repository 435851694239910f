"""A job's models as engine groups that live for the whole job, and the clients its
conversation workers reach them through.

`open_engines` starts (or joins) one engine group per model of a job, in the driver,
once; `run_stream` (`llm/stream.py`) stops them at the end. Every call of every turn,
repair and transport retry goes to the same group, so an engine is loaded once per job:

- "local": the job's own model actors (`llm.calls_plan.LocalCaller`), each holding the
  backend (`hf`, or a `module:Class` of your own) behind the call cache;
- "vllm": a `ray.serve.llm` OpenAI application of vLLM replicas, deployed when the job
  starts and deleted when it ends; calls reach it over HTTP on the node's Serve proxy;
- "serve": a standing rexeval judge deployment (`serve:APP`), by its DeploymentHandle:
  the deployment merges concurrent callers' requests into batches (`@serve.batch`);
- "http": any OpenAI-compatible server (`backend: openai`), or a judge app by URL.

The worker side, `EngineClient`, is built once per conversation worker (one cache client
and one HTTP or handle client per worker process, not per batch) from the picklable
`EngineGroup.client_spec`. Whatever the kind, the job's call cache (a URI on a cluster)
sits in the worker, in front of the engines: a re-run asks no engine, replica or
deployment again for what the job already has, whichever node they land on. It takes single requests from many concurrent conversations
and sends them as calls of up to `batch_size` requests, at most `inflight` calls at a
time (`Batcher`): an engine with continuous batching stays full while no conversation
waits on another's turn. Transport policy stays where it already is: the `serve` and
`openai` backends retry overload and 5xx answers themselves and give up with a result
marked `transient`; an exception of a call (a dead actor or replica, a timeout) is turned
into `transient` results here. The stream decides what a transient result means (tried
again after a backoff, or left for a re-run).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import rexeval.pipelines.core.llm.job  # noqa: F401  (registers the "serve" backend in every worker)
from rexeval.models.llm.base import ChatRequest, LLMResult
from rexeval.pipelines.core.llm.calls_plan import CallPlan, start_hosts, stop_hosts
from rexeval.serve.common import default_serve_port

VLLM_APP_PREFIX = "rexeval-vllm-"


class EngineUnusable(RuntimeError):
    """A worker could not build its client to an engine (a missing app, a bad option):
    a mistake to report, not a transport failure to retry."""


@dataclass
class EngineGroup:
    """One model's engines for one job (driver side): what was started and how to reach it."""

    plan: CallPlan
    hosts: list = field(default_factory=list)  # local kind: the model actors
    app: str | None = None  # vllm kind: the Serve application this job deployed
    url: str | None = None  # vllm kind: its OpenAI base URL
    starts: int = 0  # engine groups this job started (0: a standing service it only uses)
    counted: int = 0  # of those, the starts an earlier stream of the job reported (SharedEngines)
    replicas: int = 0
    served: str | None = None  # vllm kind: the model id its OpenAI routes answer to

    def client_spec(self) -> dict[str, Any]:
        """What a worker needs to build its `EngineClient` (picklable)."""
        p = self.plan
        spec: dict[str, Any] = {"kind": p.kind, "model": p.model, "batch_size": max(1, p.batch_size),
                                "inflight": max(1, p.concurrency[-1]), "cache": p.cache}
        if p.kind == "local":
            spec.update(hosts=list(self.hosts), inflight=max(1, len(self.hosts)) * 2)
        elif p.kind == "vllm":
            # Enough requests in flight to keep every replica's continuous batching full:
            # `inflight_per_engine` calls (8) of `batch_size` requests per replica, over at
            # most 256 connections per worker.
            inflight = max(1, p.concurrency[-1]) * int(p.options.get("inflight_per_engine", 8))
            spec.update(backend="openai", inflight=inflight,
                        options={**_transport_options(p.options), "base_url": self.url,
                                 "served_model": self.served or p.model,
                                 "concurrency": min(256, inflight * spec["batch_size"])})
        elif p.address.startswith(("serve:", "http://", "https://")):
            # A judge deployment or app: whatever model it serves answers ("auto"), keyed in
            # the job's cache by the served model's id.
            spec.update(backend="serve", model="auto", options={**p.options, "address": p.address})
        else:
            spec.update(backend=p.backend, options=dict(p.options))
        return spec

    def stop(self) -> None:
        if self.hosts:
            stop_hosts(self.hosts)
            self.hosts = []
        if self.app:
            from ray import serve

            try:
                serve.delete(self.app)
            except Exception:  # noqa: BLE001  (Serve already gone: nothing left to stop)
                pass
            self.app = None


def _transport_options(options: dict) -> dict:
    keep = ("timeout_s", "max_retries", "backoff_s", "max_backoff_s", "api_key", "api_key_env", "extra_body")
    return {k: options[k] for k in keep if k in options}


def open_engines(plans: dict[str, CallPlan], progress: Callable[[str], None] = print,
                 label: str = "llm") -> dict[int, EngineGroup]:
    """One engine group per distinct plan object (extract gives the same plan to its llm
    and verify roles when they are one model: that model loads once), keyed by `id(plan)`."""
    groups: dict[int, EngineGroup] = {}
    try:
        for plan in {id(p): p for p in plans.values()}.values():
            groups[id(plan)] = _open(plan, progress, label)
    except BaseException:
        for g in groups.values():
            g.stop()
        raise
    return groups


class SharedEngines:
    """Engine groups that several streams of one job use in turn, opened by the first that
    runs (none if every stream's work is already done) and stopped by `close()`: a job
    with a stream per part (the prompted job: one per method) loads its model once, not
    once per part. Give the same `plans` objects to every stream (`run_stream(shared=)`).

    `make_plans` runs on the first use of `plans`, where a stream would place its calls
    (after `init_ray`: a local placement reads the CPUs free then)."""

    def __init__(self, make_plans: Callable[[], dict[str, CallPlan]], progress: Callable[[str], None] = print,
                 label: str = "llm"):
        self.make_plans, self.progress, self.label = make_plans, progress, label
        self._plans: dict[str, CallPlan] | None = None
        self.groups: dict[int, EngineGroup] | None = None

    @property
    def plans(self) -> dict[str, CallPlan]:
        if self._plans is None:
            self._plans = self.make_plans()
        return self._plans

    def open(self) -> dict[int, EngineGroup]:
        if self.groups is None:
            self.groups = open_engines(self.plans, self.progress, self.label)
        return self.groups

    def close(self) -> None:
        groups, self.groups = self.groups or {}, None
        for g in groups.values():
            g.stop()

    def __enter__(self) -> SharedEngines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open(plan: CallPlan, progress: Callable[[str], None], label: str) -> EngineGroup:
    if plan.kind == "local":
        hosts = start_hosts(plan)
        group = EngineGroup(plan, hosts=hosts, starts=1, replicas=len(hosts))
        _wait_loaded(group, label)
        return group
    if plan.kind == "vllm":
        return _start_vllm(plan, progress, label)
    group = EngineGroup(plan)
    if group.client_spec()["backend"] == "serve":
        _check_service(group)
    return group


def _wait_loaded(group: EngineGroup, label: str) -> None:
    """The model actors have loaded their model, or the job stops here with why: a model
    that cannot load is a mistake to fix, not a failure for a re-run."""
    import ray

    from rexeval.failures import WorkerFailed, reason_of

    try:
        ray.get([h.ready.remote() for h in group.hosts])
    except ray.exceptions.RayActorError as exc:
        group.stop()
        raise WorkerFailed(f"{label}: a worker could not set it up: {reason_of(exc)}") from exc


def _check_service(group: EngineGroup) -> None:
    """A judge deployment or app is there and answers (its info), before any row is read."""
    from rexeval.models.llm.base import BackendSpec
    from rexeval.serve.judge_client import ServeJudgeLLM

    s = group.client_spec()
    # A slow answer is not an absent app: the probe waits a minute at least, whatever the
    # calls' own timeout_s.
    options = {**s["options"], "timeout_s": max(60.0, float(s["options"].get("timeout_s", 600.0)))}
    ServeJudgeLLM(BackendSpec(backend="serve", model="auto", options=options)).close()


def vllm_app_args(plan: CallPlan) -> dict[str, Any]:
    """The `ray.serve.llm` `LLMConfig` (a dict) of a job's vLLM engines: `serve judge
    --backend vllm`'s (`serve/judge_vllm.py`), an autoscaling pool that starts with the
    plan's min replicas (at least one: the job waits for a loaded model), grows to its max,
    and falls to zero while the job leaves it idle (its GPUs go back to the autoscaler),
    from the engine options among the job's backend options."""
    from rexeval.models.llm.base import BackendSpec
    from rexeval.serve.judge_vllm import ENGINE_OPTIONS, llm_config_args

    engine = {k: v for k, v in plan.options.items() if k in ENGINE_OPTIONS}
    return llm_config_args(BackendSpec(backend="vllm", model=plan.model, options=engine),
                           min_replicas=0, initial_replicas=max(1, plan.concurrency[0]),
                           max_replicas=plan.concurrency[-1])


def _start_vllm(plan: CallPlan, progress: Callable[[str], None], label: str) -> EngineGroup:
    """Deploy the model as a `ray.serve.llm` OpenAI app for this job (its replicas load the
    weights once and serve every turn); calls go to the node's Serve proxy."""
    from rexeval.serve.judge_vllm import start_vllm_judge, vllm_judge_app

    name = VLLM_APP_PREFIX + uuid.uuid4().hex[:8]
    args = vllm_app_args(plan)
    port = int(plan.options.get("serve_port") or default_serve_port())
    progress(f"    {label}: starting vLLM engines ({plan.concurrency[0]}-{plan.concurrency[-1]} replica(s)) "
             f"as Serve app {name}")
    start_vllm_judge(vllm_judge_app(args), port=port, route=f"/{name}", name=name)
    return EngineGroup(plan, app=name, url=f"http://127.0.0.1:{port}/{name}/v1", starts=1,
                       replicas=plan.concurrency[0], served=args["model_loading_config"]["model_id"])


# -- the worker side -----------------------------------------------------------------------


class Batcher:
    """Single requests from concurrent coroutines -> calls of up to `size` requests to
    `send` (an async function of a list), at most `inflight` calls at a time. Requests
    that arrive while the calls are full wait and go out together in the next one, lowest
    `priority` first (the stream gives a shard's order: a shard that started earlier has
    its repairs and verifications sent before later shards' first questions, so shards
    finish, and are written, in turn rather than all at the end)."""

    def __init__(self, send: Callable[[list[ChatRequest]], Any], size: int, inflight: int):
        self.send, self.size = send, size
        self.slots = asyncio.Semaphore(inflight)
        self.queue: list[tuple[int, int, ChatRequest, asyncio.Future]] = []  # a heap
        self.count = 0
        self.flushing = False

    async def ask(self, request: ChatRequest, priority: int = 0) -> LLMResult:
        import heapq

        fut = asyncio.get_running_loop().create_future()
        self.count += 1
        heapq.heappush(self.queue, (priority, self.count, request, fut))
        if not self.flushing:
            self.flushing = True
            asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        import heapq

        try:
            await asyncio.sleep(0)  # the other conversations of this turn enqueue first
            while self.queue:
                await self.slots.acquire()
                batch = [heapq.heappop(self.queue) for _ in range(min(self.size, len(self.queue)))]
                if not batch:
                    self.slots.release()
                    break
                asyncio.create_task(self._call([(r, f) for _, _, r, f in batch]))
        finally:
            self.flushing = False

    async def _call(self, batch: list[tuple[ChatRequest, asyncio.Future]]) -> None:
        try:
            results = await self.send([r for r, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"the engine gave {len(results)} results for {len(batch)} requests")
        except EngineUnusable as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except Exception as exc:  # noqa: BLE001  (a failed call: its requests are transport failures)
            from rexeval.failures import reason_of

            results = [LLMResult(error=f"engine call failed: {reason_of(exc)}", transient=True)] * len(batch)
        finally:
            self.slots.release()
        for (_, fut), res in zip(batch, results):
            if not fut.done():
                fut.set_result(res)


class EngineClient:
    """A worker's way to one engine group (see the module docstring); `ask(request)` is a
    coroutine giving its LLMResult, never raising for a transport failure."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.kind = spec["kind"]
        self._backend = None
        self._pool: ThreadPoolExecutor | None = None
        self._next = 0
        self._batcher: Batcher | None = None

    def _build(self):
        from rexeval.failures import reason_of
        from rexeval.models.llm.cache import build_cached_backend

        s = self.spec
        try:
            self._backend = build_cached_backend(s["backend"], s["model"], s["options"], s["cache"])
        except Exception as exc:  # noqa: BLE001  (reported as the mistake it is, not retried)
            raise EngineUnusable(f"a worker could not set it up: {reason_of(exc)}") from exc
        self._pool = ThreadPoolExecutor(s["inflight"], thread_name_prefix=f"rexeval-{self.kind}")

    async def _send(self, requests: list[ChatRequest]) -> list[LLMResult]:
        if self.kind == "local":
            import ray

            hosts = self.spec["hosts"]
            host = hosts[self._next % len(hosts)]
            self._next += 1
            try:
                got = await host.generate.remote([r.model_dump_json() for r in requests])
            except ray.exceptions.RayActorError:
                if len(hosts) > 1 and host in hosts:  # the others take its share from now on
                    hosts.remove(host)
                raise
            return [LLMResult.model_validate_json(g) for g in got]
        loop = asyncio.get_running_loop()
        if self._backend is None:
            await loop.run_in_executor(None, self._build)
        t0 = time.perf_counter()
        results = await loop.run_in_executor(self._pool, self._backend.generate, requests)
        return [r if r.seconds or r.cached else r.model_copy(update={"seconds": time.perf_counter() - t0})
                for r in results]

    async def ask(self, request: ChatRequest, priority: int = 0) -> LLMResult:
        if self._batcher is None:
            self._batcher = Batcher(self._send, self.spec["batch_size"], self.spec["inflight"])
        return await self._batcher.ask(request, priority)

    def close(self) -> None:
        if self._backend is not None:
            try:
                self._backend.close()
            except Exception:  # noqa: BLE001  (closing a client of a job that ended)
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
