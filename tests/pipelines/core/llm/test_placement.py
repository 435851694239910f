"""Where every LLM stage's model runs (`pipelines/core/llm/placement.py`): a table of each
backend and settings the stages pass, and the plan the code before `place_llm` chose
for it (worked out by hand from the old `llm.calls_plan.job_plan` and
`llm.chunks.chunk_plan`, on one machine of 8 CPUs with 6 free). Since issue 47 `workers`
is the most actors of a pool that starts from `min_workers` (1): a local plan's
concurrency (n, n) became (1, n); the rest is as it was."""
from __future__ import annotations

import pytest

import rexeval.pipelines.core.stage as stage_module
from rexeval.pipelines.core.llm.calls_plan import CallPlan, job_plan
from rexeval.pipelines.core.llm.chunks import chunk_plan
from rexeval.pipelines.core.llm.job import ChunkedLLMSettings, LLMJobSettings
from rexeval.pipelines.core.llm.placement import (VLLM_OWN_ENGINES, actors_now, judge_service_for,
                                                  place_llm)
from rexeval.pipelines.core.stage import Resources

CACHE = "/tmp/placement-test.sqlite"
CUSTOM = "tests.doubles.llm:ScriptedLLM"
R = Resources
CLIENT = R(cpus=0.25)


@pytest.fixture(autouse=True)
def machine(monkeypatch):
    """A Ray started on this machine: 8 CPUs in all, 6 of them free now (a judge replica
    holds the rest)."""
    monkeypatch.setattr(stage_module, "machine_cpus", lambda free=False: 6.0 if free else 8.0)


# Streamed jobs (extract, extract-quality, evaluate's st2exp, XRec's profiles): job_plan.
# (backend, backend_options, worker settings) -> kind, plan backend, address, resources,
# concurrency, batch_size; the job's cache always kept.
STREAM = [
    # in-process backends: up to `workers` actors sharing the machine's 8 CPUs
    ("hf", {}, {}, "local", "hf", "none", R(8.0, 0.0), (1, 1), 16),
    ("hf", {}, {"workers": 2, "gpus_per_worker": 0.5}, "local", "hf", "none", R(4.0, 0.5), (1, 2), 16),
    ("hf", {}, {"workers": 3}, "local", "hf", "none", R(2.0, 0.0), (1, 3), 16),
    ("hf", {}, {"workers": 3, "cpus_per_worker": 1.5}, "local", "hf", "none", R(1.5, 0.0), (1, 3), 16),
    ("hf", {}, {"workers": 3, "min_workers": 3}, "local", "hf", "none", R(2.0, 0.0), (3, 3), 16),
    ("hf", {"batch_size": 4}, {"workers": 4}, "local", "hf", "none", R(2.0, 0.0), (1, 4), 4),
    (CUSTOM, {}, {"workers": 2}, "local", CUSTOM, "none", R(4.0, 0.0), (1, 2), 16),
    # vLLM engines: backend_options.concurrency (default one), resources as for actors
    ("vllm", {}, {"workers": 2}, "vllm", "vllm", "none", R(4.0, 0.0), (1, 1), 16),
    ("vllm", {"concurrency": [1, 2]}, {}, "vllm", "vllm", "none", R(8.0, 0.0), (1, 2), 16),
    ("vllm", {"concurrency": 3}, {"gpus_per_worker": 1.0}, "vllm", "vllm", "none", R(8.0, 1.0), (1, 3), 16),
    # an OpenAI-compatible server: backend_options.concurrency, else workers
    ("openai", {"base_url": "http://h:1/v1"}, {"workers": 2}, "http", "openai", "none", CLIENT, (1, 2), 16),
    ("openai", {"concurrency": 8}, {}, "http", "openai", "none", CLIENT, (1, 8), 16),
    # backend serve: the judge deployment named in backend_options.address
    ("serve", {}, {}, "serve", "serve", "serve:rexeval-judge", CLIENT, (1, 1), 16),
    ("serve", {"address": "serve:app"}, {"workers": 3}, "serve", "serve", "serve:app", CLIENT, (1, 3), 16),
    ("serve", {"address": "http://h:2/judge", "concurrency": 5}, {"workers": 2}, "http", "serve",
     "http://h:2/judge", CLIENT, (1, 5), 16),
]


@pytest.mark.parametrize("backend, options, workers, kind, plan_backend, address, resources, conc, batch", STREAM)
def test_a_streamed_job_places_its_model_as_before(backend, options, workers, kind, plan_backend, address,
                                                   resources, conc, batch):
    cfg = LLMJobSettings(backend=backend, backend_options=options, cache=CACHE, **workers)
    plan = job_plan(cfg, backend, "m")
    assert plan == CallPlan(backend=plan_backend, model="m", options=options, cache=CACHE, address=address,
                            resources=resources, concurrency=conc, batch_size=batch)
    assert plan.kind == kind == place_llm(backend, options, cfg).where
    assert plan.reason


# Chunked jobs (the judges, detect's generator, the prompted generators): chunk_plan with
# the judge service's address ("none": judge_service none, or vLLM with auto).
CHUNKS = [
    # a judge deployment or app answers: backend serve, `workers` batches, the job's cache
    # in front of it
    ("hf", {}, "serve:rexeval-judge", {"workers": 2}, "serve", "serve", CLIENT, (1, 2), CACHE),
    ("openai", {"concurrency": 9}, "serve:app", {}, "serve", "serve", CLIENT, (1, 1), CACHE),
    ("hf", {"batch_size": 8}, "http://h:3/judge", {"workers": 3}, "http", "serve", CLIENT, (1, 3), CACHE),
    # judge_service none, in-process: up to `workers` actors sharing the 6 CPUs free now
    ("hf", {}, "none", {}, "local", "hf", R(6.0, 0.0), (1, 1), CACHE),
    ("hf", {}, "none", {"workers": 2, "gpus_per_worker": 1.0}, "local", "hf", R(3.0, 1.0), (1, 2), CACHE),
    ("hf", {}, "none", {"workers": 4}, "local", "hf", R(1.0, 0.0), (1, 4), CACHE),
    (CUSTOM, {}, "none", {"workers": 3, "cpus_per_worker": 2.0}, "local", CUSTOM, R(2.0, 0.0), (1, 3), CACHE),
    # vLLM engines (backend_options.concurrency), the resources left at their default
    ("vllm", {"concurrency": [1, 2]}, "none", {}, "vllm", "vllm", R(), (1, 2), CACHE),
    ("vllm", {}, "none", {"workers": 4, "gpus_per_worker": 1.0}, "vllm", "vllm", R(), (1, 1), CACHE),
    # an OpenAI-compatible server, called directly: backend_options.concurrency, else 4
    ("openai", {}, "none", {"workers": 3}, "http", "openai", CLIENT, (1, 4), CACHE),
    ("openai", {"concurrency": 2}, "none", {}, "http", "openai", CLIENT, (1, 2), CACHE),
]


@pytest.mark.parametrize("backend, options, address, workers, kind, plan_backend, resources, conc, cache", CHUNKS)
def test_a_chunked_job_places_its_model_as_before(tmp_path, backend, options, address, workers, kind,
                                                  plan_backend, resources, conc, cache):
    cfg = ChunkedLLMSettings(out=str(tmp_path), backend=backend, backend_options=options, cache=CACHE, **workers)
    spec = {"backend": backend, "model": "m", "options": dict(options), "cache": CACHE}
    plan = chunk_plan(spec, address, cfg)
    assert plan == CallPlan(backend=plan_backend, model="m", options=options, cache=cache, address=address,
                            resources=resources, concurrency=conc, batch_size=int(options.get("batch_size", 16)))
    assert plan.kind == kind == place_llm(backend, options, cfg, job="chunks", address=address).where
    assert plan.reason


@pytest.mark.parametrize("backend, asked, service, said", [
    ("vllm", "auto", "none", VLLM_OWN_ENGINES),  # vLLM cannot be a judge replica's model
    ("vllm", "none", "none", None),
    ("vllm", "serve:app", "serve:app", None),
    ("hf", "auto", "auto", None),
    ("openai", "auto", "auto", None),
    ("hf", "http://h:3/judge", "http://h:3/judge", None),
])
def test_the_judge_service_a_chunked_job_uses(backend, asked, service, said):
    assert judge_service_for(backend, asked) == (service, said)


@pytest.mark.parametrize("concurrency, resources, n", [
    ((2, 2), R(4.0), 2),
    ((1, 4), R(4.0), 2),  # 8 CPUs hold two actors of 4
    ((3, 3), R(8.0), 3),  # never fewer than asked for
    ((1, 4), R(1.0, 1.0), 1),  # a GPU actor: one
    ((1, 1), R(1.0), 1),
])
def test_the_model_actors_a_local_plan_starts(concurrency, resources, n):
    assert actors_now(concurrency, resources) == n


def test_the_placement_is_said_in_one_line():
    plan = job_plan(LLMJobSettings(backend="hf", workers=2, cache=CACHE), "hf", "m")
    assert plan.describe(2).startswith("hf on 2 actor(s), 4 CPU(s) each (")
    served = chunk_plan({"backend": "hf", "model": "m", "options": {}}, "serve:app",
                        ChunkedLLMSettings(out="o", workers=3))
    assert served.describe().startswith("the judge deployment serve:app, 3 batch(es) at a time (")
    with pytest.raises(ValueError, match="stream"):
        place_llm("hf", {}, LLMJobSettings(), job="driver")
