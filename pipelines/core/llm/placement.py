"""Where an LLM stage's model runs: the one decision every LLM-backed stage takes.

Every LLM call of the platform goes through the streaming path (`llm.stream.run_stream`)
with one `llm.calls_plan.CallPlan` per model, and every plan's placement comes from
`place_llm` here (`llm.calls_plan.job_plan` and `llm.chunks.chunk_plan` only wrap it).
No LLM backend is called in the driver process: the calls are answered

- "local": by the job's own model actors (`llm.calls_plan.LocalCaller`, started once per
  job by `start_hosts`, `actors_now` of them: up to `workers`, at least `min_workers`),
  each holding the backend in-process: `hf`,
  or a `module:Class` backend of your own;
- "vllm": by vLLM engines on GPUs, a `ray.serve.llm` app the job deploys once, a (min, max) pool;
- "serve": by a running rexeval judge deployment inside the cluster (`serve:APP`);
- "http": by an OpenAI-compatible endpoint: the `openai` backend's `base_url`, or a
  judge app reached by URL (its `/v1/chat/completions`).

(`where` is `CallPlan.kind`: `call_kind` decides both.)

The stages, by how they reach `place_llm`:

- streamed jobs (`job="stream"`, through `job_plan`): `extract` (triplets; STAR's
  extraction and its verifier role), `extract-quality`, `evaluate`'s LLM families
  (st2exp's verifier) and its explanations' statements (through `extract`), and
  `generate`'s XRec profiles. `backend: serve` names its deployment in
  `backend_options.address` (default `serve:rexeval-judge`, or a judge app's URL).
- chunked jobs (`job="chunks"`, through `chunk_plan`): the judges (likert, pairwise's
  gen, detect's generator and gen) and `generate llm`'s prompted generators. Their
  `judge_service` (`judge_service_for`: auto, none, serve:APP or a URL) gives the
  address: with one, the judge deployment (or app) answers every call; with none, the
  job's backend is placed as a streamed job's is.

Not placed here, since no LLM backend is called: pairwise's and detect's disc (the
reward model scores on Ray actors, `judge.disc.DiscStage`), evaluate's NLI and
other model families (`evaluate.pipeline._family_resources`), ground truth (no LLM).

The two kinds of job differ in a few defaults, kept as they were:

=================================  ==============================  ==========================
                                   stream                          chunks
=================================  ==============================  ==========================
openai: requests at a time         backend_options.concurrency,    backend_options.concurrency,
                                   else `workers`                  else 4
a service: batches at a time       backend_options.concurrency,    `workers`
                                   else `workers`
local: each actor's CPUs           `cpus_per_worker`, else on one  `cpus_per_worker`, else on one
(`stage.cpu_share`)                machine its CPUs / `workers`,   machine the CPUs free now /
                                   on a cluster one                `workers` (beside a judge
                                                                   replica), on a cluster one
vllm: `resources` (unused by the   `worker_resources`              Resources() (one CPU)
vllm app)
=================================  ==============================  ==========================
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rexeval.pipelines.core.stage import Resources

DEFAULT_APP = "serve:rexeval-judge"  # a streamed job's `backend: serve` with no address
CLIENT = Resources(cpus=0.25)  # what a plan that only waits on a model elsewhere records
OPENAI_CHUNK_CONCURRENCY = 4  # a chunked job's openai requests at a time, unless told

VLLM_OWN_ENGINES = ("  vllm: the job runs its own vLLM engines through Ray Data (vLLM cannot be a judge "
                    "replica's model; a vLLM judge served by `rexeval serve judge --backend vllm` is "
                    "reached with --backend openai and its base_url)")


def call_kind(backend: str, address: str) -> str:
    """Which engines answer calls of `backend` at `address` ("none", "serve:APP" or a
    URL): "serve", "http", "vllm" or "local" (the module docstring says what each is)."""
    if address.startswith("serve:"):
        return "serve"
    if address.startswith(("http://", "https://")) or backend == "openai":
        return "http"
    if backend == "vllm":
        return "vllm"
    return "local"


@dataclass(frozen=True)
class Placement:
    """Where one model's calls go, and how wide: what a `CallPlan` is built from.

    backend: what the calls are made with (the job's backend, or "serve" when a chunked
    job's judge deployment answers); address: "none", "serve:APP" or a URL;
    concurrency: (min, max) model actors (local) or engines (vllm), or (1, batches or
    requests at a time) for a service; resources: one local actor's share (a service's
    plans record `CLIENT`). Every placement keeps the job's call cache in its plan, a
    served judge's included, so a re-run whose replicas land elsewhere makes no new call."""

    backend: str
    address: str = "none"
    concurrency: tuple[int, ...] = (1, 1)
    resources: Resources = Resources()
    reason: str = ""

    @property
    def where(self) -> str:
        return call_kind(self.backend, self.address)


def place_llm(backend: str, options: Mapping[str, Any] | None, settings, *, job: str = "stream",
              address: str = "none") -> Placement:
    """Where a job's calls of `backend` go (see the module docstring): `options` are the
    backend's options, `settings` any object with `workers`, `cpus_per_worker` and
    `gpus_per_worker` (an `LLMJobSettings`), `job` "stream" or "chunks", and `address` a
    chunked job's judge service ("none", "serve:APP" or a URL; a streamed job's comes
    from `options["address"]` with `backend: serve`)."""
    from rexeval.pipelines.core.stage import pool_size, worker_resources

    if job not in ("stream", "chunks"):
        raise ValueError(f"job must be 'stream' or 'chunks', got {job!r}")
    opts = dict(options or {})
    workers = max(1, settings.workers or 1)
    if job == "chunks" and address != "none":
        return Placement("serve", address, (1, workers), CLIENT,
                         reason=f"judge_service: the judge at {address} answers, {workers} batch(es) at a time")
    if job == "stream" and backend in ("serve", "openai"):
        if backend == "serve":
            address = str(opts.get("address") or DEFAULT_APP)
        where = f"the judge at {address}" if backend == "serve" else "its OpenAI-compatible server"
        return Placement(backend, address, (1, int(opts.get("concurrency", workers))), CLIENT,
                         reason=f"backend {backend}: {where} answers")
    if backend == "vllm":
        c = opts.get("concurrency", 1)
        conc = tuple(int(x) for x in c) if isinstance(c, (list, tuple)) else (1, int(c))
        res = worker_resources(settings) if job == "stream" else Resources()
        return Placement(backend, "none", conc, res, reason="vLLM engines as a ray.serve.llm app, for the whole job")
    if backend == "openai":  # a chunked job's, with judge_service none
        conc = (1, int(opts.get("concurrency", OPENAI_CHUNK_CONCURRENCY)))
        return Placement(backend, "none", conc, CLIENT, reason="judge_service none: its OpenAI-compatible server")
    lo, hi = pool_size(settings.workers, least=getattr(settings, "min_workers", 1))
    free = job == "chunks"
    return Placement(backend, "none", (lo, hi or lo), worker_resources(settings, free=free),
                     reason="in-process: the job's own actors, each loads the model"
                     + (", sharing the CPUs free now" if free else ""))


def judge_service_for(backend: str, judge_service: str) -> tuple[str, str | None]:
    """The judge service a chunked job uses for `backend` when asked for `judge_service`,
    and the line to say when that is not what was asked: vLLM cannot be a judge replica's
    model (`serve.judge_vllm`), so with "auto" a vLLM job runs its own engine pool
    through Ray Data instead ("none"), for the whole job."""
    if backend == "vllm" and judge_service == "auto":
        return "none", VLLM_OWN_ENGINES
    return judge_service, None


def actors_now(concurrency: tuple[int, ...], resources: Resources) -> int:
    """How many model actors a local plan starts (they are started once, for the whole
    job, so they do not grow later): on one machine, within its (min, max), as many as
    the machine holds at `resources` each; on a cluster the most the settings allow,
    whose requests make an autoscaler bring the nodes for them."""
    from rexeval.pipelines.core.stage import fits_machine

    lo, hi = concurrency
    fits = fits_machine(resources)
    return hi if fits is None else max(lo, min(hi, fits))


def describe(where: str, backend: str, address: str, concurrency: tuple[int, ...], resources: Resources,
             actors: int | None = None, reason: str = "") -> str:
    """One progress line's worth: e.g. "hf on 2 actor(s), 4 CPU(s) each"."""
    lo, hi = concurrency[0], concurrency[-1]
    if where == "local":
        n = actors if actors is not None else (lo if lo == hi else f"{lo}-{hi}")
        gpus = f", {resources.gpus:g} GPU(s)" if resources.gpus else ""
        text = f"{backend} on {n} actor(s), {resources.cpus:g} CPU(s){gpus} each"
    elif where == "vllm":
        text = f"vllm on {lo if lo == hi else f'{lo}-{hi}'} engine(s)"
    elif where == "serve":
        text = f"the judge deployment {address}, {hi} batch(es) at a time"
    else:
        target = address if address != "none" else f"{backend} endpoint"
        text = f"{target} over HTTP, {hi} batch(es) at a time"
    return f"{text} ({reason})" if reason else text
