"""A slice of the test suite with one environment setting against without it, side by side
in one run: the machine's CPU (/proc/stat) and wall time of each pytest run, the arms in
the order A B B A (a drift of the machine's load over the run weighs on both alike).

What it answered (docs/benchmarks.md):

    # the thread cap: the session's own (A) against none (B: a cap above the cores)
    .venv/bin/python -m benchmarks.bench_suite_env --set REXEVAL_MAX_THREADS=64 \
        --out benchmarks/results/suite_env_thread_cap.json
    # idle workers a local Ray keeps: 8 (A) against 2 (B)
    .venv/bin/python -m benchmarks.bench_suite_env --set RAY_num_workers_soft_limit=2 \
        --out benchmarks/results/suite_env_soft_limit.json

Each takes ~14 min on 2 cores with the default slice (`SLICE`: 141 tests that run jobs
on Ray, serve models and train; pytest arguments after `--` replace it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.machine_cpu import machine_cpu_s

REPO = Path(__file__).resolve().parents[1]
SLICE = ["tests/pipelines/evaluate", "tests/pipelines/paraphrase/test_shards.py", "tests/pipelines/paraphrase/test_storage.py",
         "tests/pipelines/judge/test_jobs.py", "tests/serve/test_endpoints.py", "tests/pipelines/star/test_train.py",
         "tests/pipelines/generate/test_train.py", "tests/pipelines/extract/test_pipeline.py"]
ORDER = ("A", "B", "B", "A")


def run_arm(env: dict, tests: list[str]) -> dict:
    """One `-n 2` pytest run of `tests`: its machine CPU, wall time and last line."""
    c0, t0 = machine_cpu_s(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider",
                           "-q", *tests], cwd=REPO, env=env, capture_output=True, text=True)
    out = {"machine_cpu_s": round(machine_cpu_s() - c0, 1), "wall_s": round(time.perf_counter() - t0, 1),
           "summary": (proc.stdout.strip().splitlines() or [""])[-1]}
    if proc.returncode != 0:
        raise SystemExit(f"pytest failed ({proc.returncode}): {out['summary']}\n{proc.stdout[-3000:]}")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", required=True, metavar="VAR=VALUE", help="arm B's setting (arm A: the environment as is)")
    ap.add_argument("--out", required=True)
    ap.add_argument("tests", nargs="*", help="pytest arguments (default: SLICE)")
    a = ap.parse_args(argv)
    var, sep, value = a.set.partition("=")
    if not sep or not var:
        ap.error(f"--set {a.set!r}: expected VAR=VALUE")
    base = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if var in base:
        ap.error(f"{var} is set in this environment already: arm A would not be the session's default")
    tests = a.tests or SLICE
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for arm in ORDER:
        runs[arm].append(run_arm(base if arm == "A" else {**base, var: value}, tests))
        print(arm, runs[arm][-1], flush=True)
    result = {"command": f"python -m benchmarks.bench_suite_env --set {a.set} --out {a.out}"
                         + (" " + " ".join(a.tests) if a.tests else ""),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "date": time.strftime("%Y-%m-%d"), "tests": tests, "A": "the environment as is", "B": a.set,
              "order": list(ORDER), "runs": runs}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({arm: [r["machine_cpu_s"] for r in rs] for arm, rs in runs.items()}))
    return result


if __name__ == "__main__":
    main()
