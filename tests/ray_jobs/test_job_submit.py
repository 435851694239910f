"""`ray job submit` as users run it (issue "Operating rexeval on a cluster").

A real cluster started with `ray start --head` (tests/doubles/local_cluster.py); from the
repository root the test submits `rexeval ingest` on the shared reviews, then `rexeval
split` on its output, exactly as docs/cluster.md shows:

    ray job submit --address http://127.0.0.1:8265 --working-dir . \\
        --runtime-env-json '{"excludes": [...RUNTIME_ENV_EXCLUDES...]}' --no-wait \\
        -- rexeval ingest /data/mi.csv --out /shared/runs/mi/ingest

and checks what a user would: the job SUCCEEDED, its log has the job's summary, its
outputs are complete. A job that cannot run (an input that does not exist) must end
FAILED with a non-zero exit and the one-line reason in its log, not a traceback.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.doubles.local_cluster import LocalCluster, local_cluster, wait_for
from tests.doubles.tiny_encoders import build_tiny_bert
from tests.doubles.ports import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

RUNTIME_ENV_EXCLUDES = [
    "/.git", "/.venv", "**/__pycache__", "*.egg-info", "/.pytest_cache", "/.ruff_cache",
    "/.rexeval_cache", "/runs", "/out", "/data", "/build", "/dist",
]
"""What `--working-dir .` must not upload: the virtualenv (GBs), git history, caches, job
outputs and data (jobs read data by path, from storage every node sees). Anchored with a
leading "/" so that only the repository's top-level folders of those names are left out,
never a nested one of the same name. docs/cluster.md's `ray job submit` uses exactly
this JSON."""
RUNTIME_ENV_JSON = json.dumps({"excludes": RUNTIME_ENV_EXCLUDES})
UPLOAD_MAX_BYTES = 20 << 20  # what is left of the checkout is ~4 MB
JOB_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cluster():
    """One head with 2 CPUs (this machine's cores) and the job server, for the module."""
    with local_cluster(head_cpus=2) as c:
        yield c


def submit(cluster: LocalCluster, *entrypoint: str) -> str:
    """`ray job submit ... --no-wait -- <entrypoint>` from the repository root with the
    runtime env of docs/cluster.md; returns the submission id it prints."""
    return cluster.submit(*entrypoint, cwd=REPO, runtime_env_json=RUNTIME_ENV_JSON)


def run_job(cluster: LocalCluster, *entrypoint: str) -> str:
    """Submit, wait, and insist on success; returns the job's log."""
    info, logs = cluster.wait_job(submit(cluster, *entrypoint), JOB_TIMEOUT_S)
    assert info.status == "SUCCEEDED", f"{info.status}: {info.message}\n{logs}"
    assert info.driver_exit_code == 0
    return logs


def uploaded_dirs(cluster: LocalCluster) -> list[Path]:
    """The working dirs the head unpacked for jobs (what `--working-dir .` uploaded)."""
    return [p for p in cluster.head.temp_dir.glob("session_latest/runtime_resources/working_dir_files/*")
            if p.is_dir()]


def test_ingest_then_split_as_submitted_jobs_and_a_failing_job(cluster, shared_csv, tmp_path):
    ingest, split = tmp_path / "ingest", tmp_path / "split"

    logs = run_job(cluster, "rexeval", "ingest", str(shared_csv), "--out", str(ingest))
    m = json.loads((ingest / "manifest.json").read_text())
    c = m["counts"]
    assert m["status"] == "complete"
    assert c["in"] == 5050 and c["in"] == c["out"] + c["errors"] and c["out"] > 5000
    assert pq.read_table(ingest / "reviews").num_rows == c["out"]
    assert pq.read_table(ingest / "errors").num_rows == c["errors"]
    assert "== ingest" in logs and "reviews out" in logs and f"{c['out']:,}" in logs, logs

    # The upload is the code only: no virtualenv, git history or caches.
    [pkg] = uploaded_dirs(cluster)
    assert (pkg / "setup.py").exists() and (pkg / "pipelines").is_dir()
    for excluded in (".git", ".venv", "rexeval.egg-info", "pipelines/__pycache__"):
        assert not (pkg / excluded).exists(), excluded
    size = sum(f.stat().st_size for f in pkg.rglob("*") if f.is_file())
    assert size < UPLOAD_MAX_BYTES, f"--working-dir uploaded {size / 2**20:.1f} MiB"

    logs = run_job(cluster, "rexeval", "split", str(ingest), "--out", str(split))
    s = json.loads((split / "manifest.json").read_text())["counts"]
    assert s["reviews_in"] == c["out"]
    kept = {name: pq.read_table(split / name) for name in ("train", "valid", "test")}
    assert {name: t.num_rows for name, t in kept.items()} == {n: s[n] for n in kept}
    assert s["train"] > s["valid"] > 0 and s["test"] > 0
    assert s["reviews_in"] == sum(s[k] for k in ("train", "valid", "test", "dropped_min_interactions",
                                                 "dropped_cold_start_valid", "dropped_cold_start_test"))
    # Per user and chronological: every user with a test review has training reviews.
    assert set(kept["test"].column("user_id").to_pylist()) <= set(kept["train"].column("user_id").to_pylist())
    assert "== split" in logs and f"{s['train']:,}" in logs, logs

    # A job that cannot run ends FAILED, with its exit code and the reason in one line.
    job_id = submit(cluster, "rexeval", "split", "/nonexistent/folder", "--out", str(tmp_path / "never"))
    info, logs = cluster.wait_job(job_id, JOB_TIMEOUT_S)
    assert info.status == "FAILED" and info.driver_exit_code == 2, info
    assert "exit code 2" in info.message, info.message
    assert "'/nonexistent/folder' does not exist" in logs and "Traceback" not in logs, logs
    assert not (tmp_path / "never").exists()
    # What `ray job status` shows the user.
    status = cluster.ray("job", "status", "--address", cluster.dashboard_url, job_id).stdout
    assert f"Job '{job_id}' failed" in status and "failed with exit code 2" in status, status



def test_a_detached_endpoint_outlives_its_command(cluster, tmp_path):
    """`RAY_ADDRESS=<head> rexeval serve nli --detach` deploys on the cluster and returns;
    the endpoint keeps serving until `serve shutdown` removes it."""
    tiny = build_tiny_bert(tmp_path / "nli", 3, id2label={0: "entailment", 1: "neutral", 2: "contradiction"})
    port = free_port()
    url = f"http://127.0.0.1:{port}/nli"
    env = {**cluster.env, "RAY_ADDRESS": cluster.gcs_address}
    env.pop("REXEVAL_SERVE_TOKEN", None)
    res = subprocess.run([sys.executable, "-m", "rexeval.ray_jobs.cli", "serve", "nli", "--model", str(tiny),
                          "--port", str(port), "--device", "cpu", "--detach"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Detached" in res.stdout and url in res.stdout
    # Its command has exited; the endpoint answers.
    assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
    r = httpx.post(url, json={"pairs": [["a guitar", "a guitar"]]}, timeout=60)
    assert r.status_code == 200 and len(r.json()["probs"]) == 1
    out = subprocess.run([str(Path(sys.executable).parent / "serve"), "shutdown", "--address", cluster.dashboard_url,
                          "-y"], env=cluster.env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr

    def gone():
        try:
            httpx.get(f"{url}/healthz", timeout=2)
            return False
        except httpx.TransportError:
            return True

    wait_for(gone, 60, "the endpoint to go away after serve shutdown")


def serve_apps(cluster: LocalCluster) -> set[str] | None:
    """The Serve applications running on the cluster (None while the dashboard is silent)."""
    got = cluster._get("/api/serve/applications/")
    return None if got is None else set((got.get("applications") or {}))


def test_two_submitted_judge_jobs_share_one_judge_app_until_the_last_ends(cluster, tmp_path):
    """Two `ray job submit` drivers run `rexeval judge pairwise` with the same judge: one
    starts the `rexeval-judge` app, both use it (the cluster-wide lease book counts them).
    The first to finish leaves it running for the second, which is still calling it; the
    app goes when the last one ends. The second driver's calls on one pair fail in
    transport (an outage, while a flag file exists) so it is surely still running when
    the first finishes; once the flag goes, its next try succeeds."""
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.evaluate.inputs import write_flip_benchmark

    sample = REPO / "pipelines" / "sample"
    paths = write_flip_benchmark(statements_from_annotations(sample / "statements.jsonl", stage="triplet"),
                                 tmp_path / "inputs")
    expl = pq.read_table(paths["explanations"]).to_pandas()
    baseline = "ground_truth" if "ground_truth" in set(expl["system"]) else sorted(set(expl["system"]))[0]
    other = expl[expl["system"] != baseline]["explanation"].tolist()
    held = other[2]  # in the long job's first 3 examples, not in the short job's first one
    assert held != other[0]
    outage = tmp_path / "outage"
    outage.write_text("on")
    port = free_port()

    def judge(limit: int, name: str) -> str:
        # The same backend options for both: the same app (its settings hash) serves them.
        options = {"default": "[[A]]", "down_while": str(outage), "down_for": held, "backoff_s": "2",
                   "transport_retries": "30"}
        flags = [f for k, v in options.items() for f in ("--backend-option", f"{k}={v}")]
        return submit(cluster, "rexeval", "judge", "pairwise", str(paths["explanations"]), "--baseline", baseline,
                      "--limit", str(limit), "--no-divide", "--one-order", "--chunk-size", "1", "--no-cache",
                      "--backend", "tests.doubles.llm:ScriptedLLM", "--model", "judge_llm=scripted-judge",
                      "--serve-port", str(port), "--out", str(tmp_path / name), *flags)

    long_job = judge(3, "long")
    short_job = judge(1, "short")
    info, logs = cluster.wait_job(short_job, JOB_TIMEOUT_S)
    assert info.status == "SUCCEEDED", f"{info.status}: {info.message}\n{logs[-4000:]}"
    client = cluster.job_client()
    assert not client.get_job_status(long_job).is_terminal(), client.get_job_logs(long_job)[-4000:]
    assert "rexeval-judge" in (serve_apps(cluster) or set()), "the first job to finish removed the shared app"

    outage.unlink()  # the second job's next try gets its answers
    info, logs = cluster.wait_job(long_job, JOB_TIMEOUT_S + 120)
    assert info.status == "SUCCEEDED", f"{info.status}: {info.message}\n{logs[-4000:]}"
    assert "failed in transport" in logs, logs[-4000:]
    verdicts = pq.read_table(tmp_path / "long" / "verdicts.parquet").to_pandas()
    assert len(verdicts) == 3 and verdicts["verdict"].notna().all()
    # The last user gone, the app goes (its driver deletes it on the way out).
    wait_for(lambda: (apps := serve_apps(cluster)) is not None and "rexeval-judge" not in apps, 60,
             "the judge app to go with its last user")
