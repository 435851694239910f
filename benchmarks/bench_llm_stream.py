"""The streaming LLM path against the per-shard actor path it replaced, side by side in
one run (issue "the LLM data plane").

Both arms run the same `rexeval extract` job (triplets, the shared CSV's reviews, the
local profile's SmolLM2) with its calls going to the judge Serve deployment on this
machine (`--backend serve`): the streaming path from this checkout, the old path from a
git worktree of `--baseline` (default d7bcde6, the last commit before the change). Each
arm is its own process with its own Ray and judge app, run one after the other.

Both arms get `cpus_per_worker=0.5`: at its defaults the old path asks for an actor
holding every CPU of the node, which never schedules beside the judge replica's CPU (it
waits forever; the streaming path's Serve clients hold no CPU).

Reported: wall seconds of each run (the job only, not Ray's or Serve's start), reviews
per second, the ratio (streaming / old, target >= 1.0), and the driver's peak RSS at 1x
and 10x input for the streaming path (with a scripted judge model, so 10x stays quick;
target: the 10x peak within 1.5x of the 1x peak).

    python benchmarks/bench_llm_stream.py --n 48           # writes results/llm_stream.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")  # the venv's, whether or not it is on PATH
sys.path.insert(0, str(REPO))
from benchmarks.bench_cluster_storage import CSV, run_measured  # noqa: E402

DRIVER = textwrap.dedent('''
    import json, sys, time
    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.extract.config import ExtractConfig
    from rexeval.pipelines.extract.pipeline import run_extract
    from rexeval.models.llm.base import BackendSpec
    from rexeval.serve.judge import JudgeServeConfig, start_judge_service
    args = json.loads(sys.argv[1])
    init_ray(num_cpus=2)
    model = BackendSpec(**args["judge"])
    start_judge_service(JudgeServeConfig(backend=model, cache=None, num_cpus=1), port=args["port"])
    cfg = ExtractConfig(input=args["input"], out=args["out"], backend="serve", limit=args["n"],
                        backend_options={"address": "serve:rexeval-judge"}, models={"embedder": "none"},
                        use_cache=False, shard_size=8, cpus_per_worker=0.5, domain="instruments")
    t0 = time.perf_counter()
    m = run_extract(cfg, progress=lambda s: None)
    open(args["result"], "w").write(json.dumps({"seconds": time.perf_counter() - t0, "counts": m["counts"]}))
''')


def run_arm(tree: Path, ingest: Path, out: Path, n: int, judge: dict, port: int) -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(tree)}
    result = out.parent / f"result-{out.name}.json"
    args = json.dumps({"input": str(ingest), "out": str(out), "n": n, "judge": judge, "port": port,
                       "result": str(result)})
    script = out.parent / f"driver-{out.name}.py"
    script.write_text(DRIVER)
    # In the tree: Ray puts the driver's working directory first on its workers' path,
    # so the workers import that tree's rexeval (the driver's, via PYTHONPATH).
    measured = run_measured([sys.executable, str(script), args], env, cwd=tree)
    subprocess.run([RAY, "stop", "--force"], capture_output=True)
    job = json.loads(result.read_text())
    if not job["counts"].get("llm_calls"):
        raise RuntimeError(f"{out.name}: the job made no LLM call, so it measures nothing: {job['counts']}")
    return {**measured, "job_seconds": round(job["seconds"], 2), "counts": job["counts"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=48, help="reviews in the throughput runs")
    ap.add_argument("--baseline", default="d7bcde6")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "llm_stream.json"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    base = tmp / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base), a.baseline], check=True)
    try:
        ingest = tmp / "ingest"
        subprocess.run([sys.executable, "-m", "rexeval.ray_jobs.cli", "ingest", str(CSV), "--out", str(ingest)],
                       check=True, capture_output=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        subprocess.run([RAY, "stop", "--force"], capture_output=True)
        smol = {"backend": "hf", "model": "SmolLM2-135M-Instruct"}
        old = run_arm(base, ingest, tmp / "old", a.n, smol, 8011)
        new = run_arm(REPO, ingest, tmp / "new", a.n, smol, 8012)
        scripted = {"backend": "tests.doubles.llm:ScriptedLLM", "model": "scripted",
                    "options": {"default": '[{"statement": "the strings last", "topic": "durability", '
                                           '"sentiment": "positive"}]'}}
        m1 = run_arm(REPO, ingest, tmp / "m1", 40, scripted, 8013)
        m10 = run_arm(REPO, ingest, tmp / "m10", 400, scripted, 8014)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    result = {
        "command": "python benchmarks/bench_llm_stream.py --n %d" % a.n, "baseline": a.baseline,
        "throughput": {"reviews": a.n, "old_s": old["job_seconds"], "stream_s": new["job_seconds"],
                       "old_reviews_per_s": round(a.n / old["job_seconds"], 3),
                       "stream_reviews_per_s": round(a.n / new["job_seconds"], 3),
                       "ratio": round(old["job_seconds"] / new["job_seconds"], 3),
                       "same_counts": old["counts"] == new["counts"]},
        "driver_peak_mib": {"1x": m1["driver_peak_mib"], "10x": m10["driver_peak_mib"],
                            "ratio": round(m10["driver_peak_mib"] / m1["driver_peak_mib"], 3)},
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
