"""Losing a node in the middle of a job (issue "Operating rexeval on a cluster").

A real two-node cluster on this machine (`ray start --head` with 2 CPUs plus `ray start
--address=<head>` with 2 CPUs, tests/doubles/local_cluster.py) whose nodes share no disk
(the worker runs in a mount namespace of its own where the head's files are not: issue
"rexeval on a real cluster"), so the job reads its statements from and writes its output
to an S3 endpoint on 127.0.0.1 (tests/doubles/s3.py). `rexeval cluster` runs
as a submitted job with two embedding actors of one CPU each; Ray Data spreads them over
the two nodes. Once the job has written a few of its embedding shards and the actor on
the worker node is up, the worker node's raylet is killed with SIGKILL, as when a
machine disappears, taking that actor and the shard it was encoding with it.

What happens, and what this test pins: the job FINISHES, with output identical to a
reference run of the same job that nothing interrupted. Ray Data creates its actor
pool's actors with max_restarts=-1 and max_task_retries=-1, so once the GCS declares
the node dead, Ray restarts the lost actor on the head (its constructor reloads the
encoder) and re-sends the shard it was running there; the shard writer is atomic and
idempotent (pipelines/core/io.py), so nothing is lost or written twice. The cluster's
health checks are tightened (1 s x 3 instead of Ray's 3 s x 5) only so that the node is
declared dead in ~6 s instead of ~16 s; the outcome is the same with Ray's defaults.
Unlike a head alone, a two-node cluster cannot stay on the loopback interface (see
tests/doubles/local_cluster.py): Ray's gRPC servers listen on all interfaces meanwhile.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rexeval.pipelines.core.io import read_table, table_files
from rexeval.storage import location
from tests.doubles.local_cluster import LocalCluster, local_cluster, wait_for
from tests.ray_jobs.test_job_submit import REPO, RUNTIME_ENV_JSON

pytestmark = pytest.mark.slow

CSV_COLUMNS = ["reviewerID", "asin", "reviewerName", "helpful", "reviewText", "overall", "summary",
               "unixReviewTime", "reviewTime"]
SENTIMENT = {"1": "negative", "2": "negative", "3": "neutral", "4": "positive", "5": "positive"}
ROWS = 1050  # review summaries as statements: ~900 distinct texts
SETTINGS = "tests/ray_jobs/lost_node_cluster.yaml"  # in the uploaded working dir: every node has it
SHARD_SIZE = yaml.safe_load((REPO / SETTINGS).read_text())["shard_size"]  # 75 -> 12 embedding shards
KILL_AFTER = 3  # shards written before the worker node goes
ACTOR = "MapWorker(MapBatches(_StageActor))"  # Ray Data's name for a map_stage actor
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
JOB_TIMEOUT_S = 150


def shared_statements(shared_csv: Path, path: Path) -> Path:
    """Statements for `rexeval cluster`: the summaries of the first shared reviews, with
    the polarity their rating gives (STATEMENTS schema, stage "verified")."""
    from rexeval.pipelines.core.schema import STATEMENTS

    df = pd.read_csv(shared_csv, header=None, names=CSV_COLUMNS, dtype=str, keep_default_na=False,
                     nrows=ROWS)
    rows = [{"statement_id": f"s{i:05d}", "review_id": f"{r.reviewerID}:{r.asin}", "user_id": r.reviewerID,
             "item_id": r.asin, "statement": r.summary, "topic": None, "sentiment": SENTIMENT.get(r.overall),
             "stage": "verified", "provenance": None} for i, r in enumerate(df.itertuples())]
    pq.write_table(pa.Table.from_pylist(rows, schema=STATEMENTS), path)
    return path


def cluster_command(src: str, out: str, config: str) -> list[str]:
    """The job: two encoder actors of one CPU each, small shards (a YAML config holds the
    settings that have no flag: tests/ray_jobs/lost_node_cluster.yaml)."""
    return ["rexeval", "cluster", src, "--out", out, "--workers", "2", "--config", config]


def submit(cluster: LocalCluster, command: list[str]) -> str:
    """`ray job submit` from the repository root with docs/cluster.md's runtime env."""
    return cluster.submit(*command, cwd=REPO, runtime_env_json=RUNTIME_ENV_JSON)


def encoder_actors(cluster: LocalCluster, job_id: str) -> list[dict]:
    """The job's embedding actors as Ray's state API lists them (node, state, restarts)."""
    return [a for a in cluster.state("actors") if a.get("job_id") == job_id and a.get("class_name") == ACTOR]


def done_shards(out) -> int:
    return len((location(out) / "_work" / "embeddings" / "_done").iterdir())


def read_sorted(path, key: str) -> pd.DataFrame:
    return read_table(path, pq.read_schema(table_files(path)[0].open_input())).to_pandas() \
        .sort_values(key).reset_index(drop=True)


def test_a_job_survives_losing_a_worker_node_with_identical_output(shared_csv, tmp_path, ray_session, s3_env,
                                                                   s3_root):
    from rexeval.pipelines.paraphrase.config import ClusterConfig
    from rexeval.pipelines.paraphrase.embed import read_vectors
    from rexeval.pipelines.paraphrase.pipeline import run_cluster

    src = shared_statements(shared_csv, tmp_path / "statements.parquet")
    ref, out = tmp_path / "ref", f"{s3_root}/out"
    remote_src = f"{s3_root}/statements.parquet"  # the nodes share no disk: the input is in the bucket
    location(remote_src).upload(src)
    # Reference: the same job, never interrupted (on the session's Ray: the same two
    # encoder actors of one CPU each, the same shards).
    run_cluster(ClusterConfig(input=remote_src, out=str(ref), workers=2, cpus_per_worker=1, shard_size=SHARD_SIZE),
                progress=lambda m: None)
    n_shards = done_shards(ref)
    assert n_shards > 2 * KILL_AFTER
    with local_cluster(head_cpus=2, worker_cpus=(2,), system_config=FAST_HEALTH_CHECKS, env=s3_env,
                       hide=[tmp_path]) as cluster:
        head, worker = cluster.nodes
        head_id, worker_id = cluster.node_id(head), cluster.node_id(worker)

        submission = submit(cluster, cluster_command(remote_src, out, SETTINGS))
        client = cluster.job_client()

        def worker_actor_busy():
            """Half-way (polled, not slept): some shards written, and the job's encoder
            actor on the worker node is up, so losing the node costs work in flight."""
            done = done_shards(out)
            assert done < n_shards and not client.get_job_status(submission).is_terminal(), \
                "the job ended before an encoder actor was seen on the worker node"
            job_id = client.get_job_info(submission).job_id
            if done < KILL_AFTER or not job_id:
                return None
            return [a for a in encoder_actors(cluster, job_id) if a["node_id"] == worker_id
                    and a["state"] == "ALIVE"] or None

        [lost, *_] = wait_for(worker_actor_busy, 90, f"{KILL_AFTER} shards and an encoder actor on the worker node")
        done_at_kill = done_shards(out)
        cluster.kill_raylet(worker)
        wait_for(lambda: len(cluster.alive_nodes()) == 1, 30, "the GCS to declare the worker node dead")

        info, logs = cluster.wait_job(submission, JOB_TIMEOUT_S)
        # The pinned outcome: the job finishes by itself, on the node that is left ...
        assert info.status == "SUCCEEDED" and info.driver_exit_code == 0, f"{info.message}\n{logs}"
        assert info.driver_node_id == head_id
        assert done_at_kill < n_shards == done_shards(out)
        # ... because Ray restarted the lost actor on the head and re-ran its shard there.
        after = {a["actor_id"]: a for a in encoder_actors(cluster, info.job_id)}[lost["actor_id"]]
        assert int(after["num_restarts"]) >= 1 and after["node_id"] == head_id, after

    # Identical to the reference: the embeddings bit for bit, the clusters, canonical
    # statements and error rows row for row.
    out = location(out)
    assert (read_vectors(ref / "_work" / "embeddings") == read_vectors(out / "_work" / "embeddings")).all()
    for table, key in (("clusters", "statement_id"), ("canonical", "cluster_id"), ("errors", "row_id")):
        pd.testing.assert_frame_equal(read_sorted(out / table, key), read_sorted(location(ref) / table, key))
    assert len(read_sorted(out / "clusters", "statement_id")) == ROWS - len(read_sorted(out / "errors", "row_id"))
