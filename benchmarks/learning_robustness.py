"""Every test that checks learning (marker `learning`), on three seeds and two thread
counts: a learning test must hold with margin on any machine, not pass by the luck of
one CPU's rounding (issue 30: the PEPLER test passed on one machine and failed on
another at the same seed).

Runs `pytest -m learning` once per (REXEVAL_TEST_SEED, REXEVAL_TEST_THREADS) in
{0, 1, 2} x {1, 2}; the tests read both (tests/doubles/seeds.py, tests/conftest.py).
Writes, per test, whether it passed in each configuration and how long it took.

    .venv/bin/python -m benchmarks.learning_robustness            # ~12 min on 2 cores
    .venv/bin/python -m benchmarks.learning_robustness --fast     # without the SmolLM2 ones

Results: benchmarks/results/learning_robustness.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
THREADS = (1, 2)


def run_config(seed: int, threads: int, marker: str) -> dict[str, dict]:
    """{test id: {"outcome", "seconds", "message"}} of one pytest run."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        env = {**os.environ, "REXEVAL_TEST_SEED": str(seed), "REXEVAL_TEST_THREADS": str(threads),
               "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        subprocess.run([sys.executable, "-m", "pytest", "-m", marker, "-q", "-p", "no:cacheprovider",
                        "-o", "addopts=", f"--junitxml={junit}"], cwd=REPO, env=env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = {}
        for case in ET.parse(junit).iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            failed = case.find("failure") if case.find("failure") is not None else case.find("error")
            skipped = case.find("skipped")
            outcome = "failed" if failed is not None else "skipped" if skipped is not None else "passed"
            out[name] = {"outcome": outcome, "seconds": round(float(case.get("time", 0)), 2),
                         "message": (failed.get("message") or "")[:300] if failed is not None else ""}
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="leave out the slow learning tests (SmolLM2)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "learning_robustness.json"))
    args = ap.parse_args()
    marker = "learning and not slow" if args.fast else "learning"
    t0 = time.time()
    runs = {}
    for seed in SEEDS:
        for threads in THREADS:
            key = f"seed={seed},threads={threads}"
            runs[key] = run_config(seed, threads, marker)
            failed = [t for t, r in runs[key].items() if r["outcome"] == "failed"]
            print(f"{key}: {len(runs[key])} test(s), {len(failed)} failed {failed or ''}", flush=True)
    tests = sorted({t for r in runs.values() for t in r})
    table = {t: {k: runs[k].get(t, {}).get("outcome", "missing") for k in runs} for t in tests}
    result = {"marker": marker, "configurations": list(runs), "seconds": round(time.time() - t0, 1),
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "all_passed": all(v == "passed" for row in table.values() for v in row.values()),
              "tests": table, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(tests)} learning test(s) x {len(runs)} configuration(s): "
          f"{'all passed' if result['all_passed'] else 'FAILURES, see ' + args.out}")


if __name__ == "__main__":
    main()
