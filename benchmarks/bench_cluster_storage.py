"""Storage by URI, measured side by side in one run (issue "rexeval on a real cluster").

A. The local study (`studies/local.yaml`, the local profile) run twice, one after the
   other: into a local folder, and into an S3 bucket (an S3 endpoint on 127.0.0.1:
   moto's threaded server, as in the tests). Reported: wall time of each, the ratio, and
   the bytes and objects each run wrote (for S3: what it uploaded), and whether the two
   runs' tables are identical.
B. The driver's peak memory (its own RSS, polled every 20 ms; not the raylet's or the
   workers') for `rexeval ingest` of the shared CSV at 1x and at 10x its rows, and for
   `rexeval extract --limit 2` on each of those ingested folders. Nothing large passes
   through the driver, so the 10x peak must stay within 1.5x the 1x peak.

    python benchmarks/bench_cluster_storage.py            # writes results/cluster_storage.json
    python benchmarks/bench_cluster_storage.py --skip-study
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("REXEVAL_SHARED", REPO.parent / "shared"))
CSV = SHARED / "data" / "amazon_musical_instruments_2014_part.csv"
REXEVAL = str(Path(sys.executable).parent / "rexeval")


def run_measured(cmd: list[str], env: dict[str, str], cwd: str | Path | None = None) -> dict:
    """Run `cmd` (in `cwd`); its wall time and the peak RSS of that process alone."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def poll():
        p = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak[0] = max(peak[0], p.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    out, _ = proc.communicate()
    t.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-4000:]}")
    return {"seconds": round(time.perf_counter() - t0, 2), "driver_peak_mib": round(peak[0] / 2**20, 1)}


def stored(root: str) -> dict:
    from rexeval.storage import location

    files = location(root).walk_files()
    return {"objects": len(files), "bytes": sum(f.size() for f in files)}


def study_side_by_side(tmp: Path, base_env: dict[str, str]) -> dict:
    from tests.doubles.s3 import fresh_prefix, s3_server
    from tests.ray_jobs.test_no_shared_disk import tables_of

    res: dict = {}
    local_out = str(tmp / "study-local")
    res["local_disk"] = run_measured([REXEVAL, "study", "run", "studies/local.yaml", "--out", local_out],
                                     base_env) | stored(local_out)
    with s3_server() as s3env:
        os.environ.update(s3env)
        s3_out = fresh_prefix() + "/study-local"
        res["s3"] = run_measured([REXEVAL, "study", "run", "studies/local.yaml", "--out", s3_out],
                                 {**base_env, **s3env}) | stored(s3_out)
        here, there = tables_of(local_out), tables_of(s3_out)
        res["tables"] = len(here)
        res["identical"] = sorted(here) == sorted(there) and all(there[k].equals(v) for k, v in here.items())
    res["time_ratio_s3_over_local"] = round(res["s3"]["seconds"] / res["local_disk"]["seconds"], 3)
    return res


def replicate(rows_x: int, dst: Path) -> Path:
    from benchmarks.bench_ingest_split import replicate as copy_rows

    lines = sum(1 for _ in CSV.open("rb"))
    copy_rows(CSV, dst, lines * rows_x)
    return dst


def driver_memory(tmp: Path, env: dict[str, str]) -> dict:
    res: dict = {}
    for x in (1, 10):
        src = CSV if x == 1 else replicate(x, tmp / f"reviews_{x}x.csv")
        ing, ext = tmp / f"ingest_{x}x", tmp / f"extract_{x}x"
        res[f"ingest_{x}x"] = run_measured([REXEVAL, "ingest", str(src), "--out", str(ing)], env)
        res[f"ingest_{x}x"]["reviews_in"] = json.loads((ing / "manifest.json").read_text())["counts"]["in"]
        res[f"extract_{x}x"] = run_measured([REXEVAL, "extract", str(ing), "--out", str(ext), "--limit", "2",
                                             "--shard-size", "2"], env)
    for job in ("ingest", "extract"):
        res[f"{job}_peak_ratio_10x_over_1x"] = round(res[f"{job}_10x"]["driver_peak_mib"]
                                                     / res[f"{job}_1x"]["driver_peak_mib"], 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-study", action="store_true", help="Only part B (driver memory).")
    ap.add_argument("--skip-memory", action="store_true", help="Only part A (local disk vs S3).")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "cluster_storage.json"))
    args = ap.parse_args()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "REXEVAL_SHARED": str(SHARED), "RAY_USAGE_STATS_ENABLED": "0"}
    os.chdir(REPO)
    result: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    with tempfile.TemporaryDirectory(prefix="rexeval-bench-") as tmp:
        # A fresh LLM-call cache (the extract runs must call the model, not a warm cache);
        # converted models are shared with the user's cache.
        from rexeval.models.gguf_cache import models_cache_dir

        cache = Path(tmp) / "cache"
        cache.mkdir()
        models_cache_dir().mkdir(parents=True, exist_ok=True)
        (cache / "models").symlink_to(models_cache_dir().resolve(), target_is_directory=True)
        env["REXEVAL_CACHE"] = str(cache)
        if not args.skip_study:
            result["study"] = study_side_by_side(Path(tmp), env)
            print(json.dumps(result["study"], indent=2))
        if not args.skip_memory:
            result["driver_memory"] = driver_memory(Path(tmp), env)
            print(json.dumps(result["driver_memory"], indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
