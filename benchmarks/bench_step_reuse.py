"""What keeping a finished step's process for the study's next step saves
(`pipelines/study/step_process.StepPool`), side by side in one run.

A study on a laptop runs each step in a driver process of its own, a Ray job of its
own. A fresh job has no workers: every step's first tasks and actors start new worker
processes (each imports Ray and the step's libraries, about a second of CPU), and the
driver joins the cluster again. A kept process stays the same Ray job, so the next step
finds the workers the last one left idle.

Each arm is a fresh interpreter that runs the demo study without its LLM steps
(`studies/demo.yaml --set llm=false`: ingest, split, Table II, clusters, the STAR
benchmark and ExpGCN, PETER trained and decoded, seed 000's metrics; 13 steps, two at
a time) on its own local Ray (2 CPUs), and reports the wall time, the CPU the whole
machine spent (/proc/stat), and the step processes the steps ran in:

  * "fresh": a new process for every step (rexeval before the pool: `StepPool.take`
    finds nothing);
  * "kept": the study as it runs now.

The arms alternate, ROUNDS times; the medians and their ratios are the result.

    .venv/bin/python -m benchmarks.bench_step_reuse          # ~5 min on 2 cores

Results: benchmarks/results/step_reuse.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from benchmarks.subprocess_run import script_result

REPO = Path(__file__).resolve().parents[1]

ARM = r"""
import json, re, sys, time
from pathlib import Path
from benchmarks.machine_cpu import machine_cpu_s
from rexeval.pipelines.core.runtime import init_ray
from rexeval.pipelines.study import step_process
from rexeval.pipelines.study.config import load_study
from rexeval.pipelines.study.plan import build_plan
from rexeval.pipelines.study.runner import run_study

arm, out = sys.argv[1], Path(sys.argv[2])
if arm == "fresh":
    step_process.StepPool.take = lambda self, call: None
init_ray(num_cpus=2)  # Ray's own start is not counted
study = Path("studies/demo.yaml")
plan = build_plan(load_study(study, sets={"llm": False, "evaluate_skip": ["st2exp"]}), study, out)
c0, t0 = machine_cpu_s(), time.perf_counter()
res = run_study(plan, progress=lambda line: None, show_plan=False, steps_as="process")
wall, cpu = time.perf_counter() - t0, machine_cpu_s() - c0
assert not res["failed"], res["failed"]
pids = set()
for log in (out / "logs").glob("*.log"):
    pids.update(re.findall(r"pid (\d+): step ", log.read_text(errors="replace")))
print("RESULT", json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "steps": len(res["ran"]),
                            "step_processes": len(pids)}))
"""


def run_arm(arm: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REXEVAL_LOCAL_RAY")}
    env.update(RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory() as tmp:
        return script_result(ARM, [arm, tmp], env, arm, timeout=1200)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_reuse.json"))
    a = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {"fresh": [], "kept": []}
    for r in range(a.rounds):
        for arm in runs:
            runs[arm].append(run_arm(arm))
            print(f"round {r + 1}: {arm}: {runs[arm][-1]}", flush=True)
    med = {arm: {k: statistics.median(x[k] for x in v) for k in ("wall_s", "cpu_s", "step_processes")}
           for arm, v in runs.items()}
    res = {
        "command": f"python -m benchmarks.bench_step_reuse --rounds {a.rounds}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "study": "studies/demo.yaml --set llm=false (13 steps, max_parallel 2)",
        "runs": runs, "median": med,
        "cpu_ratio_fresh_to_kept": round(med["fresh"]["cpu_s"] / med["kept"]["cpu_s"], 2),
        "wall_ratio_fresh_to_kept": round(med["fresh"]["wall_s"] / med["kept"]["wall_s"], 2),
    }
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("median", "cpu_ratio_fresh_to_kept", "wall_ratio_fresh_to_kept")},
                     indent=2))
    return res


if __name__ == "__main__":
    main()
