"""A stage runs the same on a plain table and inside a Ray Data actor pool; a task that
reads a local input runs where the file is."""
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
import pyarrow.compute as pc

from rexeval.failures import WorkerFailed
from rexeval.pipelines.core.runtime import map_stage, reads_here, run_tasks
from rexeval.pipelines.core.stage import Resources, Stage


class Upper(Stage):
    name = "upper"
    resources = Resources(cpus=0.5)
    batch_size = 4

    def setup(self):
        self.loaded = getattr(self, "loaded", 0) + 1  # once per actor

    def process(self, batch):
        return batch.append_column("upper", pc.utf8_upper(batch.column("text"))) \
                    .append_column("setups", pa.array([self.loaded] * batch.num_rows))


def test_stage_runs_on_a_plain_table():
    s = Upper()
    s.setup()
    out = s(pa.table({"text": ["ab", "c"]}))
    assert out.column("upper").to_pylist() == ["AB", "C"]


def test_stage_runs_in_an_actor_pool(ray_session):
    import ray

    ds = ray.data.from_items([{"text": f"w{i}"} for i in range(20)], override_num_blocks=4)
    rows = map_stage(ds, Upper(), concurrency=2).take_all()
    assert sorted(r["upper"] for r in rows) == sorted(f"W{i}" for i in range(20))
    assert {r["setups"] for r in rows} == {1}  # setup ran once per actor, not per batch


@pytest.mark.slow
def test_run_tasks_yields_one_row_per_task(ray_session):
    class Count(Stage):
        batch_size = 1

        def process(self, batch):
            return pa.table({"shard": batch.column("shard"), "double": pc.multiply(batch.column("shard"), 2)})

    rows = list(run_tasks([{"shard": i} for i in range(5)], Count(), concurrency=2))
    assert sorted((r["shard"], r["double"]) for r in rows) == [(i, 2 * i) for i in range(5)]
    assert list(run_tasks([], Count())) == []


class Setups(Stage):
    """Each shard row says how many times its worker's copy of the stage was set up."""
    batch_size = 1

    def setup(self):
        self.setups = getattr(self, "setups", 0) + 1

    def process(self, batch):
        return pa.table({"shard": batch.column("shard"), "setups": pa.array([self.setups] * batch.num_rows)})


class CannotLoad(Setups):
    def setup(self):
        raise FileNotFoundError("no model at /nowhere/model.bin")


@pytest.mark.slow
def test_run_tasks_sets_the_stage_up_once_per_shard_as_tasks_or_actors(ray_session):
    # two shards, two workers: Ray tasks, one set-up each
    rows = list(run_tasks([{"shard": i} for i in range(2)], Setups(), concurrency=2))
    assert sorted(r["shard"] for r in rows) == [0, 1] and {r["setups"] for r in rows} == {1}
    # four shards, one worker: one actor, set up once for all four
    rows = list(run_tasks([{"shard": i} for i in range(4)], Setups(), concurrency=1))
    assert sorted(r["shard"] for r in rows) == [0, 1, 2, 3] and {r["setups"] for r in rows} == {1}


@pytest.mark.slow
@pytest.mark.parametrize("shards, workers", [(2, 2), (3, 1)], ids=["tasks", "actors"])
def test_a_worker_that_cannot_set_up_is_one_line(ray_session, shards, workers):
    with pytest.raises(WorkerFailed) as caught:
        list(run_tasks([{"shard": i} for i in range(shards)], CannotLoad(), concurrency=workers))
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.endswith("FileNotFoundError: no model at /nowhere/model.bin"), message


def test_custom_resources_from_the_settings_reach_the_stages_ray_options():
    """`resources_per_worker` (e.g. {accel: 1}, a node type of the cluster's own) is what an
    actor pool's map_batches asks Ray for, beside its CPUs: what makes an autoscaler start
    that type, and what keeps the actors off the other nodes."""
    from types import SimpleNamespace

    from rexeval.pipelines.core.runtime import _batch_args
    from rexeval.pipelines.core.stage import Resources, Stage, worker_resources

    cfg = SimpleNamespace(workers=2, cpus_per_worker=1.0, gpus_per_worker=0.0, resources_per_worker={"accel": 1})
    res = worker_resources(cfg)
    assert res == Resources(cpus=1.0, gpus=0.0, custom=(("accel", 1),))

    class Accel(Stage):
        resources = res

        def process(self, batch):
            return batch

    args = _batch_args(Accel())
    assert args["num_cpus"] == 1.0 and args["resources"] == {"accel": 1}
    plain = SimpleNamespace(workers=2, cpus_per_worker=1.0, gpus_per_worker=0.0)
    assert "resources" not in _batch_args(type("P", (Accel,), {"resources": worker_resources(plain)})())


def test_a_task_reading_a_local_path_is_pinned_to_the_drivers_node(ray_session, tmp_path):
    ray = ray_session
    here = ray.get_runtime_context().get_node_id()
    assert reads_here(["s3://bucket/a.json", "gs://bucket/b.json"]) == {}
    for paths in ([str(tmp_path / "a.json")], ["s3://bucket/a.json", tmp_path / "b.json"]):
        strategy = reads_here(paths)["scheduling_strategy"]
        assert strategy.node_id == here and strategy.soft is False

    @ray.remote(num_cpus=1)
    def node() -> str:
        return ray.get_runtime_context().get_node_id()

    assert ray.get(node.options(**reads_here([tmp_path])).remote()) == here


def test_a_driver_node_without_cpus_is_said_at_once(ray_session, monkeypatch):
    ray = ray_session
    here = ray.get_runtime_context().get_node_id()
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": here, "Resources": {"memory": 1.0}}])
    with pytest.raises(ValueError, match=r"reviews\.json is a local path.*s3://"):
        reads_here(["reviews.json"])
    assert reads_here(["s3://bucket/reviews.json"]) == {}


class _Started(Exception):
    """Raised by the stand-in for `ray.init`: what init_ray would start Ray with is recorded."""


@pytest.fixture
def local_start(monkeypatch) -> list[dict]:
    """`init_ray` up to the local `ray.init` call, which records its arguments and the
    process's environment (what the raylet, and so every worker, inherits) and raises
    `_Started`; the variables init_ray sets are restored after the test."""
    import ray

    seen: list[dict] = []

    def init(**kwargs):
        seen.append({**kwargs, "environ": dict(os.environ)})
        raise _Started

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", "."))  # restored after: init_ray sets it
    return seen


def test_a_local_rays_workers_sleep_while_they_wait_unless_the_user_said(local_start, monkeypatch):
    """A local Ray's workers get OMP_WAIT_POLICY=PASSIVE (spinning OpenMP threads of one
    job's actors starve the others' on a shared machine: benchmarks/bench_omp_wait.py),
    and a value the user exported instead."""
    from rexeval.pipelines.core import runtime

    for exported, want in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        if exported is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", exported)
        with pytest.raises(_Started):
            runtime.init_ray(num_cpus=1)
        # In the environment the raylet starts with, which its workers inherit.
        assert local_start[-1]["environ"]["OMP_WAIT_POLICY"] == want


def test_a_local_rays_workers_inherit_its_variables_without_a_runtime_env(ray_session):
    """A local Ray's workers get the checkout's PYTHONPATH, the OpenMP policy and the
    forwarded settings from the raylet's environment, not from a runtime env, which
    would start every worker through Ray's setup process: a third more CPU per worker
    (benchmarks/bench_worker_start.py)."""
    import rexeval

    ray = ray_session
    assert not ray.get_runtime_context().runtime_env  # the test session's local Ray

    @ray.remote(max_calls=1)
    def seen() -> dict:
        return {k: os.environ.get(k) for k in ("PYTHONPATH", "OMP_WAIT_POLICY", "HF_HUB_OFFLINE", "RAY_AUTH_MODE")}

    env = ray.get(seen.remote())
    assert env["PYTHONPATH"].split(os.pathsep)[0] == rexeval.SOURCE_ROOT
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["HF_HUB_OFFLINE"] == "1" and env["RAY_AUTH_MODE"] == "disabled"


def test_a_local_ray_keeps_idle_workers_for_the_next_operator_unless_the_user_said(local_start, monkeypatch):
    """A local Ray keeps at least 8 idle workers (Ray's default: as many as CPUs, so at 2
    CPUs it stopped and restarted workers between a job's operators), more on a bigger
    machine; RAY_num_workers_soft_limit exported by the user is left to Ray."""
    from rexeval.pipelines.core import runtime

    monkeypatch.delenv(runtime.SOFT_LIMIT_ENV, raising=False)
    for cpus, kept in ((2, 8), (32, 32)):
        with pytest.raises(_Started):
            runtime.init_ray(num_cpus=cpus)
        assert local_start[-1]["_system_config"] == {"num_workers_soft_limit": kept}
    monkeypatch.setenv(runtime.SOFT_LIMIT_ENV, "3")
    with pytest.raises(_Started):
        runtime.init_ray(num_cpus=2)
    assert "_system_config" not in local_start[-1]


def test_a_driver_joining_a_local_ray_passes_only_the_variables_its_workers_lack(monkeypatch):
    """A study's step (or a command beside it) joining the local Ray its parent started
    sends no runtime env when the cluster's workers already have its variables; one it
    changed, or any other cluster, still travels."""
    from rexeval.pipelines.core.runtime import LOCAL_RAY_ENV, beyond_local

    have = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": "/src"}
    monkeypatch.setenv(LOCAL_RAY_ENV, json.dumps({"address": "127.0.0.1:6379", "env": have}))
    same = {"env_vars": {"HF_HUB_OFFLINE": "1"}}
    assert beyond_local("127.0.0.1:6379", same) == {}
    assert beyond_local("127.0.0.1:6379", {"env_vars": {"HF_HUB_OFFLINE": "1", "HF_HOME": "/h"}}) == \
        {"env_vars": {"HF_HOME": "/h"}}
    assert beyond_local("127.0.0.1:6379", {"env_vars": {"HF_HUB_OFFLINE": "0"}}) == {"env_vars": {"HF_HUB_OFFLINE": "0"}}
    # Anything but variables (a working dir) always travels.
    assert beyond_local("127.0.0.1:6379", {"working_dir": "/w", **same}) == {"working_dir": "/w"}
    assert beyond_local("10.0.0.2:6379", same) == same  # a cluster this machine did not start
    monkeypatch.delenv(LOCAL_RAY_ENV)
    assert beyond_local("127.0.0.1:6379", same) == same


def test_the_raylets_worker_count_notice_goes_to_the_log_not_the_terminal(ray_session, capsys, caplog):
    """Every driver prints what the raylet publishes; a quiet driver (every rexeval
    command's) sends the "N worker processes have been started" notice, which a study's
    kept step drivers reach on purpose on 2 CPUs, to the `ray` logger, and still prints
    every other raylet line. The notice's text is the one CI printed in the demo."""
    import logging

    from ray._private import worker as ray_worker

    from rexeval.pipelines.core import runtime

    notice = ("WARNING: 8 PYTHON worker processes have been started on node: 676edf2b with address: "
              "192.0.2.2, which is 4x the maximum expected startup concurrency (2).")
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="ray"):
        ray_worker.print_to_stdstream({"lines": [notice], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert capsys.readouterr().out == ""
    assert any(runtime.POOL_SIZE_NOTICE in r.getMessage() for r in caplog.records)
    other = "The node ran low on memory: a worker was killed."
    ray_worker.print_to_stdstream({"lines": [other], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert other in capsys.readouterr().out
    # A job that stops its own Serve app: the controller's pending calls fail, killed on
    # purpose. The lines as `rexeval judge pairwise` printed them; in one message with
    # another line, only that other line prints.
    stopped = ["Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so the task "
               "will be retried. Error: The actor is dead because it was killed by `ray.kill`.",
               "Task ServeController.listen_for_change failed. There are infinite retries remaining, so the task "
               "will be retried. Error: The actor is dead because it was killed by `ray.kill`."]
    with caplog.at_level(logging.INFO, logger="ray"):
        ray_worker.print_to_stdstream({"lines": stopped, "pid": "raylet", "is_err": False}, ignore_prefix=False)
        assert capsys.readouterr().out == ""
        another = "The node ran low on disk: spilling objects."  # not `other`: Ray's dedup holds repeats back
        ray_worker.print_to_stdstream({"lines": [stopped[0], another], "pid": "raylet", "is_err": False},
                                      ignore_prefix=False)
    printed = capsys.readouterr().out
    assert another in printed and "graceful_shutdown" not in printed
    assert sum("graceful_shutdown" in r.getMessage() for r in caplog.records) == 2
    runtime.routine_raylet_lines_to_log()  # again: still one wrapper, not two
    assert getattr(ray_worker.print_to_stdstream, "_rexeval_quiet", False)


_SERVE_LATER = """
import logging
from rexeval.pipelines.core.runtime import quiet_serve_logger
quiet_serve_logger()
from ray import serve  # noqa: F401  (its import resets the logger's level and handlers)
log = logging.getLogger("ray.serve")
log.info("serve-info-line")
log.warning("serve-warning-line")
"""


def test_a_quiet_driver_keeps_serves_info_lines_off_the_terminal_when_serve_is_imported_after():
    """`rexeval judge pairwise` printed "INFO ... Started Serve in namespace" and "Application
    'rexeval-judge' is ready": init_ray set the logger's level, and the later import of
    ray.serve set it back to INFO. Serve's warnings still print."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[3])
    proc = subprocess.run([sys.executable, "-c", _SERVE_LATER], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = proc.stdout + proc.stderr
    assert "serve-warning-line" in shown and "serve-info-line" not in shown
