"""Small sharded jobs as Ray tasks or as an actor pool: the evidence behind
`pipelines.core.runtime.run_tasks` running a job with no more shards than workers as
Ray tasks.

A job's stage imports torch and transformers when it sets up (as the NLI, embedding
and generator stages do). An actor pool starts a fresh worker process per actor, so
every job pays those imports again; Ray tasks run on the session's pooled worker
processes, which keep their imports from the jobs before. Many jobs in one Ray session
are small (a study's steps, a test session, a resumed run with a shard or two left).

One Ray session (2 CPUs), jobs of 2 shards each, in two orders:
- "in a row": JOBS actor-pool jobs, then JOBS task jobs (a test session's or a study's
  run of small jobs);
- "alternating": one of each, JOBS times. Starting actors takes the CPUs' worker slots,
  and Ray ends idle workers beyond the CPU count, so the task jobs find no warm worker:
  the case where tasks gain nothing, shown to be no loss either.
Per order and mode: the first job's time and the median of the others.

    .venv/bin/python -m benchmarks.bench_small_jobs       # ~1 min on 2 cores

Results: benchmarks/results/small_jobs.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import pyarrow as pa

from rexeval.pipelines.core.runtime import init_ray, map_stage, map_stage_tasks
from rexeval.pipelines.core.stage import Resources, Stage

REPO = Path(__file__).resolve().parents[1]


class ImportsLikeAJob(Stage):
    """Sets up as a model stage does (torch and transformers imported), writes nothing."""
    name = "imports_like_a_job"
    resources = Resources(cpus=1)
    batch_size = 1

    def setup(self):
        import torch  # noqa: F401
        import transformers  # noqa: F401

    def process(self, batch):
        return pa.table({"shard": batch.column("shard")})


def one_job(mode: str, shards: int) -> float:
    import ray

    started = time.perf_counter()
    ds = ray.data.from_items([{"shard": i} for i in range(shards)], override_num_blocks=shards)
    ds = (map_stage_tasks(ds, ImportsLikeAJob(), shards) if mode == "tasks"
          else map_stage(ds, ImportsLikeAJob(), shards))
    assert sorted(r["shard"] for r in ds.iter_rows()) == list(range(shards))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6, help="jobs per mode")
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args()
    init_ray(num_cpus=2)
    orders = {"in_a_row": [m for m in ("actors", "tasks") for _ in range(args.jobs)],
              "alternating": [m for _ in range(args.jobs) for m in ("actors", "tasks")]}
    summary: dict = {}
    for order, modes in orders.items():
        times: dict[str, list[float]] = {"actors": [], "tasks": []}
        for mode in modes:
            times[mode].append(one_job(mode, args.shards))
            print(f"{order:12s} {mode:6s} {times[mode][-1]:.2f} s", flush=True)
        summary[order] = {mode: {"first_s": round(t[0], 3), "median_after_first_s": round(statistics.median(t[1:]), 3),
                                 "all_s": [round(x, 3) for x in t]} for mode, t in times.items()}
        summary[order]["actors_over_tasks"] = round(
            summary[order]["actors"]["median_after_first_s"] / summary[order]["tasks"]["median_after_first_s"], 2)
    result = {"machine": {"cpus": 2, "platform": platform.platform(), "python": platform.python_version()},
              "params": {"jobs_per_mode": args.jobs, "shards": args.shards},
              **summary}
    out = REPO / "benchmarks" / "results" / "small_jobs.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
