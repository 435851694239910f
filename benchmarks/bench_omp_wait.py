"""Two jobs at once on one machine, with torch's OpenMP threads spinning or sleeping
while they wait: the evidence behind `pipelines.core.runtime.OMP_WAIT` (a local Ray's
workers, and the CLI's driver, run with OMP_WAIT_POLICY=PASSIVE unless the user set it).

The job is the real-LLM test's work: the shared reviews ingested, then `generate llm`
with all five prompted methods on two interactions (SmolLM2-135M on the hf backend,
BiasedMF's Tune trial included). Each arm starts COPIES such jobs at once, each a
process with its own local Ray (as two test workers, or two users' jobs, on one
machine), then reports every job's wall time; one job alone is the reference.

Arms: "active" (OMP_WAIT_POLICY=ACTIVE: threads spin while they wait) and "passive"
(rexeval's default), each set in the job's process and, through `init_ray`, its workers.

    .venv/bin/python -m benchmarks.bench_omp_wait     # the active arm: over 6 min on 2 cores

Results: benchmarks/results/omp_wait.json.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_CSV = Path(os.environ.get("REXEVAL_SHARED", REPO.parent / "shared")) / "data" / \
    "amazon_musical_instruments_2014_part.csv"

JOB = r"""
import sys, time
from pathlib import Path
t0 = time.time()
from tests.pipelines.generate.prompted.test_real_llm import _job
from rexeval.pipelines.core.runtime import init_ray
from rexeval.pipelines.generate.prompted.job import run_prompted
from rexeval.pipelines.ingest.config import IngestConfig
from rexeval.pipelines.ingest.pipeline import run_ingest
init_ray(num_cpus=2)
root = Path(sys.argv[2])
run_ingest(IngestConfig(inputs=[sys.argv[1]], out=str(root / "ingest"), category="instruments"), progress=lambda m: None)
run_prompted(_job(root, root / "llm.sqlite"), progress=lambda m: None)
print("SECONDS", round(time.time() - t0, 1))
"""


def run_jobs(copies: int, policy: str | None) -> list[float]:
    """`copies` jobs started at once; each one's wall time (s)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(copies):
            procs.append(subprocess.Popen([sys.executable, "-c", JOB, str(SHARED_CSV), f"{tmp}/job{i}"], cwd=REPO,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        times = []
        for p in procs:
            out, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"a job failed:\n{err[-3000:]}")
            times.append(float(out.rsplit("SECONDS", 1)[1].split()[0]))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=2, help="jobs at once per arm (default 2)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "omp_wait.json"))
    args = ap.parse_args()
    t0 = time.time()
    alone = run_jobs(1, "PASSIVE")[0]
    passive = run_jobs(args.copies, "PASSIVE")
    spin = run_jobs(args.copies, "ACTIVE")
    res = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "copies": args.copies,
           "alone_s": alone, "passive_s": passive, "active_s": spin,
           "active_over_passive": round(max(spin) / max(passive), 2), "bench_s": round(time.time() - t0, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
