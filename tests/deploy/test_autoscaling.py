"""rexeval on an autoscaling cluster (issue 47): a study on S3 sized by its settings, its
step drivers on workers the autoscaler starts, the same tables as on one node.

The cluster is Ray's own autoscaler on this machine (tests/doubles/local_cluster.py
`autoscaling=`: the monitor with the fake multi-node provider that
`ray.cluster_utils.AutoscalingCluster` and Ray's own tests use), started cold:

  * the head offers 0 CPUs, as deploy/kuberay's heads do: nothing but the study's own
    light driver may run there;
  * a CPU worker type and an accelerator type (a custom `accel` resource standing for a
    GPU, which this machine has not), both at 0 nodes.

The study (ingest -> extract with the hf backend -> paraphrase clusters -> evaluate, the
inputs and `--out` in the moto S3 the suite runs) asks for the accelerator in its settings
(`resources_per_worker`) for its model actors, and 1 CPU per step driver. What is pinned:
the autoscaler adds nodes of both types as the steps ask, every step's driver runs on a
worker (a Ray job of its own), the tables equal the same study's on one node (the session's
Ray), and the workers are stopped again once the study is over (0 -> n -> 0).
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from rexeval.storage import location
from tests.doubles.local_cluster import local_cluster, wait_for
from tests.doubles.s3 import fresh_prefix
from tests.ray_jobs.test_no_shared_disk import tables_of

pytestmark = [pytest.mark.slow, pytest.mark.autoscaling]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "pipelines" / "sample"
WORKER_TYPES = {
    "cpu": {"resources": {"CPU": 2}, "max_workers": 2},
    # Two CPUs: a step's driver (1 CPU) may land there beside the model actor it starts.
    "accel": {"resources": {"CPU": 2, "accel": 1}, "max_workers": 1},
}
IDLE_S = 8  # a worker idle this long is stopped
STUDY_TIMEOUT_S = 300
ON_ACCEL = {"resources_per_worker": {"accel": 1}, "cpus_per_worker": 1}
ONE_NODE = {"cpus_per_worker": 1}  # the session's Ray has no `accel`


def study_yaml(inputs: str, placed: dict) -> str:
    """The study: every model step with `placed` (on the cluster: the accelerator type),
    one CPU (one torch thread) per actor, so that both runs compute the same floats."""
    accel = json.dumps(placed)[1:-1]
    return f"""
name: autoscaling
profile: local
max_parallel: 2
datasets:
  sample:
    inputs: [{inputs}/reviews.jsonl]
    meta: [{inputs}/items.jsonl]
    vars: {{statements: {inputs}/statements.jsonl}}
steps:
  ingest: {{job: ingest, with: {{inputs: "{{dataset.inputs}}", meta: "{{dataset.meta}}"}}}}
  triplets:
    job: extract
    with: {{input: "{{ingest}}", method: triplets, limit: 1, shard_size: 1, max_tokens: 128, {accel}}}
  clusters: {{job: cluster, with: {{input: "{{triplets}}", {accel}}}}}
  flip: {{job: flip_benchmark, with: {{input: "{{dataset.statements}}"}}}}
  evaluate:
    job: evaluate
    with: {{explanations: ["{{flip}}/explanations.parquet"], references: "{{flip}}/ground_truth",
           statements: ["{{flip}}/statements.parquet"], limit: 8, metrics: [overlap, sts, corpus],
           dataset: "{{dataset}}", {accel}}}
"""


class NodeWatch:
    """The cluster's alive nodes by type, sampled every second in a thread: (seconds
    since start, {type: count}) rows, to show 0 -> n -> 0."""

    def __init__(self, cluster):
        self.cluster, self.rows, self._stop = cluster, [], threading.Event()
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.cluster.alive_nodes():
            res = n.get("resources_total") or {}
            kind = "head" if n.get("is_head_node") else "accel" if res.get("accel") else "cpu"
            out[kind] = out.get(kind, 0) + 1
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            row = (round(time.monotonic() - self.t0), self.counts())
            if not self.rows or self.rows[-1][1] != row[1]:
                self.rows.append(row)
            self._stop.wait(1.0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def most(self, kind: str) -> int:
        return max((c.get(kind, 0) for _, c in self.rows), default=0)


@pytest.fixture(scope="module")
def inputs(s3_env) -> str:
    """The sample's files in the bucket: a cluster reads its inputs from storage every
    node reaches."""
    root = location(fresh_prefix()) / "inputs"
    for name in ("reviews.jsonl", "items.jsonl", "statements.jsonl"):
        (root / name).write_bytes((SAMPLE / name).read_bytes())
    return str(root)


@pytest.fixture(scope="module")
def study_file(inputs, tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("autoscaling") / "study.yaml"
    f.write_text(study_yaml(inputs, ON_ACCEL))
    return f


@pytest.fixture(scope="module")
def one_node(inputs, ray_session, tmp_path_factory) -> str:
    """The reference: the same study on the session's one-node Ray (no accelerator there)."""
    from rexeval.pipelines.study.config import load_study
    from rexeval.pipelines.study.plan import build_plan
    from rexeval.pipelines.study.runner import run_study

    f = tmp_path_factory.mktemp("one-node") / "study.yaml"
    f.write_text(study_yaml(inputs, ONE_NODE))
    out = fresh_prefix() + "/one-node"
    result = run_study(build_plan(load_study(f, {}), f, out), progress=lambda _: None)
    assert result["failed"] == {} and result["skipped"] == {}, result
    return out


def test_a_study_on_a_cold_autoscaling_cluster_grows_it_runs_off_the_head_and_shrinks_it(
        study_file, one_node, s3_env, tmp_path, capsys):
    """The cluster's run is submitted as a user submits a study (`ray job submit`: its own
    driver, which needs no CPU, on the head); `steps_as: auto` then submits each step
    as a Ray job asking for one CPU, which only a worker has."""
    out = fresh_prefix() + "/autoscaled"
    # Its own call cache: the cluster's LLM actors must answer, not the reference's cache.
    env = {**s3_env, "REXEVAL_CACHE": str(tmp_path / "cache")}
    with local_cluster(head_cpus=0, autoscaling=WORKER_TYPES, idle_timeout_s=IDLE_S, env=env) as cluster, \
            NodeWatch(cluster) as watch:
        head = cluster.node_id(cluster.head)
        assert watch.counts() == {"head": 1}, "the cluster did not start cold"
        client = cluster.job_client()
        study = client.submit_job(entrypoint=f"rexeval study run {study_file} --out {out}")
        try:
            info = wait_for(lambda: (i := client.get_job_info(study)).status.is_terminal() and i,
                            STUDY_TIMEOUT_S, "the study to end", every=1)
        except TimeoutError:
            jobs = [(j.entrypoint[-60:], j.status, j.driver_node_id) for j in client.list_jobs()]
            pytest.fail(f"the study did not end in {STUDY_TIMEOUT_S}s; nodes {watch.rows}; jobs {jobs}; "
                        f"its log:\n{client.get_job_logs(study)[-8000:]}")
        logs = client.get_job_logs(study)
        assert info.status == "SUCCEEDED", f"{info.message}\n{logs[-6000:]}"

        # Every step ran as a Ray job of its own, its driver on a worker, not the head.
        steps = [j for j in client.list_jobs() if j.submission_id != study]
        assert len(steps) == 5, [j.entrypoint for j in steps]
        assert all(j.status == "SUCCEEDED" for j in steps), [(j.entrypoint, j.status) for j in steps]
        assert all(j.driver_node_id and j.driver_node_id != head for j in steps), \
            [(j.entrypoint, j.driver_node_id) for j in steps]

        # The autoscaler added both types, and stops them once they are idle.
        assert watch.most("cpu") >= 1 and watch.most("accel") == 1, watch.rows
        wait_for(lambda: watch.counts() == {"head": 1}, IDLE_S + 60, "the workers to be stopped", every=1)
        watch.rows.append((round(time.monotonic() - watch.t0), watch.counts()))
    with capsys.disabled():
        print("\nalive nodes over time (seconds: nodes by type):")
        for t, counts in watch.rows:
            print(f"  {t:4d}s  {counts}")

    # The same tables as on one node.
    here, there = tables_of(one_node), tables_of(out)
    assert sorted(there) == sorted(here)
    for name, table in here.items():  # exactly, NaN for NaN (a metric undefined on an example)
        pd.testing.assert_frame_equal(there[name].to_pandas(), table.to_pandas(), check_exact=True, obj=name)
