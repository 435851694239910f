"""Where a streaming LLM job's calls go: one `ray.data.llm` processor per backend, or
an in-process backend on an actor pool, all with the same rows in and out.

A pass gives the processor rows with a `request` column (a `ChatRequest` as JSON) and
gets them back with a `result` column (an `LLMResult` as JSON) added; every other column
travels through. The processor is chosen by where the model is (`CallPlan.kind`), which
`pipelines/core/llm_placement.py` decides for every LLM stage (`job_plan` here and
`llm_chunks.chunk_plan` only wrap its `place_llm`):

- "vllm": `vLLMEngineProcessorConfig`, engines on GPUs for the pass, as a (min, max) pool;
- "serve": `ServeDeploymentProcessorConfig` against a running rexeval judge deployment
  (its streaming `chat` method), inside the cluster;
- "http": `HttpRequestProcessorConfig` against any OpenAI-compatible endpoint: the
  `openai` backend's `base_url`, or a judge app reached by URL (its `/v1/chat/completions`);
- "local": the `hf` backend (or a `module:Class` backend of your own) built once per
  model actor of the job (`start_hosts`), behind the call cache: the laptop path, same shape.

Transport failures come back as results with `transient` set (the processors' own
retries spent, or a block Ray Data gave up on: see `pipelines/core/llm_stream.py`), never
as a model's answer. Deterministic calls are answered from the call cache before the
processor sees them and stored after (the judge deployment keeps its own cache, and the
local kind's backend is wrapped in it).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.models.llm.base import ChatRequest, LLMResult
from rexeval.pipelines.core.llm_placement import Placement, actors_now, call_kind, describe, place_llm
from rexeval.pipelines.core.stage import Resources

ERROR_COLUMN = "__inference_error__"


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
    transport_retries: int = 3  # in-actor tries of a transient failure before it is left
    reason: str = field(default="", compare=False)  # why it runs there (`llm_placement.place_llm`)

    @classmethod
    def placed(cls, placement: Placement, model: str, options: dict[str, Any] | None,
               cache: str | None) -> CallPlan:
        """A model's plan where `placement` (`llm_placement.place_llm`) puts it: the job's
        call cache kept unless a judge deployment keeps its own."""
        opts = dict(options or {})
        return cls(backend=placement.backend, model=model, options=opts,
                   cache=cache if placement.keeps_cache else None, address=placement.address,
                   resources=placement.resources, concurrency=placement.concurrency,
                   batch_size=int(opts.get("batch_size", 16)), reason=placement.reason)

    @property
    def kind(self) -> str:
        return call_kind(self.backend, self.address)

    @property
    def model_id(self) -> str:
        return self.model

    def describe(self, actors: int | None = None) -> str:
        """Where the calls go, for a progress line (`llm_placement.describe`)."""
        return describe(self.kind, self.backend, self.address, self.concurrency, self.resources, actors,
                        self.reason)


def job_plan(cfg, backend: str, model: str) -> CallPlan:
    """Where one model's calls go for a streamed LLM job's settings (`cfg`: backend
    options, workers, cache), as `llm_placement.place_llm` decides for every LLM stage:
    in-process actors for hf (or a backend of your own), vLLM engines, a judge deployment
    (`backend: serve` with `backend_options.address` serve:APP or a URL), or an
    OpenAI-compatible server."""
    where = place_llm(backend, cfg.backend_options, cfg, job="stream")
    return CallPlan.placed(where, model, cfg.backend_options, cfg.cache_path())


# -- rows <-> requests and results ------------------------------------------------------


def result_json(res: LLMResult) -> str:
    return res.model_dump_json()


def transient_result(why: str) -> str:
    return result_json(LLMResult(error=why, transient=True))


# -- the call cache in front of a processor ------------------------------------------------


def _cache_keys(batch: pa.Table, model_id: str) -> list[str | None]:
    from rexeval.models.llm.cache import request_key

    keys = []
    for raw in batch.column("request").to_pylist():
        req = ChatRequest.model_validate_json(raw)
        keys.append(request_key(model_id, req) if req.sampling.deterministic else None)
    return keys


def cache_lookup(batch: pa.Table, cache: str, model_id: str) -> pa.Table:
    """Fill `result` for the rows the cache answers (the others get null)."""
    from rexeval.pipelines.core.llm_cache import open_call_cache

    store = open_call_cache(cache)
    keys = _cache_keys(batch, model_id)
    found = store.get_many(k for k in keys if k)
    store.close()
    results = [result_json(found[k]) if k in found else None for k in keys]
    return _set(batch, "result", pa.array(results, pa.string()))


def cache_store(batch: pa.Table, cache: str, model_id: str) -> pa.Table:
    from rexeval.pipelines.core.llm_cache import open_call_cache

    keys = _cache_keys(batch, model_id)
    items = [(k, LLMResult.model_validate_json(r)) for k, r in zip(keys, batch.column("result").to_pylist())
             if k and r]
    if items:
        store = open_call_cache(cache)
        store.put_many(items, model_id=model_id)
        store.close()
    return batch


def _set(batch: pa.Table, name: str, values: pa.Array) -> pa.Table:
    if name in batch.column_names:
        return batch.set_column(batch.column_names.index(name), name, values)
    return batch.append_column(name, values)


def with_result(batch: pa.Table, present: bool) -> pa.Table:
    """The rows whose `result` is (or is not) filled."""
    valid = pc.is_valid(batch.column("result"))
    return batch.filter(valid if present else pc.invert(valid))


# -- the local kind: an in-process backend on an actor pool ---------------------------------


class LocalCaller:
    """A Ray Data actor holding one backend (behind the cache): requests in, results out.
    A transient failure is tried again here, with backoff, `plan.transport_retries` times."""

    def __init__(self, plan: CallPlan):
        from rexeval.pipelines.core.llm_cache import build_cached_backend
        from rexeval.pipelines.core.stage import use_cpus

        use_cpus(plan.resources)
        self.plan = plan
        self.backoff_s = float(plan.options.get("backoff_s", 0.2))
        self.llm = build_cached_backend(plan.backend, plan.model, plan.options, plan.cache)

    def _generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        try:
            results = list(self.llm.generate(requests))
        except Exception as exc:  # noqa: BLE001  (the backend failed the call, not the model)
            return [LLMResult(error=f"{type(exc).__name__}: {exc}", transient=True) for _ in requests]
        if len(results) != len(requests):
            return [LLMResult(error=f"backend returned {len(results)} results for {len(requests)} requests",
                              transient=True) for _ in requests]
        return results

    def call(self, batch: pa.Table) -> pa.Table:
        requests = [ChatRequest.model_validate_json(r) for r in batch.column("request").to_pylist()]
        results = self._generate(requests)
        for attempt in range(self.plan.transport_retries):
            again = [i for i, r in enumerate(results) if r.transient]
            if not again:
                break
            time.sleep(min(30.0, self.backoff_s * 2 ** attempt) * random.uniform(0.5, 1.0))
            for i, r in zip(again, self._generate([requests[i] for i in again])):
                results[i] = r
        return _set(batch, "result", pa.array([result_json(r) for r in results], pa.string()))


# -- the ray.data.llm kinds -----------------------------------------------------------------


NO_CPU_MAPS = {"preprocess_map_kwargs": {"num_cpus": 0}, "postprocess_map_kwargs": {"num_cpus": 0}}


def as_client(processor):
    """A processor whose stages only wait on a model elsewhere (a Serve deployment, an
    HTTP endpoint), its actors holding no CPU. Ray Data gives them a CPU each by default,
    and on a small cluster they then hold the CPU a judge replica needs to restart after
    a crash: the pass waits on a replica that can never be scheduled."""
    for stage in processor.stages.values():
        stage.map_batches_kwargs = {**stage.map_batches_kwargs, "num_cpus": 0}
    return processor


def _serve_processor(plan: CallPlan):
    from ray.data.llm import ServeDeploymentProcessorConfig, build_processor

    from rexeval.serve.judge import DEPLOYMENT

    config = ServeDeploymentProcessorConfig(
        deployment_name=str(plan.options.get("deployment", DEPLOYMENT)),
        app_name=plan.address.split(":", 1)[1], batch_size=plan.batch_size,
        concurrency=plan.concurrency[1], should_continue_on_error=True,
        request_timeout_s=float(plan.options.get("timeout_s", 600.0)))

    def pre(row: dict) -> dict:
        # As JSON text: through Arrow a nested request would come back as numpy arrays,
        # and requests with different schemas would not share one column type.
        return {**row, "method": "chat", "request_kwargs": {"request_json": row["request"]}}

    def post(row: dict) -> dict:
        out = {k: v for k, v in row.items() if k not in _SERVE_INTERNAL}
        error = row.get(ERROR_COLUMN)
        out["result"] = transient_result(f"judge deployment call failed: {error}") if error else row["result"]
        return out

    return as_client(build_processor(config, preprocess=pre, postprocess=post, **NO_CPU_MAPS))


_SERVE_INTERNAL = {"method", "request_kwargs", "request_id", "batch_uuid", "time_taken", ERROR_COLUMN,
                   "idx_in_batch", "__idx_in_batch__"}


def chat_url(plan: CallPlan) -> tuple[str, str]:
    """(chat completions URL, model name to send) for the http kind."""
    if plan.address.startswith(("http://", "https://")):  # a judge app: whatever model it serves
        return plan.address.rstrip("/") + "/v1/chat/completions", "auto"
    base = str(plan.options.get("base_url") or "").rstrip("/")
    if not base:
        raise ValueError("the openai backend needs backend_options.base_url (e.g. http://127.0.0.1:8000/v1)")
    return base + "/chat/completions", str(plan.options.get("served_model") or plan.model)


def _http_headers(plan: CallPlan) -> dict[str, str]:
    import os

    from rexeval.serve.common import auth_headers

    # A judge app reached by URL takes rexeval's bearer token; an openai server its key.
    headers = dict(auth_headers()) if plan.address.startswith(("http://", "https://")) else {}
    key = plan.options.get("api_key") or os.environ.get(str(plan.options.get("api_key_env", "OPENAI_API_KEY")))
    if key and plan.backend == "openai":
        headers["Authorization"] = f"Bearer {key}"
    return headers


def _http_processor(plan: CallPlan):
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    from rexeval.models.llm.openai_backend import parse_response, request_body

    url, model = chat_url(plan)
    extra = plan.options.get("extra_body") or None
    config = HttpRequestProcessorConfig(
        url=url, headers=_http_headers(plan), batch_size=plan.batch_size, concurrency=plan.concurrency[1],
        max_retries=int(plan.options.get("max_retries", 4)),
        base_retry_wait_time_in_s=float(plan.options.get("backoff_s", 1.0)))

    def pre(row: dict) -> dict:
        return {**row, "payload": request_body(model, ChatRequest.model_validate_json(row["request"]), extra)}

    def post(row: dict) -> dict:
        out = {k: v for k, v in row.items() if k not in ("payload", "http_response", ERROR_COLUMN)}
        error = row.get(ERROR_COLUMN)
        if error:
            out["result"] = transient_result(f"HTTP call failed: {error}")
            return out
        body = row.get("http_response") or {}
        try:
            out["result"] = result_json(parse_response(body))
        except ValueError as exc:
            # An error body the stage did not retry: a 4xx is the request's problem
            # (recorded); a server error (OpenAI's type "server_error", e.g. a 500) is
            # the endpoint's, so the row is tried again later. A malformed body too.
            detail = body.get("error") if isinstance(body, dict) else None
            server = detail is None or (isinstance(detail, dict) and detail.get("type") == "server_error")
            message = detail.get("message") if isinstance(detail, dict) else None
            out["result"] = result_json(LLMResult(error=f"HTTP endpoint: {message or exc}", transient=server))
        return out

    return as_client(build_processor(config, preprocess=pre, postprocess=post, **NO_CPU_MAPS))


def _vllm_processor(plan: CallPlan):
    from rexeval.models.llm.base import BackendSpec
    from rexeval.models.llm.vllm_backend import build_request_processor

    spec = BackendSpec(backend="vllm", model=plan.model, options=plan.options)
    return build_request_processor(spec, batch_size=plan.batch_size, concurrency=plan.concurrency,
                                   passthrough=("__row__",))


def _vllm_rows(batch: pa.Table) -> pa.Table:
    """Requests -> the request columns the vLLM processor reads (the row kept whole as
    JSON in `__row__`, so every other column comes back with the answer)."""
    rows = []
    for row in batch.to_pylist():
        req = ChatRequest.model_validate_json(row["request"])
        s = req.sampling
        rows.append({"__row__": json.dumps(row), "messages": req.messages, "temperature": s.temperature,
                     "top_p": s.top_p, "max_tokens": s.max_tokens, "seed": s.seed,
                     "json_schema": json.dumps(req.json_schema) if req.json_schema is not None else None})
    return pa.Table.from_pylist(rows)


def _from_vllm_rows(batch: pa.Table) -> pa.Table:
    out = []
    for row in batch.to_pylist():
        orig = json.loads(row["__row__"])
        res = LLMResult(text=row.get("text"), prompt_tokens=int(row.get("prompt_tokens") or 0),
                        completion_tokens=int(row.get("completion_tokens") or 0),
                        finish_reason=row.get("finish_reason"), error=row.get("error"))
        out.append({**orig, "result": result_json(res)})
    return pa.Table.from_pylist(out)


def processor_for(plan: CallPlan):
    """The `ray.data.llm` Processor of a plan's kind (not for the local kind)."""
    return {"serve": _serve_processor, "http": _http_processor, "vllm": _vllm_processor}[plan.kind](plan)


def call(ds, plan: CallPlan, hosts: list | None = None):
    """`ds` (rows with `request`) -> the same rows with `result`, through the plan's kind.
    The local kind needs `hosts`: the job's `LocalCaller` actors (`start_hosts`)."""
    import ray

    if plan.kind == "local":
        if not hosts:
            raise ValueError("the local kind calls the job's LocalCaller actors: pass hosts=start_hosts(plan)")
        return ds.map_batches(forward, fn_kwargs={"hosts": hosts}, batch_format="pyarrow",
                              batch_size=plan.batch_size, num_cpus=0,
                              compute=ray.data.TaskPoolStrategy(size=len(hosts) * 2))
    processor = processor_for(plan)
    if plan.kind == "vllm":
        return processor(ds.map_batches(_vllm_rows, batch_format="pyarrow", num_cpus=0)).map_batches(
            _from_vllm_rows, batch_format="pyarrow", num_cpus=0)
    return processor(ds)


def start_hosts(plan: CallPlan) -> list:
    """The job's in-process model actors (local kind): started once, so the model loads
    once per job, however many passes call it (a Ray Data actor pool would load it again
    for every pass). Up to `plan.concurrency[1]` of them, as many as fit now."""
    import ray

    n = actors_now(plan.concurrency, plan.resources)
    # The actors reserve 3/4 of the CPUs they use as torch threads: Ray Data schedules
    # nothing, not even the stream's 0-CPU tasks, on a cluster with no CPU free.
    actor = ray.remote(num_cpus=plan.resources.cpus * 0.75, num_gpus=plan.resources.gpus or 0)(LocalCaller)
    return [actor.remote(plan) for _ in range(n)]


def stop_hosts(hosts: list) -> None:
    import ray

    for h in hosts:
        ray.kill(h)


def forward(batch: pa.Table, hosts: list) -> pa.Table:
    """A Ray Data task's batch, answered by one of the job's model actors."""
    import ray

    return ray.get(hosts[random.randrange(len(hosts))].call.remote(batch))


def call_cached(ds, plan: CallPlan, hosts: list | None = None):
    """`call` with the call cache in front of (and behind) the processor kinds. `ds` must
    be materialized: it is read twice, once for the hits and once for the misses."""
    if plan.kind in ("local", "serve") or not plan.cache:
        return call(ds, plan, hosts)
    looked = ds.map_batches(cache_lookup, fn_kwargs={"cache": plan.cache, "model_id": plan.model_id},
                            batch_format="pyarrow", num_cpus=0).materialize()
    hits = looked.map_batches(with_result, fn_kwargs={"present": True}, batch_format="pyarrow", num_cpus=0)
    misses = looked.map_batches(with_result, fn_kwargs={"present": False}, batch_format="pyarrow", num_cpus=0)
    misses = misses.map_batches(lambda b: b.drop_columns(["result"]), batch_format="pyarrow", num_cpus=0)
    fresh = call(misses, plan).map_batches(cache_store, fn_kwargs={"cache": plan.cache, "model_id": plan.model_id},
                                           batch_format="pyarrow", num_cpus=0)
    return hits.union(fresh)
