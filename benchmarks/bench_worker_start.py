"""What a Ray worker's start costs on a local Ray, with the job's variables given to the
workers as a runtime env or inherited from the raylet: the evidence behind `init_ray`
putting a local Ray's variables into the starting process's environment.

A runtime env, even one of variables alone, makes Ray start each worker through its
setup process (`ray/_private/workers/setup_worker.py`: an interpreter that imports Ray,
then execs the worker, which imports it again). Every actor pool, every task worker of a
new job, every step's driver joining a study's Ray pays it once per process.

Each arm is a process with its own local Ray (2 CPUs) that starts WORKERS fresh workers
(tasks with `max_calls=1`, so none is reused) and reports the wall time and the CPU time
the whole machine spent meanwhile (/proc/stat). Arms alternate, ROUNDS times:

  * "runtime_env": the variables as `ray.init(runtime_env={"env_vars": ...})` (rexeval
    before this change);
  * "inherited": `rexeval.pipelines.core.runtime.init_ray`, as the product starts Ray.

    .venv/bin/python -m benchmarks.bench_worker_start     # ~6 min on 2 cores

A second part counts the workers started: the shared reviews ingested in 1 MB chunks
(a task each) and split, and the embedded sample ingested and clustered (EXTRA), ROUNDS
times in one local Ray, with Ray's default of as many idle
workers kept as CPUs (RAY_num_workers_soft_limit=2, exported) or `init_ray`'s
(`runtime.idle_workers_kept`: 8 on 2 CPUs), each in its own process.

A third part prices the other side of keeping workers: 8 workers left idle (as a
local Ray keeps them), their own CPU over `--idle-s` seconds, per worker and minute, and
how many minutes of idling cost what one worker's start costs.

Results: benchmarks/results/worker_start.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

from benchmarks.subprocess_run import script_result

REPO = Path(__file__).resolve().parents[1]
SHARED_CSV = Path(os.environ.get("REXEVAL_SHARED", REPO.parent / "shared")) / "data" / \
    "amazon_musical_instruments_2014_part.csv"

# Both scripts' measure: the CPU the whole machine has spent (they run in the checkout).
MACHINE_CPU = r"""
from benchmarks.machine_cpu import machine_cpu_s as machine_cpu
"""

ARM = MACHINE_CPU + r"""
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

ray.get(fresh.remote())  # the first worker, and Ray's own start, are not counted
c0, t0 = machine_cpu(), time.perf_counter()
out = ray.get([fresh.remote() for _ in range(n)])
wall, cpu = time.perf_counter() - t0, machine_cpu() - c0
assert len({pid for _, pid in out}) == n and {v for v, _ in out} == {"PASSIVE"}, out
print("RESULT", json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}))
"""


CHURN = MACHINE_CPU + r"""
import glob, json, os, sys, time
from rexeval.pipelines.core.runtime import init_ray
from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.pipelines.paraphrase.pipeline import run_cluster
from rexeval.pipelines.ingest.config import IngestConfig, SplitConfig
from rexeval.pipelines.ingest.pipeline import run_ingest
from rexeval.pipelines.ingest.split_pipeline import run_split
ray = init_ray(num_cpus=2)
root, rounds = sys.argv[1], int(sys.argv[2])
logs = ray._private.worker._global_node.get_logs_dir_path()

def started():
    return len(glob.glob(os.path.join(logs, "**", "python-core-worker-*"), recursive=True))

quiet = lambda m: None
sample = os.path.join("pipelines", "sample")
w0, c0, t0 = started(), machine_cpu(), time.perf_counter()
for r in range(rounds):
    out = os.path.join(root, str(r))
    # The shared CSV in 1 MB chunks: a task per chunk, more at once than 2 CPUs.
    run_ingest(IngestConfig(inputs=[sys.argv[3]], out=out + "/shared", chunk_mb=1, category="instruments"),
               progress=quiet)
    run_split(SplitConfig(input=out + "/shared", out=out + "/split"), progress=quiet)
    run_ingest(IngestConfig(inputs=[os.path.join(sample, "reviews.jsonl")], meta=[os.path.join(sample, "items.jsonl")],
                            out=out + "/ingest"), progress=quiet)
    run_cluster(ClusterConfig(input=out + "/ingest", out=out + "/extra", method="extra", extra_min_count=1),
                progress=quiet)
print("RESULT", json.dumps({"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(machine_cpu() - c0, 2),
                            "workers_started": started() - w0}))
"""


IDLE = r"""
import json, os, sys, time
import psutil
import ray
from rexeval.pipelines.core.runtime import init_ray
init_ray(num_cpus=2)
n, seconds = int(sys.argv[1]), float(sys.argv[2])

@ray.remote(num_cpus=0)
def hold():
    time.sleep(1.0)  # at once on n workers: n distinct processes
    return os.getpid()

workers = [psutil.Process(pid) for pid in set(ray.get([hold.remote() for _ in range(n)]))]
time.sleep(5)  # their returns settled; Ray keeps them (runtime.idle_workers_kept)

def cpu(p):
    t = p.cpu_times()
    return t.user + t.system

before = [cpu(p) for p in workers]
time.sleep(seconds)
spent = sum(cpu(p) - c for p, c in zip(workers, before))
titles = {p.name() for p in workers}
print("RESULT", json.dumps({"workers": len(workers), "seconds": seconds, "cpu_s": round(spent, 2), "titles": sorted(titles),
                            "cpu_s_per_worker_minute": round(spent / len(workers) * 60 / seconds, 3)}))
"""


def run_idle(workers: int, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_num_workers_soft_limit")}
    env["RAY_AUTH_MODE"] = "disabled"
    return script_result(IDLE, [str(workers), str(seconds)], env, "idle")


def run_churn(arm: str, rounds: int) -> dict:
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_num_workers_soft_limit")}
    env.update(RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if arm == "ray_default":
        env["RAY_num_workers_soft_limit"] = "2"  # Ray's default on 2 CPUs: the CPU count
    with tempfile.TemporaryDirectory() as tmp:
        return script_result(CHURN, [tmp, str(rounds), str(SHARED_CSV)], env, f"churn {arm}")


def run_arm(arm: str, workers: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OMP_WAIT_POLICY")}
    env["RAY_AUTH_MODE"] = "disabled"
    return script_result(ARM, [arm, str(workers)], env, arm)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=40, help="fresh workers per arm and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=60.0, help="seconds the kept idle workers are watched")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "worker_start.json"))
    a = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {"runtime_env": [], "inherited": []}
    for r in range(a.rounds):
        for arm in runs:
            runs[arm].append(run_arm(arm, a.workers))
            print(f"round {r + 1}: {arm}: {runs[arm][-1]}", flush=True)
    churn: dict[str, list[dict]] = {"ray_default": [], "kept": []}
    for r in range(a.rounds):
        for arm in churn:
            churn[arm].append(run_churn(arm, a.rounds))
            print(f"round {r + 1}: idle workers {arm}: {churn[arm][-1]}", flush=True)
    idle = run_idle(8, a.idle_s)
    print(f"idle: {idle}", flush=True)
    med = {arm: {k: statistics.median(x[k] for x in v) for k in ("wall_s", "cpu_s")} for arm, v in runs.items()}
    churn_med = {arm: {k: statistics.median(x[k] for x in v) for k in ("wall_s", "cpu_s", "workers_started")}
                 for arm, v in churn.items()}
    res = {
        "command": "python -m benchmarks.bench_worker_start" + "".join(
            f" --{k} {v}" for k, v in (("workers", a.workers), ("rounds", a.rounds))),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workers": a.workers, "runs": runs, "median": med,
        "cpu_per_worker_s": {arm: round(m["cpu_s"] / a.workers, 3) for arm, m in med.items()},
        "cpu_ratio_runtime_env_to_inherited": round(med["runtime_env"]["cpu_s"] / med["inherited"]["cpu_s"], 2),
        "wall_ratio_runtime_env_to_inherited": round(med["runtime_env"]["wall_s"] / med["inherited"]["wall_s"], 2),
        "idle_workers": {"job": "ingest (1 MB chunks) + split of the shared reviews, ingest + cluster (EXTRA) of the "
                                "embedded sample, --rounds times in one Ray",
                         "runs": churn, "median": churn_med,
                         "cpu_ratio_ray_default_to_kept": round(
                             churn_med["ray_default"]["cpu_s"] / churn_med["kept"]["cpu_s"], 2)},
    }
    start_s = res["cpu_per_worker_s"]["inherited"]
    res["kept_idle"] = {
        "job": "8 workers left idle in a local Ray started as the product starts it, their own CPU watched",
        **idle,
        # How long a kept worker may wait before its idling has cost what starting a new one costs.
        "idle_minutes_that_cost_one_start": round(start_s / max(idle["cpu_s_per_worker_minute"], 1e-9), 1)}
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("median", "cpu_per_worker_s", "cpu_ratio_runtime_env_to_inherited",
                                          "wall_ratio_runtime_env_to_inherited")}, indent=2))
    print(json.dumps({k: res["idle_workers"][k] for k in ("median", "cpu_ratio_ray_default_to_kept")}, indent=2))
    print(json.dumps(res["kept_idle"], indent=2))
    return res


if __name__ == "__main__":
    main()
