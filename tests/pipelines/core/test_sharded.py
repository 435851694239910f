"""The sharded-job driver (pipelines/core/sharded.py) and actor sizing (core/stage.py):
only the shards still to do run, each is reported, the manifest sums them; sizes follow
the CPUs and the settings."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from rexeval.pipelines.core import stage as stage_module
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Resources, Stage, actor_count, pool_size, worker_resources


class SquareStage(Stage):
    """Writes shard i as one row holding i * i (runs in Ray actors)."""

    batch_size = 1

    def __init__(self, output: ShardedOutput):
        self.output = output

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            self.output.write_shard(shard, {"values": pa.table({"x": [shard * shard]})}, {"rows": 1})
            rows.append({"shard": shard, "rows": 1})
        return pa.Table.from_pylist(rows)


def _output(root, config=None):
    return ShardedOutput(root, "squares", config or {"power": 2}, ["values"])


@pytest.mark.slow
def test_a_resumed_job_runs_only_the_missing_shards(tmp_path, ray_session):
    earlier = _output(tmp_path).open()
    for shard in (0, 2):  # a run killed after two shards
        earlier.write_shard(shard, {"values": pa.table({"x": [shard * shard]})}, {"rows": 1})
    lines: list[str] = []
    job = ShardedJob(_output(tmp_path), 5, progress=lines.append)
    assert job.todo == [1, 3, 4] and sorted(job.done) == [0, 2] and not job.complete
    job.say_resumed()
    assert lines == ["  resuming: 2 of 5 shard(s) already done"]
    rows = job.run(SquareStage(job.output), workers=2,
                   report=lambda row, k, n: f"shard {row['shard']} ({k}/{n})")
    assert sorted(r["shard"] for r in rows) == [1, 3, 4]
    assert lines[1:] == [f"shard {r['shard']} ({k}/3)" for k, r in enumerate(rows, 1)]
    manifest = job.finish(note="done")
    assert manifest["status"] == "complete" and manifest["counts"] == {"rows": 5}
    assert manifest["shards"] == 5 and manifest["note"] == "done"
    assert sorted(job.output.read("values").column("x").to_pylist()) == [0, 1, 4, 9, 16]

    again = ShardedJob(_output(tmp_path), 5, progress=lines.append)
    assert again.complete and again.todo == [] and again.run(SquareStage(again.output)) == []


def test_another_configuration_is_refused_unless_overwritten(tmp_path):
    ShardedJob(_output(tmp_path), 1).output.write_shard(0, {"values": pa.table({"x": [0]})}, {"rows": 1})
    with pytest.raises(FileExistsError, match="different 'squares' config"):
        ShardedJob(_output(tmp_path, {"power": 3}), 1)
    fresh = ShardedJob(_output(tmp_path, {"power": 3}), 1, overwrite=True)
    assert fresh.todo == [0] and fresh.done == {}


def test_skipped_shards_are_not_run(tmp_path):
    job = ShardedJob(_output(tmp_path), 4, skip={1, 2})
    assert job.todo == [0, 3]


def test_actor_count_follows_workers_tasks_and_the_machines_cpus(monkeypatch):
    """On one machine of 8 CPUs (a Ray started here): what the settings say, else what
    it holds. (It was "the cluster's CPUs" before issue 47: a cluster is not read now,
    test_stage.py covers that.)"""
    monkeypatch.setattr(stage_module, "machine_cpus", lambda free=False: 8.0 if not free else 0.0)
    assert actor_count(3, 10) == 3 and actor_count(3, 2) == 2 and actor_count(3, 0) == 1
    assert actor_count(None, 10, Resources(cpus=2)) == 4  # 8 CPUs at 2 each, busy or not
    assert actor_count(None, 3, Resources(cpus=0.5)) == 3  # never more than the tasks
    assert actor_count(None, 10, Resources(cpus=1, gpus=1)) == 1  # a GPU stage: one actor
    assert actor_count(None, None, Resources(cpus=16)) == 1  # at least one


def test_a_pool_grows_from_its_least_to_the_workers(monkeypatch):
    """Autoscaler-friendly sizing: nothing is counted at start (a cluster that has no CPU
    free now, or no GPU node yet, still gets a pool that grows as nodes come). `workers`
    is the most (it was a fixed pool before issue 47); `least` (min_workers) the fewest,
    and equal to the workers it asks for a fixed pool."""
    monkeypatch.setattr(stage_module, "machine_cpus", lambda free=False: 0.0)
    assert pool_size(None, 12) == (1, 12) and pool_size(None) == (1, None)
    assert pool_size(3, 12) == (1, 3) and pool_size(3, 2) == (1, 2) and pool_size(0, 5) == (1, 1)
    assert pool_size(3, 12, 3) == (3, 3) and pool_size(3, 2, 3) == (2, 2) and pool_size(None, 4, 2) == (2, 4)


def test_a_sharded_job_plans_a_growing_pool_and_a_gpu_stage_asks_for_its_gpu(ray_session, monkeypatch):
    """What Ray Data is asked for: an autoscaling actor pool (min 1, max one per shard),
    and a GPU stage's num_gpus, even on a cluster with no GPU now (the autoscaler's cue)."""
    import ray

    from rexeval.pipelines.core import runtime

    captured = {}

    class Planned(Exception):
        pass

    def capture(ds, fn, **kwargs):
        captured.update(kwargs)
        raise Planned

    monkeypatch.setattr(ray.data.Dataset, "map_batches", lambda self, fn, **kw: capture(self, fn, **kw))

    class GpuStage(Stage):
        name = "gpu"
        resources = Resources(cpus=1, gpus=1)

        def process(self, batch):
            return batch

    with pytest.raises(Planned):
        list(runtime.run_tasks([{"shard": i} for i in range(5)], GpuStage(), pool_size(None, 5)))
    assert captured["num_gpus"] == 1
    strategy = captured["compute"]
    assert (strategy.min_size, strategy.max_size) == (1, 5)


def test_worker_resources_share_the_machines_cpus_unless_told(monkeypatch):
    seen = []
    monkeypatch.setattr(stage_module, "machine_cpus", lambda free=False: seen.append(free) or 8.0)
    cfg = SimpleNamespace(workers=3, cpus_per_worker=None, gpus_per_worker=0.5)
    assert worker_resources(cfg) == Resources(cpus=2.0, gpus=0.5) and seen == [False]
    assert worker_resources(cfg, free=True) == Resources(cpus=2.0, gpus=0.5) and seen[-1] is True
    assert worker_resources(SimpleNamespace(workers=16, cpus_per_worker=None, gpus_per_worker=0)).cpus == 1.0
    assert worker_resources(SimpleNamespace(workers=3, cpus_per_worker=1.5, gpus_per_worker=0)) == \
        Resources(cpus=1.5, gpus=0)


def test_an_actor_on_a_cluster_asks_for_one_cpu_unless_told(monkeypatch):
    """A cluster (joined by address) is not measured: with no `cpus_per_worker` an actor
    asks for one CPU, which every node type holds. (Before issue 47 this shared the
    cluster's CPUs, capped at its largest node: a cold cluster gave one CPU anyway.)"""
    monkeypatch.setattr(stage_module, "machine_cpus", lambda free=False: None)
    assert worker_resources(SimpleNamespace(workers=1, cpus_per_worker=None, gpus_per_worker=0)).cpus == 1.0
    assert worker_resources(SimpleNamespace(workers=4, cpus_per_worker=None, gpus_per_worker=0)).cpus == 1.0
    assert worker_resources(SimpleNamespace(workers=4, cpus_per_worker=6, gpus_per_worker=0)).cpus == 6


def test_every_job_prints_one_shape_of_shard_line():
    from rexeval.pipelines.core.sharded import shard_line

    assert shard_line(3, 1, 4) == "  shard 3 done (1/4)"
    assert shard_line(3, 1, 4, "in=5 out=4", cached=2) == "  shard 3 done (1/4): in=5 out=4, 2 cached"
    assert shard_line(0, 1, 4, "bad column", verb="failed") == "  shard 0 failed (1/4): bad column"
    assert shard_line("2/5", 1, 4, unit="chunk", label="likert", elapsed=12.4, indent="    ") == (
        "    likert: chunk 2/5 done (1/4, 12s)")
    assert shard_line(1, 2, 2, "7 texts", label="embeddings", cached=0) == "  embeddings: shard 1 done (2/2): 7 texts"
