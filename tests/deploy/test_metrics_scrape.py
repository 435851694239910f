"""rexeval's metrics as an operator sees them: on Ray's Prometheus endpoint, and on the
Grafana dashboard in deploy/grafana.

- The dashboard (no cluster): valid JSON with a Prometheus datasource variable that
  every panel queries through; every metric rexeval defines (serve/telemetry.py and
  pipelines/core/job_metrics.py, `ALL_METRICS`) is on some panel, and no panel asks for
  a `ray_rexeval_*` name that nothing records.
- The export (slow): a real cluster started with `ray start --metrics-export-port`
  (tests/doubles/local_cluster.py); a driver connected to it runs a small sharded job,
  records LLM calls the way a job's stage does, and starts the judge app and calls it
  over HTTP and through its handle; then `GET /metrics` on the node's export port lists
  every rexeval metric, with the values the driver and the replica recorded.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from rexeval.pipelines.core.job_metrics import ALL_METRICS
from tests.doubles.local_cluster import local_cluster, wait_for
from tests.doubles.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "rexeval-dashboard.json"
SCRAPE_TIMEOUT_S = 40  # Ray pushes a process's metrics to its node's agent every few seconds


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def series_pattern(exported: str) -> re.Pattern:
    """A metric's name in a query: itself, or a histogram's _bucket/_sum/_count series."""
    return re.compile(rf"\b{re.escape(exported)}(_bucket|_sum|_count)?\b")


def test_the_dashboard_shows_every_metric_rexeval_defines():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    [ds] = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert ds["query"] == "prometheus"
    ref = f"${{{ds['name']}}}"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    for p in panels(board):
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == ref and p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == ref and t["refId"]
            assert t["expr"].count("(") == t["expr"].count(")") and t["expr"].count("{") == t["expr"].count("}")
    queries = exprs(board)
    missing = [m.exported for m in ALL_METRICS if not any(series_pattern(m.exported).search(q) for q in queries)]
    assert missing == [], f"metrics on no panel: {missing}"
    known = {m.exported for m in ALL_METRICS}
    asked = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in known else n
             for q in queries for n in re.findall(r"\bray_rexeval_\w+", q)}
    assert asked <= known, f"panels ask for metrics nothing records: {sorted(asked - known)}"
    for v in board["templating"]["list"]:
        if v["type"] == "query":  # the variables list label values of metrics we record
            assert v["datasource"]["uid"] == ref
            assert any(series_pattern(m.exported).search(v["definition"]) for m in ALL_METRICS), v["name"]


DRIVER = """
import json, sys
import httpx, pyarrow as pa, ray
from rexeval.models.llm.base import BackendSpec, LLMResult
from rexeval.models.llm.pricing import Usage
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.job_metrics import record_llm_usage
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Stage
from rexeval.serve.judge import JudgeServeConfig, start_judge_service

out, cache, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
ray.init()  # RAY_ADDRESS: the test's cluster


class Rows(Stage):
    batch_size = 1

    def __init__(self, output):
        self.output = output

    def process(self, batch):
        for shard in batch.column("shard").to_pylist():
            self.output.write_shard(shard, {"values": pa.table({"x": [shard]})}, {"in": 5, "out": 4, "errors": 1})
        return pa.Table.from_pylist([{"shard": s} for s in batch.column("shard").to_pylist()])


job = ShardedJob(ShardedOutput(out, "probe-job", {"v": 1}, ["values"]), 3)
job.run(Rows(job.output), workers=2)
job.finish()
# What a job's LLM stage records after a chunk (pipelines/core/llm/chunks.py).
record_llm_usage("probe-job", "scripted-judge", Usage().add_all([
    LLMResult(text="a", prompt_tokens=10, completion_tokens=2), LLMResult(text="a", cached=True)]))

spec = BackendSpec(backend="tests.doubles.llm:ScriptedLLM", model="scripted-judge", options={"default": "yes"})
cfg = JudgeServeConfig(backend=spec, cache=cache, num_cpus=0.25, batch_wait_timeout_s=0.0)
handle = start_judge_service(cfg, port=port)
url = f"http://127.0.0.1:{port}/judge"
chat = {"messages": [{"role": "user", "content": "is it good?"}]}
codes = [httpx.post(url, json={"requests": [chat]}, timeout=60).status_code for _ in range(2)]
codes.append(httpx.post(url, content=b"{oops", timeout=60).status_code)
handle.generate.remote([chat]).result()
print("CODES", json.dumps(codes))
"""


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def samples(text: str, name: str) -> list[tuple[dict, float]]:
    """(labels, value) of every sample of `name` in a Prometheus text page."""
    out = []
    for m in re.finditer(rf"^{re.escape(name)}\{{(.*?)\}} (\S+)$", text, re.M):
        out.append((dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))), float(m.group(2))))
    return out


def total(text: str, name: str, **labels) -> float:
    return sum(v for tags, v in samples(text, name) if labels.items() <= tags.items())


JOB = {"job": "probe-job"}
JUDGE = {"app": "rexeval-judge"}
EXPECTED = [
    # the driver's sharded job: 3 shards of 5 rows in, 4 out, 1 error
    ("ray_rexeval_job_rows_in_total", JOB, 15), ("ray_rexeval_job_rows_out_total", JOB, 12),
    ("ray_rexeval_job_rows_error_total", JOB, 3), ("ray_rexeval_job_shards_done_total", JOB, 3),
    ("ray_rexeval_job_shards_left", JOB, 0),
    # its LLM usage: one call answered, one from the cache
    ("ray_rexeval_job_llm_calls_total", {**JOB, "outcome": "ok"}, 2),
    ("ray_rexeval_job_llm_cache_hits_total", JOB, 1),
    ("ray_rexeval_job_llm_tokens_total", {**JOB, "kind": "prompt"}, 10),
    # the judge: two good POSTs, one malformed, one handle call; the model asked once,
    # the other two answers from the cache
    ("ray_rexeval_serve_requests_total", {**JUDGE, "route": "judge", "code": "200", "code_class": "2xx"}, 2),
    ("ray_rexeval_serve_requests_total", {**JUDGE, "route": "judge", "code": "400", "code_class": "4xx"}, 1),
    ("ray_rexeval_serve_requests_total", {**JUDGE, "route": "handle.generate", "code": "200"}, 1),
    ("ray_rexeval_serve_request_seconds_count", JUDGE, 4),
    ("ray_rexeval_serve_llm_calls_total", {**JUDGE, "model": "scripted-judge", "outcome": "ok"}, 3),
    ("ray_rexeval_serve_llm_cache_hits_total", JUDGE, 2),
    ("ray_rexeval_serve_llm_tokens_total", {**JUDGE, "kind": "prompt"}, 100),
    ("ray_rexeval_serve_batch_size_count", JUDGE, 3),
    ("ray_rexeval_serve_queue_depth", JUDGE, 0),
]


def problems(page: str) -> list[str]:
    """What the page lacks: metrics not there at all, values not (yet) as recorded."""
    wanted = [m.exported + ("_count" if m.kind == "histogram" else "") for m in ALL_METRICS]
    out = [f"{n}: absent" for n in wanted if not samples(page, n)]
    for name, labels, value in EXPECTED:
        got = total(page, name, **labels)
        if got != value:
            out.append(f"{name}{labels}: {got} != {value}")
    return out


@pytest.mark.slow
def test_a_cluster_exports_the_jobs_and_the_serve_apps_counters(tmp_path):
    # PYTHONPATH: the replicas import the test double backend (tests.doubles.llm).
    with local_cluster(head_cpus=2, env={"PYTHONPATH": str(REPO)}) as cluster:
        port = cluster.head.ports["metrics_export"]
        driver = tmp_path / "driver.py"
        driver.write_text(textwrap.dedent(DRIVER))
        res = subprocess.run([sys.executable, str(driver), str(tmp_path / "out"), str(tmp_path / "calls.sqlite"),
                              str(free_port())], cwd=REPO, env={**cluster.env, "RAY_ADDRESS": cluster.gcs_address},
                             capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "CODES [200, 200, 400]" in res.stdout, res.stdout[-2000:]
        # Each process pushes its metrics to the node every few seconds: poll, bounded.
        try:
            wait_for(lambda: not problems(scrape(port)), SCRAPE_TIMEOUT_S, "the rexeval metrics", every=1)
        except TimeoutError:
            raise AssertionError(f"after {SCRAPE_TIMEOUT_S}s: {problems(scrape(port))}") from None
