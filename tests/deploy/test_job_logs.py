"""On a cluster, what a job's workers print reaches `ray job logs`.

A submitted job's log is its driver's output; a worker's lines (a stage's warning, the
traceback of a failed actor) sit in log files on the worker's node unless the driver
asks Ray to forward them. rexeval's `init_ray` asks for that whenever it joins a cluster
(a submitted job always does: Ray sets RAY_ADDRESS for it), even in its default quiet
mode, which keeps a laptop's terminal to the job's own progress lines.
"""
from __future__ import annotations

import textwrap

import pytest

from tests.doubles.local_cluster import local_cluster

pytestmark = pytest.mark.slow

JOB = textwrap.dedent("""
    import sys
    from rexeval.pipelines.core.runtime import init_ray

    ray = init_ray()  # quiet, as every rexeval command calls it

    @ray.remote
    def stage():
        print("worker stdout: shard 3 done", flush=True)
        print("worker stderr: WARNING from a stage", file=sys.stderr, flush=True)
        return 1

    assert ray.get(stage.remote()) == 1
    print("driver: finished", flush=True)
""")


def test_worker_output_reaches_ray_job_logs(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    with local_cluster(head_cpus=1) as cluster:
        sid = cluster.submit("python", "job.py", cwd=tmp_path, runtime_env_json="{}")
        info, logs = cluster.wait_job(sid, 120)
    assert info.status == "SUCCEEDED", f"{info.status}: {info.message}\n{logs}"
    assert "driver: finished" in logs
    assert "worker stdout: shard 3 done" in logs, logs
    assert "worker stderr: WARNING from a stage" in logs, logs
