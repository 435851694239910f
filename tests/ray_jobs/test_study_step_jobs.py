"""A study's steps as Ray jobs whose drivers run on a worker node, not on the head
(issue 47, "drivers off the head").

The cluster (tests/doubles/local_cluster.py): a head with one CPU, and a worker node
that offers a custom resource. `rexeval study run --steps-as job` is submitted as a
user submits it (`ray job submit --working-dir`); its driver runs on the head, as a job
without entrypoint resources does, and submits each step as a Ray job of its own whose
driver asks for the worker's resource (`driver_resources` in the study file). Each
step's driver ran on the worker node (Ray's job info says so, and so does the state
file), and the tables equal those of the same study run with its steps as processes
of one driver.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from rexeval.pipelines.core.io import read_parquet
from rexeval.storage import location
from tests.doubles.local_cluster import can_isolate, local_cluster

# The worker node runs in namespaces of its own (`hide=[]`: it sees every folder but the
# head's temp dirs), as another machine would: a driver started on a worker that shares
# the head's process table finds the head's raylet, and its job's log is read there.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not can_isolate(), reason="this machine cannot start a node in its own namespaces")]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "pipelines" / "sample"
DRIVER = "rexeval_step_driver"  # what the worker node offers and only step drivers ask for
JOB_TIMEOUT_S = 120


def study(name: str) -> dict:
    """The sample's reviews ingested: the smallest study there is, its input named by an
    absolute path (as it is on every node here)."""
    return {"name": name, "driver_resources": {"num_cpus": 1, "resources": {DRIVER: 1}},
            "datasets": {"sample": {"inputs": [str(SAMPLE / "reviews.jsonl")], "meta": [str(SAMPLE / "items.jsonl")]}},
            "steps": {"ingest": {"job": "ingest", "with": {"inputs": "{dataset.inputs}", "meta": "{dataset.meta}"}}}}


def tables(root: Path) -> dict[str, pa.Table]:
    """Every Parquet file of the study's steps, by its path under the study's folder."""
    here = location(root)
    return {f.relative_to(here): read_parquet(f) for f in here.walk_files()
            if f.suffix == ".parquet" and not f.relative_to(here).startswith(("_step_jobs/", "logs/"))}


def test_step_drivers_run_as_ray_jobs_on_the_worker_node(tmp_path, ray_session, monkeypatch):
    from rexeval.pipelines.study.config import load_study
    from rexeval.pipelines.study.plan import build_plan
    from rexeval.pipelines.study.runner import run_study

    # The reference: the same study, its steps as processes of one driver (this session's
    # Ray), run outside the checkout as the submitted one is (input paths stay absolute).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.yaml").write_text(yaml.safe_dump(study("here")))
    here = tmp_path / "here"
    res = run_study(build_plan(load_study(tmp_path / "here.yaml"), tmp_path / "here.yaml", here),
                    progress=lambda _: None, steps_as="process")
    assert res["failed"] == {} and res["ran"] == ["ingest@sample"]

    work = tmp_path / "submitted"  # what the submission uploads: the study file alone
    work.mkdir()
    (work / "study.yaml").write_text(yaml.safe_dump(study("there")))
    there = tmp_path / "there"
    with local_cluster(head_cpus=1, worker_cpus=(2,), worker_resources={DRIVER: 2}, hide=[]) as cluster:
        sid = cluster.submit("rexeval", "study", "run", "study.yaml", "--out", str(there), "--steps-as", "job",
                             cwd=work, runtime_env_json=json.dumps({"env_vars": {"REXEVAL_TEST": "1"}}))
        info, logs = cluster.wait_job(sid, JOB_TIMEOUT_S)
        assert info.status == "SUCCEEDED", f"{info.message}\n{logs[-6000:]}"
        head, worker = cluster.node_id(cluster.head), cluster.node_id(cluster.nodes[1])
        assert info.driver_node_id == head  # the study's own driver: on the head, as submitted
        assert "steps run as Ray jobs" in logs, logs[-3000:]
        state = json.loads((there / "study.json").read_text())["steps"]
        client = cluster.job_client()
        for key in ("ingest@sample",):
            rec = state[key]
            assert rec["status"] == "complete" and rec["node"] == worker, rec
            job = client.get_job_info(rec["ray_job"])
            assert job.driver_node_id == worker, job
            assert job.runtime_env.get("working_dir", "").startswith("gcs://"), job.runtime_env  # the study's
            said = f"on node {worker}: step {key}"  # the job's first progress line
            assert said in logs and said in (there / "logs" / f"{key}.log").read_text()  # the study's, the step's

    assert sorted(tables(there)) == sorted(tables(here)) and tables(here)
    for name, table in tables(here).items():
        assert tables(there)[name].equals(table), name
    mine = json.loads((here / "study.json").read_text())["steps"]
    assert {k: counted(v["summary"]) for k, v in state.items()} == {k: counted(v["summary"]) for k, v in mine.items()}


def counted(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("elapsed_s", "seconds")}
