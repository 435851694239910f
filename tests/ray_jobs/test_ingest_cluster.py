"""`rexeval ingest` driven on the head of a cluster whose worker node shares no disk with
it (tests/doubles/local_cluster.py `hide=`), output on an S3 endpoint every node reaches.

  * inputs given as URIs are read by whichever node runs the task, and give the tables
    of a one-node run;
  * inputs given as local paths exist on the head only, so the tasks that read them run
    there (`pipelines/core/inputs.py` `reads_here`): none of the parse work lands on the
    worker node, where it could only fail on a missing file.
"""
from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.storage import location
from tests.doubles.local_cluster import can_isolate, local_cluster

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not can_isolate(), reason="this machine cannot start a node in its own mount namespace")]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "pipelines" / "sample"
FILES = ("reviews.jsonl", "reviews_noisy.jsonl")
PARSE = "MapWorker(MapBatches(_StageActor))"


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    """The head's local folder of inputs; the worker node sees it empty."""
    root = tmp_path_factory.mktemp("ingest-run")
    for name in FILES:
        (root / name).write_bytes((SAMPLE / name).read_bytes())
    return root


@pytest.fixture(scope="module")
def cluster(s3_env, run_root):
    """A head with one CPU and a worker node with two that shares no disk with it."""
    with local_cluster(head_cpus=1, worker_cpus=(2,), env=s3_env, hide=[run_root]) as c:
        yield c


@pytest.fixture(scope="module")
def one_node(run_root, tmp_path_factory, ray_session) -> dict[str, pa.Table]:
    from rexeval.pipelines.ingest.config import IngestConfig
    from rexeval.pipelines.ingest.pipeline import run_ingest

    out = tmp_path_factory.mktemp("one-node") / "ingest"
    run_ingest(IngestConfig(inputs=[str(run_root / n) for n in FILES], out=str(out), chunk_mb=0.01),
               progress=lambda _: None)
    return _tables(str(out))


def _tables(root: str) -> dict[str, pa.Table]:
    """reviews and errors, with the input files they name (a path or a URI) cut to the
    file's name, in `source` and in the messages of duplicates."""
    out = {}
    for name in ("reviews", "errors"):
        t = read_table(location(root) / name, name)
        for col in ("source", "message"):
            if col in t.column_names:
                cut = pc.replace_substring_regex(t.column(col), r"\S+/([^/\s]+)", r"\1")
                t = t.set_column(t.column_names.index(col), t.field(col), cut)
        out[name] = t
    return out


def _ingest(cluster, out: str, inputs: list[str]) -> subprocess.CompletedProcess:
    """`rexeval ingest` as a driver on the head, joined to the cluster by RAY_ADDRESS."""
    return subprocess.run([sys.executable, "-m", "rexeval.ray_jobs.ingest", *inputs, "--out", out,
                           "--chunk-mb", "0.01"], env={**cluster.env, "RAY_ADDRESS": cluster.gcs_address},
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def _work_on_worker(cluster) -> Counter:
    worker = cluster.node_id(cluster.nodes[1])
    return Counter(t.get("name", "").split(".")[0] for t in cluster.state("tasks") if t.get("node_id") == worker)


def test_uri_inputs_are_read_on_any_node(cluster, run_root, s3_root, one_node):
    inputs = []
    for name in FILES:
        (location(s3_root) / "in" / name).upload(run_root / name)
        inputs.append(f"{s3_root}/in/{name}")
    res = _ingest(cluster, f"{s3_root}/out", inputs)
    assert res.returncode == 0, res.stderr[-4000:]
    assert _tables(f"{s3_root}/out") == one_node


def test_local_inputs_are_read_on_the_head_only(cluster, run_root, s3_root, one_node):
    before = _work_on_worker(cluster)
    res = _ingest(cluster, f"{s3_root}/out", [str(run_root / n) for n in FILES])
    assert res.returncode == 0, res.stderr[-4000:]
    assert _tables(f"{s3_root}/out") == one_node
    after = _work_on_worker(cluster)
    assert after[PARSE] == before[PARSE] and after["plan_file"] == before["plan_file"]
