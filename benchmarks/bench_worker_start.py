"""What a Ray worker's start costs on a local Ray, with the job's variables given to the
workers as a runtime env or inherited from the raylet: the evidence behind `init_ray`
putting a local Ray's variables into the starting process's environment.

A runtime env, even one of variables alone, makes Ray start each worker through its
setup process (`ray/_private/workers/setup_worker.py`: an interpreter that imports Ray,
then execs the worker, which imports it again). Every actor pool, every task worker of a
new job, every stage's driver joining a study's Ray pays it once per process.

Each arm is a process with its own local Ray (2 CPUs) that starts WORKERS fresh workers
(tasks with `max_calls=1`, so none is reused) and reports the wall time and the CPU time
the whole machine spent meanwhile (/proc/stat). Arms alternate, ROUNDS times:

  * "runtime_env": the variables as `ray.init(runtime_env={"env_vars": ...})` (rexeval
    before this change);
  * "inherited": `rexeval.pipelines.core.runtime.init_ray`, as the product starts Ray.

    .venv/bin/python -m benchmarks.bench_worker_start     # ~1.5 min on 2 cores

Results: benchmarks/results/worker_start.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ARM = r"""
import json, os, sys, time
import ray
arm, n = sys.argv[1], int(sys.argv[2])
if arm == "inherited":
    from rexeval.pipelines.core.runtime import init_ray
    init_ray(num_cpus=2)
else:
    from rexeval.pipelines.core.runtime import OMP_WAIT, _project_root
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        "RAY_AUTH_MODE": "disabled", "PYTHONPATH": _project_root(), "OMP_WAIT_POLICY": OMP_WAIT}})

@ray.remote(max_calls=1)
def fresh():
    return os.environ.get("OMP_WAIT_POLICY"), os.getpid()

def machine_cpu():
    fields = open("/proc/stat").readline().split()[1:4]  # user, nice, system
    return sum(map(int, fields)) / os.sysconf("SC_CLK_TCK")

ray.get(fresh.remote())  # the first worker, and Ray's own start, are not counted
c0, t0 = machine_cpu(), time.perf_counter()
out = ray.get([fresh.remote() for _ in range(n)])
wall, cpu = time.perf_counter() - t0, machine_cpu() - c0
assert len({pid for _, pid in out}) == n and {v for v, _ in out} == {"PASSIVE"}, out
print("RESULT", json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}))
"""


def run_arm(arm: str, workers: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OMP_WAIT_POLICY")}
    env["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.run([sys.executable, "-c", ARM, arm, str(workers)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"{arm} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=40, help="fresh workers per arm and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "worker_start.json"))
    a = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {"runtime_env": [], "inherited": []}
    for r in range(a.rounds):
        for arm in runs:
            runs[arm].append(run_arm(arm, a.workers))
            print(f"round {r + 1}: {arm}: {runs[arm][-1]}", flush=True)
    med = {arm: {k: statistics.median(x[k] for x in v) for k in ("wall_s", "cpu_s")} for arm, v in runs.items()}
    res = {
        "command": "python -m benchmarks.bench_worker_start" + "".join(
            f" --{k} {v}" for k, v in (("workers", a.workers), ("rounds", a.rounds))),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workers": a.workers, "runs": runs, "median": med,
        "cpu_per_worker_s": {arm: round(m["cpu_s"] / a.workers, 3) for arm, m in med.items()},
        "cpu_ratio_runtime_env_to_inherited": round(med["runtime_env"]["cpu_s"] / med["inherited"]["cpu_s"], 2),
        "wall_ratio_runtime_env_to_inherited": round(med["runtime_env"]["wall_s"] / med["inherited"]["wall_s"], 2),
    }
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("median", "cpu_per_worker_s", "cpu_ratio_runtime_env_to_inherited",
                                          "wall_ratio_runtime_env_to_inherited")}, indent=2))
    return res


if __name__ == "__main__":
    main()
