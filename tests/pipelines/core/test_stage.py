"""Actor sizing (pipelines/core/stage.py, llm/placement.py, runtime.py): what a job asks
Ray for comes from its settings, as (min, max) pools an autoscaler can grow, never from
the nodes a cluster has up when the job starts (issue 47, item 2). A cold autoscaling
cluster is simulated by a joined Ray whose nodes and resources may not be read."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pyarrow as pa
import pytest

from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.pipelines.core.llm.placement import actors_now, place_llm
from rexeval.pipelines.core.stage import Resources, Stage, actor_count, pool_size, worker_resources
from rexeval.threads import MAX_THREADS_ENV

ONE_MACHINE = "REXEVAL_ONE_MACHINE"  # stage.ONE_MACHINE_ENV, spelt out: runtime.init_ray sets it


def _refuse(*_args, **_kwargs):
    raise AssertionError("the cluster's nodes or resources were read to size a job")


@pytest.fixture
def unread_cluster(monkeypatch):
    """A job joined to a cluster by address (no Ray of its own on this machine): reading
    the cluster's nodes or resources fails the test."""
    import ray

    for name in ("cluster_resources", "available_resources", "nodes"):
        monkeypatch.setattr(ray, name, _refuse)
    monkeypatch.delenv(ONE_MACHINE, raising=False)


@pytest.fixture
def cold_cluster(unread_cluster, monkeypatch):
    """The same, for code that only asks whether Ray is up (no Ray is started)."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)


def test_a_model_stage_asks_for_its_settings_as_a_growing_pool(cold_cluster):
    """cpus_per_worker=4, workers=8: 4 CPUs per actor and a (1, 8) pool, whatever is up;
    min_workers=8 asks for a fixed pool."""
    cfg = SimpleNamespace(workers=8, cpus_per_worker=4, gpus_per_worker=0)
    assert worker_resources(cfg) == Resources(cpus=4, gpus=0)
    assert pool_size(cfg.workers, 100) == (1, 8)
    assert pool_size(cfg.workers, 100, 8) == (8, 8)
    assert pool_size(cfg.workers, 3) == (1, 3)


def test_settings_that_name_no_cpus_ask_for_one_per_actor_on_a_cluster(cold_cluster):
    """Not "the cluster's CPUs / workers": on a cluster an actor with no cpus_per_worker
    asks for one CPU, and a stage with no workers setting may grow to one actor per task."""
    cfg = SimpleNamespace(workers=2, cpus_per_worker=None, gpus_per_worker=0)
    assert worker_resources(cfg).cpus == 1.0
    assert worker_resources(cfg, free=True).cpus == 1.0
    assert actor_count(None, 6, Resources(cpus=2)) == 6
    assert actor_count(None, 6, Resources(cpus=1, gpus=1)) == 6
    assert actor_count(3, 6) == 3


def test_memory_per_worker_is_reserved_by_each_actor(cold_cluster):
    from rexeval.pipelines.core.stage import GIB

    cfg = SimpleNamespace(workers=2, cpus_per_worker=2, gpus_per_worker=1, memory_per_worker=1.5)
    assert worker_resources(cfg) == Resources(cpus=2, gpus=1, memory=1.5 * GIB)


def test_an_llm_jobs_model_actors_come_from_its_settings(cold_cluster):
    """A local (hf) plan: up to `workers` actors of `cpus_per_worker` each, all of them
    started on a cluster (the autoscaler brings their nodes), from `min_workers`."""
    placed = place_llm("hf", {}, LLMJobSettings(workers=8, cpus_per_worker=4))
    assert placed.concurrency == (1, 8) and placed.resources == Resources(cpus=4)
    assert actors_now(placed.concurrency, placed.resources) == 8
    assert place_llm("hf", {}, LLMJobSettings()).resources == Resources(cpus=1)
    fixed = place_llm("hf", {}, LLMJobSettings(workers=3, min_workers=3), job="chunks")
    assert fixed.concurrency == (3, 3) and fixed.resources == Resources(cpus=1)


class Four(Stage):
    name = "four"
    resources = Resources(cpus=4)

    def process(self, batch: pa.Table) -> pa.Table:
        return batch


def _planned(monkeypatch, tasks: int, concurrency) -> dict:
    """What `run_tasks` hands Ray Data's map_batches (stopped there)."""
    import ray

    from rexeval.pipelines.core import runtime

    captured = {}

    class Planned(Exception):
        pass

    def capture(self, fn, **kwargs):
        captured.update(kwargs, fn=fn)
        raise Planned

    monkeypatch.setattr(ray.data.Dataset, "map_batches", capture)
    with pytest.raises(Planned):
        list(runtime.run_tasks([{"shard": i} for i in range(tasks)], Four(), concurrency))
    return captured


def test_a_sharded_stage_on_a_cold_cluster_is_a_pool_of_1_to_8(ray_session, unread_cluster, monkeypatch):
    """12 shards, workers=8, 4 CPUs each, joined to a cluster: an actor pool that starts
    at one actor and may grow to eight, each asking for 4 CPUs; one shard runs as a task."""
    got = _planned(monkeypatch, 12, pool_size(8, 12))
    strategy = got["compute"]
    assert (strategy.min_size, strategy.max_size, strategy.initial_size) == (1, 8, 1)
    assert got["num_cpus"] == 4
    assert type(_planned(monkeypatch, 1, pool_size(8, 1))["compute"]).__name__ == "TaskPoolStrategy"


def test_on_this_machine_a_pool_starts_as_many_as_it_holds(ray_session, monkeypatch):
    """A Ray started here (the tests' 2 CPUs) is one machine: the default share is its
    CPUs, and a growing pool starts the actors it holds at once, as laptop runs did."""
    from rexeval.pipelines.core.stage import fits_machine, machine_cpus

    assert machine_cpus() == 2.0
    assert worker_resources(SimpleNamespace(workers=1, cpus_per_worker=None, gpus_per_worker=0)).cpus == 2.0
    assert worker_resources(SimpleNamespace(workers=2, cpus_per_worker=None, gpus_per_worker=0)).cpus == 1.0
    assert fits_machine(Resources(cpus=1)) == 2 and fits_machine(Resources(cpus=4)) == 1

    monkeypatch.setattr(Four, "resources", Resources(cpus=1))
    strategy = _planned(monkeypatch, 6, pool_size(4, 6))["compute"]
    assert (strategy.min_size, strategy.max_size, strategy.initial_size) == (1, 4, 2)
    assert type(_planned(monkeypatch, 2, pool_size(4, 2))["compute"]).__name__ == "TaskPoolStrategy"


@pytest.mark.slow
def test_a_process_that_joins_this_machines_ray_sizes_by_the_machine(ray_session):
    """A local study's steps are processes joined to the Ray the study started here:
    they inherit its mark and share the machine; one told nothing takes it for a cluster."""
    import ray

    from rexeval.pipelines.core.stage import ONE_MACHINE_ENV

    assert ONE_MACHINE_ENV == ONE_MACHINE
    address = ray.get_runtime_context().gcs_address
    code = ("from rexeval.pipelines.core.runtime import init_ray\n"
            f"init_ray(address={address!r})\n"
            "from rexeval.pipelines.core.stage import machine_cpus\n"
            "print('cpus', machine_cpus())\n")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "cpus 2.0" in out.stdout, out.stderr[-2000:]
    env.pop(ONE_MACHINE)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "cpus None" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("cap,threads", [(None, 2), ("1", 1)])
@pytest.mark.parametrize("torch_first", [False, True])
def test_an_actor_gets_its_cpus_as_torch_threads_and_imports_no_torch_for_it(torch_first, cap, threads):
    """`use_cpus` in a fresh process: torch gets the actor's CPUs as threads whether it
    was loaded before (set at once) or loads after (through OMP_NUM_THREADS, as Ray
    sets it to 1 for a worker), no more than REXEVAL_MAX_THREADS where that is set; a
    process that never loads torch does not import it."""
    code = f"""
import json, os, sys
os.environ["OMP_NUM_THREADS"] = "1"  # what Ray gives a worker
if {torch_first}:
    import torch
from rexeval.pipelines.core.stage import Resources, use_cpus
use_cpus(Resources(cpus=2))
loaded = "torch" in sys.modules
import torch
print(json.dumps({{"loaded": loaded, "threads": torch.get_num_threads()}}))
"""
    env = {k: v for k, v in os.environ.items() if k != MAX_THREADS_ENV}  # the test session's own cap
    if cap:
        env[MAX_THREADS_ENV] = cap
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"loaded": torch_first, "threads": threads}
