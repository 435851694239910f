"""rexeval on a cluster whose nodes share no disk (issue "rexeval on a real cluster").

The cluster: a head and a worker node started with `ray start` on this machine, the
worker in mount and PID namespaces of its own (tests/doubles/local_cluster.py `hide=`), where
the cluster's temp dirs (the head's session, logs and unpacked working dir) and this
module's run folder are empty tmpfs mounts. Storage every node reaches is an S3 endpoint
on 127.0.0.1 (moto, tests/doubles/s3.py), named by the standard AWS variables that the
raylets, and so every worker and driver, inherit.

What is pinned:
  * `rexeval study run studies/local.yaml --out s3://...`, submitted with `ray job
    submit` as a user submits it and killed half-way, then submitted again with its
    driver on the worker node (`--entrypoint-resources`), resumes from the state and the
    markers in the bucket and finishes with every table identical to the same study run
    on one node into a local folder, with work done on both nodes;
  * a local `--out` that the worker node cannot see is refused before any step runs,
    naming the path and saying to use a URI or a shared mount;
  * the isolation itself: a file the head writes in the run folder is not on the worker
    node, and a file the worker writes there is not on the head, so a job that wrote its
    data with pathlib instead of the storage module would lose it here as it would on a
    real cluster.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pytest

from rexeval.pipelines.core.io import read_parquet
from rexeval.storage import location
from tests.doubles.local_cluster import can_isolate, local_cluster, wait_for
from tests.doubles.s3 import fresh_prefix
from tests.conftest import SHARED
from tests.ray_jobs.test_job_submit import REPO, RUNTIME_ENV_EXCLUDES

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not can_isolate(), reason="this machine cannot start a node in its own mount namespace")]

LLM_REVIEWS = 1  # sample reviews the local LLM extracts triplets from (as the local-study test)
JOB_TIMEOUT_S = 300
DRIVER_HERE = {"rexeval_driver_here": 1}  # what the worker node offers: a re-run's driver asks for it


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    """The folder the head writes locally (the one-node reference run, job scripts); the
    worker node sees it empty."""
    return tmp_path_factory.mktemp("run")


@pytest.fixture(scope="module")
def cluster(s3_env, run_root, shared_csv):
    """A head (2 CPUs) and a worker node (2 CPUs) that shares no disk with it."""
    env = {**s3_env, "REXEVAL_SHARED": str(shared_csv.parents[1])}
    with local_cluster(head_cpus=2, worker_cpus=(2,), env=env, hide=[run_root], worker_resources=DRIVER_HERE) as c:
        yield c


def runtime_env(extra: dict[str, str] | None = None) -> str:
    # Steps as processes of the study's driver: this test is about resuming on a node that
    # shares no disk; step drivers as Ray jobs are tests/ray_jobs/test_study_step_jobs.py's.
    return json.dumps({"excludes": RUNTIME_ENV_EXCLUDES, "env_vars": {
        "REXEVAL_SHARED": str(SHARED), "REXEVAL_STEPS_AS": "process",
        **(extra or {})}})


NOT_COUNTS = {"elapsed_s", "seconds", "llm_calls", "cached_calls", "prompt_tokens", "completion_tokens"}


def counted(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in NOT_COUNTS}


def killed(out: str, step_dir: str, shard: int, step: str) -> None:
    """What a driver killed while `step` wrote `shard` leaves: that shard's files and
    marker not written, the job's manifest still running, the study's state "running"."""
    folder = location(out) / step_dir
    for f in folder.walk_files():
        if f.name == f"part-{shard:05d}.parquet" or f.relative_to(folder) == f"_done/part-{shard:05d}.json":
            f.unlink()
    manifest = (folder / "manifest.json").read_json()
    (folder / "manifest.json").write_json({**manifest, "status": "running", "counts": {}})
    state = (location(out) / "study.json").read_json()
    state["steps"][step]["status"] = "running"
    (location(out) / "study.json").write_json(state)


def worker_node_id(cluster) -> str:
    return cluster.node_id(cluster.nodes[1])


INPUT_FILE = re.compile(r"(?:/[^\s/]+)+/([^\s/]+\.(?:jsonl|csv|json|parquet|gz))")


def tables_of(root) -> dict[str, pa.Table]:
    """Every Parquet file under a study folder by its path there, with the input files
    named in `source` and `message` (where a review came from, what it duplicates) cut
    to the file's name: the cluster run reads the sample files from its unpacked working
    dir, the local run from the checkout."""
    root = location(root)
    out = {}
    for f in root.walk_files():
        if f.suffix != ".parquet":
            continue
        t = read_parquet(f)
        for col in ("source", "message"):
            if col in t.column_names and pa.types.is_string(t.schema.field(col).type):
                cut = [None if v is None else INPUT_FILE.sub(r"\1", v) for v in t.column(col).to_pylist()]
                t = t.set_column(t.column_names.index(col), t.schema.field(col), pa.array(cut, pa.string()))
        out[f.relative_to(root)] = t
    return out


@pytest.fixture(scope="module")
def local_run(run_root, shared_csv, ray_session):
    """The reference: the same study on one node (the session's Ray), into a local folder."""
    from rexeval.pipelines.study.config import load_study
    from rexeval.pipelines.study.plan import build_plan
    from rexeval.pipelines.study.runner import run_study

    old = os.environ.get("REXEVAL_SHARED")
    os.environ["REXEVAL_SHARED"] = str(shared_csv.parents[1])
    try:
        f = REPO / "studies" / "local.yaml"
        out = run_root / "local"
        result = run_study(build_plan(load_study(f, {"llm_reviews": LLM_REVIEWS}), f, out),
                           progress=lambda _: None)
    finally:
        if old is None:
            os.environ.pop("REXEVAL_SHARED", None)
        else:
            os.environ["REXEVAL_SHARED"] = old
    assert result["failed"] == {} and result["skipped"] == {}
    return out


def test_the_local_study_on_one_node_then_has_nothing_to_do_and_reports(local_run, shared_csv, monkeypatch):
    """studies/local.yaml as a user runs it on a laptop (the sample and the shared
    reviews, the local profile), with one review for the local LLM instead of four: every
    step ran, a second run does nothing, the report has its tables."""
    from rexeval.pipelines.study.config import load_study
    from rexeval.pipelines.study.plan import build_plan
    from rexeval.pipelines.study.report import build_report, write_report
    from rexeval.pipelines.study.runner import run_study

    monkeypatch.setenv("REXEVAL_SHARED", str(shared_csv.parents[1]))
    f = REPO / "studies" / "local.yaml"
    state = json.loads((local_run / "study.json").read_text())["steps"]
    assert len(state) == 12 and all(s["status"] == "complete" for s in state.values())
    assert state["ingest@mi"]["summary"]["in"] == 5050 and state["truth@sample"]["summary"]["out"] > 0
    lines: list[str] = []
    again = run_study(build_plan(load_study(f, {"llm_reviews": LLM_REVIEWS}), f, local_run), progress=lines.append)
    assert again["ran"] == [] and any("nothing to do" in line for line in lines)
    paths = write_report(build_report(local_run), local_run.parent / "local-report")
    md = paths["md"].read_text()
    assert "Table II" in md and "Table 3" in md and "| mi |" in md


def same_table(a: pa.Table, b: pa.Table) -> bool:
    """Equal tables; a float-vector column (the embedding work files) equal to float32's
    rounding: a CPU matmul's last bits follow the threads the BLAS happened to split it
    over (two nodes against one, a loaded machine), the vectors' meaning does not."""
    if a.equals(b):
        return True
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    import numpy as np

    for name in a.column_names:
        x, y = a.column(name), b.column(name)
        if x.equals(y):
            continue
        if not (pa.types.is_list(x.type) or pa.types.is_fixed_size_list(x.type)) \
                or not pa.types.is_floating(x.type.value_type):
            return False
        u, v = (np.asarray(c.combine_chunks().flatten(), dtype=np.float64) for c in (x, y))
        if u.shape != v.shape or not np.allclose(u, v, rtol=1e-4, atol=1e-5):
            return False
    return True


def test_the_worker_node_sees_none_of_the_heads_files(cluster, run_root):
    """The isolation the other tests rely on: a pathlib write on one node is not on the other."""
    (run_root / "from_head.txt").write_text("head")
    script = run_root / "look.py"
    script.write_text(
        "import os, ray\n"
        "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On\n"
        "ray.init()\n"
        "@ray.remote(num_cpus=0)\n"
        "def look(write):\n"
        f"    if write: open({str(run_root / 'from_worker.txt')!r}, 'w').write('worker')\n"
        f"    return sorted(os.listdir({str(run_root)!r}))\n"
        f"print('WORKER', ray.get(look.options(scheduling_strategy=On({worker_node_id(cluster)!r}, soft=False)).remote(True)))\n")
    # Run on the head as a driver of the cluster (not submitted: the script is a local file).
    import subprocess
    import sys

    res = subprocess.run([sys.executable, str(script)], env={**cluster.env, "RAY_ADDRESS": cluster.gcs_address},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "WORKER ['from_worker.txt']" in res.stdout  # the head's files are not there ...
    assert not (run_root / "from_worker.txt").exists()  # ... and the worker's write stays there


def step_status(out: str) -> dict[str, str]:
    """Each started step instance's status in the study's state in the bucket."""
    f = location(out) / "study.json"
    return {k: v["status"] for k, v in f.read_json()["steps"].items()} if f.exists() else {}


def test_the_local_study_on_s3_killed_on_the_head_finishes_from_the_worker_with_one_node_tables(cluster, local_run):
    """`rexeval study run studies/local.yaml --out s3://...` submitted as a user submits
    it, its driver on the head killed half-way (`ray job stop`), then the same command
    submitted again with its driver on the worker node, which never saw the head's disk:
    it resumes from the state and the markers in the bucket, and every table is identical
    to the study run on one node into a local folder."""
    out = fresh_prefix() + "/study-local"
    command = ("rexeval", "study", "run", "studies/local.yaml", "--out", out, "--set", f"llm_reviews={LLM_REVIEWS}")
    first = cluster.submit(*command, cwd=REPO, runtime_env_json=runtime_env())

    # Kill the driver once both datasets are ingested and steps are still to come
    # (`ray job stop`: SIGTERM, then SIGKILL, to the driver's whole process group).
    def mid_way() -> dict[str, str] | None:
        status = step_status(out)
        ingested = status.get("ingest@sample") == status.get("ingest@mi") == "complete"
        return status if ingested or cluster.job_client().get_job_status(first).is_terminal() else None

    at_kill = wait_for(mid_way, JOB_TIMEOUT_S, "the study to ingest both datasets", every=0.5)
    stopped = cluster.ray("job", "stop", "--address", cluster.dashboard_url, first)
    info, logs = cluster.wait_job(first, 60)
    assert info.status == "STOPPED", f"the study was not killed half-way ({info.status}, {stopped.stdout}):\n" \
                                     f"{logs[-4000:]}"
    complete = sorted(k for k, v in step_status(out).items() if v == "complete")
    assert len(complete) < 12, f"the study had finished when it was killed: {at_kill}"
    # ... and a shard of a finished step lost its marker (killed between its files and
    # its marker): that step must redo this shard only.
    killed(out, "sample/ingest", shard=1, step="ingest@sample")

    again = cluster.submit(*command, cwd=REPO, runtime_env_json=runtime_env(), entrypoint_resources=DRIVER_HERE)
    try:
        info, logs = cluster.wait_job(again, JOB_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"the re-run did not end in {JOB_TIMEOUT_S}s; its log:\n"
                    f"{cluster.job_client().get_job_logs(again)[-8000:]}")
    assert info.status == "SUCCEEDED", f"{info.message}\n{logs[-6000:]}"
    worker = worker_node_id(cluster)
    assert info.driver_node_id == worker, "the re-run's driver did not run on the worker node"
    assert "1 of 2 chunk(s) already done" in logs, logs[-4000:]  # ingest@sample: from its markers
    rerun = re.search(r"(\d+) to run, (\d+) not", logs)
    assert rerun and int(rerun.group(2)) >= 1, logs[-4000:]  # ingest@mi at least: from the state

    # Every table identical to the local run's, and nothing missing on either side.
    here, there = tables_of(local_run), tables_of(out)
    assert sorted(there) == sorted(here)
    differ = [str(name) for name, table in here.items() if not same_table(there[name], table)]
    assert not differ, differ
    for stats in sorted(f.relative_to(local_run) for f in location(local_run).walk_files() if f.name == "table2.md"):
        assert (location(out) / stats).read_text() == (location(local_run) / stats).read_text()
    state = (location(out) / "study.json").read_json()
    assert state["out"] == out and all(s["status"] == "complete" for s in state["steps"].values()), state["steps"]
    # The counts every job summed from its shards' markers: the same (LLM calls and
    # timings aside: the local run's cache may answer what the cluster run asks).
    local_state = json.loads((local_run / "study.json").read_text())["steps"]
    assert {k: counted(v["summary"]) for k, v in state["steps"].items()} == \
        {k: counted(v["summary"]) for k, v in local_state.items()}
    assert all((location(out) / "logs").glob("*.log")), "the steps' logs are not under the out URI"
    # Ray tasks of the study ran on both nodes.
    nodes = {t.get("node_id") for t in cluster.state("tasks") if t.get("state") == "FINISHED"} - {None}
    assert nodes == {worker, cluster.node_id(cluster.head)}, nodes


def test_a_local_out_the_worker_cannot_see_is_refused_at_once(cluster, run_root):
    out = run_root / "study-local-disk"
    submission = cluster.submit("rexeval", "study", "run", "studies/local.yaml", "--out", str(out),
                                cwd=REPO, runtime_env_json=runtime_env())
    info, logs = cluster.wait_job(submission, 120)
    assert info.status == "FAILED"
    assert str(out) in logs and "URI" in logs, logs[-3000:]
    assert not any(out.rglob("*.parquet")), "the study started before refusing its output folder"
