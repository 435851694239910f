"""Ingest + temporal split on the shared Kaggle CSV replicated to >= 1M rows.

Side by side in one run, each in its own process so memory is measured apart:
- rexeval: `run_ingest` (Ray Data actor pools, chunked, validated, deduplicated,
  resumable shards) then `run_split` (temporal 80/10/10 with cold-start removal);
- reference: one process of plain pandas/pyarrow doing the same parsing and checks
  (required fields, empty text, numeric rating in range, integer timestamp, review id
  hash, duplicates) and the same split, with no sharding, manifest or error rows.

Reports rows/s, wall time, peak memory of the whole process tree (driver, raylet,
workers; summed RSS and summed PSS) and the speed ratio rexeval / reference. Target:
ratio >= 0.5 and peak < 4 GiB.

    python benchmarks/bench_ingest_split.py --rows 1000000
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
DEFAULT_CSV = REPO.parent / "shared" / "data" / "amazon_musical_instruments_2014_part.csv"


def replicate(src: Path, dst: Path, rows: int) -> int:
    """Copy the CSV until it has `rows` rows; each copy renames its users so rows stay distinct."""
    lines = src.read_bytes().splitlines(keepends=True)
    n = 0
    with open(dst, "wb") as out:
        k = 0
        while n < rows:
            suffix = f"R{k:04d}".encode()
            for line in lines:
                comma = line.index(b",")
                out.write(line[:comma] + suffix + line[comma:])
            n += len(lines)
            k += 1
    return n


def run_rexeval(csv: str, out: str) -> dict:
    sys.path.insert(0, str(REPO))
    import shutil

    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.config import IngestConfig
    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.ingest.split_pipeline import run_split
    from rexeval.pipelines.ingest.config import SplitConfig

    shutil.rmtree(out, ignore_errors=True)  # measure a cold run, not a resume
    t0 = time.perf_counter()
    init_ray()
    t_ray = time.perf_counter() - t0
    m = run_ingest(IngestConfig(inputs=[csv], out=f"{out}/ingest"), progress=lambda s: None)
    t_ing = time.perf_counter() - t0
    s = run_split(SplitConfig(input=f"{out}/ingest", out=f"{out}/split"), progress=lambda s: None)
    return {"seconds": time.perf_counter() - t0, "ray_start_s": t_ray, "ingest_s": t_ing - t_ray,
            "split_s": time.perf_counter() - t0 - t_ing, "reviews": m["counts"]["out"],
            "errors": m["counts"]["errors"], "train": s["counts"]["train"],
            "valid": s["counts"]["valid"], "test": s["counts"]["test"]}


def run_reference(csv: str) -> dict:
    """The straightforward single-process version of the same work."""
    import hashlib

    import numpy as np
    import pandas as pd

    t0 = time.perf_counter()
    names = ["reviewerID", "asin", "reviewerName", "helpful", "reviewText", "overall", "summary",
             "unixReviewTime", "reviewTime"]
    df = pd.read_csv(csv, header=None, names=names, dtype=str, keep_default_na=False,
                     encoding_errors="replace", on_bad_lines="skip", engine="c")
    ok = pd.Series(True, index=df.index)
    for col in ("reviewerID", "asin", "reviewText", "overall", "unixReviewTime"):
        ok &= df[col].str.strip().str.len() > 0
    rating = pd.to_numeric(df["overall"], errors="coerce")
    ok &= rating.between(1, 5)
    ts = pd.to_numeric(df["unixReviewTime"], errors="coerce")
    ok &= ts.notna()
    df = df[ok].assign(rating=rating[ok].astype("float32"), timestamp=ts[ok].astype("int64"))
    df["review_id"] = [hashlib.blake2b(f"{u}\x1f{i}\x1f{t}".encode(), digest_size=8).hexdigest()
                       for u, i, t in zip(df["reviewerID"], df["asin"], df["timestamp"])]
    df = df[~df["review_id"].duplicated()]
    df["line"] = np.arange(len(df))
    # Temporal split: users with >= 5 reviews, floor(0.8 n) / floor(0.9 n), cold-start removal.
    df = df.sort_values(["reviewerID", "timestamp", "line"], kind="stable")
    g = df.groupby("reviewerID", sort=False)
    n = g["line"].transform("size").to_numpy()
    pos = g.cumcount().to_numpy()
    keep = n >= 5
    seg = (pos >= n * 8 // 10).astype(int) + (pos >= n * 9 // 10)
    train = df[keep & (seg == 0)]
    warm = set(train["asin"])
    valid = df[keep & (seg == 1)]
    valid = valid[valid["asin"].isin(warm)]
    test = df[keep & (seg == 2)]
    test = test[test["asin"].isin(warm)]
    return {"seconds": time.perf_counter() - t0, "reviews": len(df), "train": len(train),
            "valid": len(valid), "test": len(test)}


def _measure(cmd: list[str]) -> tuple[dict, float, float]:
    """Run a child process and sample its whole process tree (driver, raylet, workers).

    Returns (result, peak summed RSS GiB, peak summed PSS GiB). Summed RSS counts pages
    shared between processes (libraries, the object store) once per process; PSS
    splits them among their sharers, so it is the tree's real footprint.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    peak = peak_pss = 0
    stop = threading.Event()

    def sample():
        nonlocal peak, peak_pss
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                rss = pss = 0
                for p in procs:
                    try:
                        info = p.memory_full_info()
                        rss += info.rss
                        pss += getattr(info, "pss", info.rss)
                    except psutil.Error:
                        pass
                peak, peak_pss = max(peak, rss), max(peak_pss, pss)
            except psutil.Error:
                pass
            time.sleep(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = proc.communicate()
    stop.set()
    th.join()
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak / 2**30, peak_pss / 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--mode", choices=["harness", "rexeval", "reference"], default="harness")
    ap.add_argument("--input")
    ap.add_argument("--json-out", default=str(REPO / "benchmarks" / "results" / "ingest_split.json"))
    args = ap.parse_args()
    if args.mode == "rexeval":
        print(json.dumps(run_rexeval(args.input, args.workdir)))
        return
    if args.mode == "reference":
        print(json.dumps(run_reference(args.input)))
        return

    work = Path(args.workdir or tempfile.mkdtemp(prefix="rexeval-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    big = work / "replicated.csv"
    rows = replicate(Path(args.csv), big, args.rows)
    print(f"input: {rows:,} rows, {big.stat().st_size / 2**20:.0f} MiB ({big})")
    py = sys.executable
    me = str(Path(__file__).resolve())
    ref, ref_peak, ref_pss = _measure([py, me, "--mode", "reference", "--input", str(big)])
    rex, rex_peak, rex_pss = _measure([py, me, "--mode", "rexeval", "--input", str(big), "--workdir", str(work / "out")])
    ratio = ref["seconds"] / rex["seconds"]
    result = {
        "rows": rows, "cpus": os.cpu_count(),
        "rexeval": {**rex, "rows_per_s": rows / rex["seconds"], "peak_rss_gib": rex_peak, "peak_pss_gib": rex_pss},
        "reference": {**ref, "rows_per_s": rows / ref["seconds"], "peak_rss_gib": ref_peak, "peak_pss_gib": ref_pss},
        "speed_ratio_rexeval_over_reference": ratio,
        "same_counts": all(rex[k] == ref[k] for k in ("reviews", "train", "valid", "test")),
    }
    print(f"{'':12}{'wall s':>10}{'rows/s':>12}{'peak RSS GiB':>14}{'peak PSS GiB':>14}")
    for name in ("rexeval", "reference"):
        r = result[name]
        print(f"{name:12}{r['seconds']:>10.1f}{r['rows_per_s']:>12,.0f}{r['peak_rss_gib']:>14.2f}"
              f"{r['peak_pss_gib']:>14.2f}")
    print(f"speed ratio (rexeval / reference): {ratio:.2f}x  (target >= 0.5x)")
    print(f"rexeval split: ray start {rex['ray_start_s']:.1f}s, ingest {rex['ingest_s']:.1f}s, "
          f"split {rex['split_s']:.1f}s; same counts as reference: {result['same_counts']}")
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.json_out}")


if __name__ == "__main__":
    main()
