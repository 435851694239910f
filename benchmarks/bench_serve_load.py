"""Load test of the standing NLI endpoint (`rexeval serve nli`), 127.0.0.1 only.

Issue 19: throughput and p50/p99 latency at a nominal load, what 10x that load gets
(503s from the bounded queue, not a hang or a crash), and full recovery afterwards.

Endpoint: `rexeval serve nli` started as a user starts it (its own process and local
Ray), one replica on 1 CPU, with the MiniLM-size 3-way classifier of bench_nli.py (the
packaged all-MiniLM-L6-v2 encoder with a randomly initialised, seeded head: the
probabilities mean nothing, the compute is a trained MiniLM NLI model's), small
`--max-ongoing-requests` / `--max-queued-requests` so that overload is reached on 2
cores.

Phases, each a FIXED number of requests (and a time cap), sent by a closed loop of
concurrent async clients (httpx), each request `--pairs` (premise, hypothesis) pairs
drawn from the packaged sample statements, no client retries:
- nominal: `--concurrency` clients;
- overload: 10x the clients (`--overload`), requests equally many per client;
- recovery: the nominal phase again, right after.
Per phase: requests/s and pairs/s of 200 answers, p50/p99 latency of 200 answers, p50 of
503 answers, counts of 200 / 503 / other statuses and transport errors. The clients run
on the same 2 cores as the proxy and the replica, as they would not in production. The run fails (exit 1) unless the
nominal and recovery phases answer every request 200, overload produces 503s and no
other failure, and the health route answers afterwards; ratios recovery/nominal
(throughput, p50) show the recovery.

    .venv/bin/python benchmarks/bench_serve_load.py                 # ~2 min on 2 cores
    .venv/bin/python benchmarks/bench_serve_load.py --requests 100 --out /tmp/load.json

Results go to benchmarks/results/serve_load.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.bench_nli import CACHE, build_model, item_pools
from rexeval.serve.common import is_loopback

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "serve_load.json"


def make_bodies(n: int, pairs: int, seed: int) -> list[dict]:
    """`n` request bodies of `pairs` statement pairs of one item each (seeded)."""
    rng = random.Random(seed)
    pools = [list(c) for c in item_pools().values() if len(c) >= 2]
    bodies = []
    for _ in range(n):
        pool = rng.choice(pools)
        bodies.append({"pairs": [rng.sample(pool, 2) for _ in range(pairs)]})
    return bodies


async def phase(url: str, bodies: list[dict], concurrency: int, cap_s: float) -> dict:
    """Send every body once from `concurrency` closed-loop clients; count and time them."""
    queue = list(reversed(bodies))
    lat_ok: list[float] = []
    lat_503: list[float] = []
    statuses: dict[str, int] = {}
    t0 = time.perf_counter()

    async def client(http: httpx.AsyncClient):
        while queue and time.perf_counter() - t0 < cap_s:
            body = queue.pop()
            start = time.perf_counter()
            try:
                r = await http.post(url, json=body)
                key = str(r.status_code)
            except httpx.TransportError as exc:
                key = f"transport:{type(exc).__name__}"
            statuses[key] = statuses.get(key, 0) + 1
            if key == "200":
                lat_ok.append(time.perf_counter() - start)
            elif key == "503":
                lat_503.append(time.perf_counter() - start)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ok = statuses.get("200", 0)
    pairs = len(bodies[0]["pairs"])
    return {"concurrency": concurrency, "requests": len(bodies), "sent": sum(statuses.values()),
            "unsent_at_cap": len(queue), "wall_s": round(wall, 3), "statuses": statuses,
            "requests_per_s": round(ok / wall, 2), "pairs_per_s": round(ok * pairs / wall, 1),
            "p50_ms": round(float(np.percentile(lat_ok, 50)) * 1000, 1) if lat_ok else None,
            "p99_ms": round(float(np.percentile(lat_ok, 99)) * 1000, 1) if lat_ok else None,
            "p50_503_ms": round(float(np.percentile(lat_503, 50)) * 1000, 1) if lat_503 else None}


def start_endpoint(args, model_dir: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": str(args.threads)}
    env.pop("RAY_ADDRESS", None)
    env.pop("REXEVAL_SERVE_TOKEN", None)
    cmd = [sys.executable, "-m", "rexeval.ray_jobs.cli", "serve", "nli", "--model", model_dir, "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(args.port), "--max-ongoing-requests", str(args.max_ongoing),
           "--max-queued-requests", str(args.max_queued), "--max-batch-pairs", str(args.max_batch_pairs)]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{args.port}/nli"
    deadline = time.monotonic() + 300
    while f"is up at {url}" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the endpoint did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    return proc, url


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400, help="requests per nominal phase")
    ap.add_argument("--pairs", type=int, default=8, help="pairs per request")
    ap.add_argument("--concurrency", type=int, default=4, help="nominal concurrent clients")
    ap.add_argument("--overload", type=int, default=10, help="overload = this x the nominal clients")
    ap.add_argument("--max-ongoing", type=int, default=8, help="--max-ongoing-requests of the replica")
    ap.add_argument("--max-queued", type=int, default=8, help="--max-queued-requests before 503")
    ap.add_argument("--max-batch-pairs", type=int, default=64)
    ap.add_argument("--cap-s", type=float, default=120.0, help="time cap per phase")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--port", type=int, default=18123)
    ap.add_argument("--host", default="127.0.0.1", help="must be a loopback address")
    ap.add_argument("--model-dir", default=str(CACHE / "minilm-nli"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if not is_loopback(args.host):
        ap.error("the load test only targets 127.0.0.1")
    model = build_model(Path(args.model_dir), args.seed)
    log_path = Path(tempfile.gettempdir()) / "rexeval-bench-serve-load.log"  # the endpoint's output
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    proc, url = start_endpoint(args, args.model_dir, log_path)
    try:
        warm = make_bodies(20, args.pairs, args.seed + 1)
        asyncio.run(phase(url, warm, args.concurrency, args.cap_s))
        nominal_bodies = make_bodies(args.requests, args.pairs, args.seed)
        overload_n = args.concurrency * args.overload
        over_bodies = make_bodies(args.requests * args.overload // 2, args.pairs, args.seed + 2)
        phases = {"nominal": asyncio.run(phase(url, nominal_bodies, args.concurrency, args.cap_s)),
                  "overload": asyncio.run(phase(url, over_bodies, overload_n, args.cap_s)),
                  "recovery": asyncio.run(phase(url, nominal_bodies, args.concurrency, args.cap_s))}
        health = httpx.get(f"{url}/healthz", timeout=10).status_code
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = None
    nom, over, rec = phases["nominal"], phases["overload"], phases["recovery"]
    failures = []
    for name in ("nominal", "recovery"):
        p = phases[name]
        if p["statuses"] != {"200": p["requests"]}:
            failures.append(f"{name}: not every request answered 200: {p['statuses']}")
    if not over["statuses"].get("503"):
        failures.append(f"overload: no 503 (queue bound not reached?): {over['statuses']}")
    if set(over["statuses"]) - {"200", "503"}:
        failures.append(f"overload: failures other than 503: {over['statuses']}")
    if health != 200:
        failures.append(f"health route answered {health} after the load")
    if rc != 0:
        failures.append(f"the endpoint exited with {rc} on SIGTERM")
    result = {
        "benchmark": "serve_load", "issue": 19,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "endpoint": {"command": "rexeval serve nli", "replicas": 1, "num_cpus": 1, "torch_threads": args.threads,
                     "max_ongoing_requests": args.max_ongoing, "max_queued_requests": args.max_queued,
                     "max_batch_pairs": args.max_batch_pairs, "model": model},
        "load": {"pairs_per_request": args.pairs, "nominal_concurrency": args.concurrency,
                 "overload_concurrency": overload_n, "cap_s": args.cap_s},
        "phases": phases,
        "ratios": {
            "overload_503_share": round(over["statuses"].get("503", 0) / max(1, over["sent"]), 3),
            "overload_over_nominal_throughput": round(over["requests_per_s"] / max(1e-9, nom["requests_per_s"]), 3),
            "recovery_over_nominal_throughput": round(rec["requests_per_s"] / max(1e-9, nom["requests_per_s"]), 3),
            "recovery_over_nominal_p50": round(rec["p50_ms"] / nom["p50_ms"], 3) if rec["p50_ms"] and nom["p50_ms"] else None,
            "overload_over_nominal_p99": round(over["p99_ms"] / nom["p99_ms"], 3) if over["p99_ms"] and nom["p99_ms"] else None,
        },
        "health_after": health, "exit_code_on_sigterm": rc, "failures": failures,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, p in phases.items():
        print(f"{name:9s} c={p['concurrency']:3d}  {p['requests_per_s']:7.2f} req/s  {p['pairs_per_s']:8.1f} pairs/s  "
              f"p50 {p['p50_ms']} ms  p99 {p['p99_ms']} ms  503 p50 {p['p50_503_ms']} ms  statuses {p['statuses']}")
    print(json.dumps(result["ratios"]))
    print(f"wrote {args.out}")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
