"""Global-level STAR evaluation at seed scale: batched `evaluate` vs a per-interaction loop.

Issue 5: rank all 281,664 statements of seed-scale Toys (seed 002 Table 6: 18,594 users,
10,130 items, ~4.6 statements per interaction) for 40,000 test interactions and score
P/R/NDCG/hit@{1,3,5,10,20}; target >= 10x over the straightforward loop.

Synthetic benchmark (seeded NumPy, generation is not timed): statement popularity is
Zipf-like over hash-ordered indices, every item has its own statement pool (most of an
interaction's statements come from it, the rest from the global popularity), 120,000
train interactions give the popularity baselines their counts.

Two rankers, each measured on both sides:
- dot: user and item embeddings (d=64) against statement embeddings, score =
  [u, i] @ [S_u; S_i]^T, one GEMM per batch (how BPER+ / ExpGCN score). Embedding entries
  are integers in [-127, 127] stored as float32, so every score is an integer below 2^24
  and exact in float32 whatever the BLAS summation order: the batched GEMM and the
  reference's per-row matrix-vector product give bit-identical scores, and the rankings
  can be compared exactly (ties, rare here, are real ties on both sides).
- itempop: `ranker_class("itempop")` (sparse count rows; ties everywhere at 0 and among
  small counts, so the tie rule -- score desc, lower index first -- is exercised).

Sides, each in its own spawned process (peak RSS its own: the kernel's high-water mark is
reset after the data are built, so the peak is that of the evaluation; ru_maxrss of the
whole process is stored too):
- ours: `pipelines.star.evaluate.evaluate(levels=("global",))` over all test interactions;
- reference: the loop a researcher would write: per interaction, its score vector in
  NumPy (same embeddings / the same count matrix), `np.argsort(-scores, kind="stable")[:20]`
  (stable: the same tie rule), P/R/NDCG(ideal)/hit@k in Python from the ground-truth set;
  on the first `--ref-subset` test interactions, extrapolated per interaction. Its BLAS
  runs on `--ref-blas-threads` (default 1, the faster setting for a per-row product on a
  busy machine); ours runs on torch's default threads (`--threads` to change).

On that subset the per-interaction metric values of both sides must agree (max abs diff
<= 1e-9, NaN in the same places); otherwise the run exits non-zero. Re-run:

    .venv/bin/python benchmarks/bench_star_eval.py                  # seed scale (40,000 x 281,664)
    .venv/bin/python benchmarks/bench_star_eval.py --scale small    # 2,000 x 20,000, seconds

Results go to benchmarks/results/star_eval.json (star_eval_small.json for --scale small).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import resource
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.subprocess_run import run_side
from rexeval.models.recommenders.base import Ranker

KS = (1, 3, 5, 10, 20)
TOL = 1e-9
SCALES = {
    # seed 002 Table 6, Toys; 40,000 test and 120,000 train interactions
    "full": {"interactions": 40_000, "statements": 281_664, "users": 18_594, "items": 10_130,
             "train": 120_000, "ref_subset": 1000},
    "small": {"interactions": 2_000, "statements": 20_000, "users": 2_000, "items": 1_000,
              "train": 6_000, "ref_subset": 500},
}
POOL = 24  # statements in an item's own pool
FROM_POOL = 0.75  # share of an interaction's statements drawn from its item's pool
MEAN_DRAWS = 4.9  # statement draws per interaction; ~4.6 distinct after deduplication
EMB_MAX = 127  # |entry| bound: 2 * dim * 127^2 < 2^24 for dim <= 64 keeps scores exact


# -- data ---------------------------------------------------------------------------------

def _zipf(n: int, a: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf-like probabilities over n indices in a random order (indices are hash-ordered)."""
    p = 1.0 / (rng.permutation(n) + 1.0) ** a
    return p / p.sum()


def make_data(cfg: dict, dim: int, seed: int):
    """(StarData, embeddings dict, fingerprint) of a synthetic benchmark; deterministic."""
    from rexeval.pipelines.star.data import StarData

    if 2 * dim * EMB_MAX ** 2 >= 1 << 24:
        raise ValueError(f"dim {dim} too large for exact float32 scores (need 2*dim*127^2 < 2^24)")
    rng = np.random.default_rng(seed)
    n_s, n_u, n_i = cfg["statements"], cfg["users"], cfg["items"]
    n_train, n_test = cfg["train"], cfg["interactions"]
    n = n_train + n_test
    stmt_p = _zipf(n_s, 0.8, rng)
    pools = rng.choice(n_s, size=(n_i, POOL), p=stmt_p)
    items = rng.choice(n_i, size=n, p=_zipf(n_i, 0.8, rng))
    users = rng.integers(0, n_u, size=n)  # sampled with replacement: ~2 test rows per user
    split = np.r_[np.zeros(n_train, np.int8), np.full(n_test, 2, np.int8)]
    counts = 1 + rng.poisson(MEAN_DRAWS - 1, size=n)
    inter = np.repeat(np.arange(n), counts)
    pooled = rng.random(len(inter)) < FROM_POOL
    stmts = np.where(pooled, pools[items[inter], rng.integers(0, POOL, len(inter))],
                     rng.choice(n_s, size=len(inter), p=stmt_p))
    data = StarData.from_arrays(users, items, split, np.stack([inter, stmts], 1), n_u, n_i, n_s)

    # Integer-valued float32 embeddings (exact scores, see the module docstring). Item
    # embeddings point towards their pool; a constant user column times a log-popularity
    # statement column gives every user a popularity prior.
    s_item = rng.integers(-40, 41, size=(n_s, dim)).astype(np.float32)
    s_user = rng.integers(-40, 41, size=(n_s, dim)).astype(np.float32)
    s_user[:, 0] = np.round(np.clip(np.log(stmt_p * n_s) * 12, -EMB_MAX, EMB_MAX))
    pool_mean = s_item[pools].mean(axis=1)
    item_emb = np.clip(np.round(pool_mean * 6 + rng.normal(0, 8, (n_i, dim))), -EMB_MAX, EMB_MAX)
    user_emb = rng.integers(-6, 7, size=(n_u, dim)).astype(np.float64)
    user_emb[:, 0] = 100
    emb = {"user": user_emb.astype(np.float32), "item": item_emb.astype(np.float32),
           "stmt_user": s_user, "stmt_item": s_item}
    h = hashlib.sha1()
    for a in (data.inter_user, data.inter_item, data.inter_split, data.pos_offsets, data.pos_values,
              *emb.values()):
        h.update(np.ascontiguousarray(a).tobytes())
    return data, emb, h.hexdigest()[:16]


def build_ranker(name: str, data, emb):
    """The ranker measured by `ours` ('dot' or a registered baseline such as 'itempop')."""
    if name == "dot":
        return DotRanker(emb)
    from rexeval.models.recommenders.base import ranker_class

    return ranker_class(name).fit(data)


class DotRanker(Ranker):
    """score = [user_emb[u], item_emb[i]] @ [S_u; S_i]^T, one GEMM per batch."""

    name = "dot"

    def __init__(self, emb: dict):
        self.user = torch.from_numpy(emb["user"])
        self.item = torch.from_numpy(emb["item"])
        self.right_t = torch.from_numpy(np.ascontiguousarray(
            np.concatenate([emb["stmt_user"], emb["stmt_item"]], axis=1))).T  # [2d, S] view

    def score_all(self, users, items, rows):
        return torch.cat([self.user[users], self.item[items]], dim=1) @ self.right_t


# -- memory ---------------------------------------------------------------------------------

def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakRSS:
    """Peak RSS of this process over a block: the kernel's VmHWM after resetting it
    (/proc/self/clear_refs, Linux), else a polling thread (every 2 ms)."""

    def __enter__(self):
        gc.collect()
        self.before = _status_kib("VmRSS") or 0
        self.method = "VmHWM"
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.method = "polling"
        if self.method == "polling" or _status_kib("VmHWM") is None:
            import psutil

            self.method, self._peak, self._stop = "polling", self.before, threading.Event()
            proc = psutil.Process()

            def poll():
                while not self._stop.is_set():
                    self._peak = max(self._peak, proc.memory_info().rss // 1024)
                    time.sleep(0.002)

            self._t = threading.Thread(target=poll, daemon=True)
            self._t.start()
        return self

    def __exit__(self, *exc):
        if self.method == "polling":
            self._stop.set()
            self._t.join()
            self.peak = self._peak
        else:
            self.peak = max(_status_kib("VmHWM") or 0, _status_kib("VmRSS") or 0)
        return False

    def stats(self) -> dict:
        gib = 1024 ** 2
        return {"rss_before_gib": self.before / gib, "peak_rss_gib": self.peak / gib,
                "peak_extra_gib": (self.peak - self.before) / gib, "peak_method": self.method,
                "process_maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / gib}


# -- the two sides ----------------------------------------------------------------------------

def run_ours(ranker, data, rows, batch_size):
    from rexeval.pipelines.star.evaluate import evaluate

    t0 = time.perf_counter()
    res = evaluate(ranker, data, split="test", levels=("global",), ks=KS, device="cpu", rows=rows,
                   batch_size=batch_size)["global"]
    return res.per_row, res.summary, time.perf_counter() - t0


def reference_metrics(order: np.ndarray, truth: set, ks=KS) -> dict[str, float]:
    """P/R/NDCG(ideal)/hit@k of one ranked list, written out plainly."""
    n_pos = len(truth)
    rel = [int(s) in truth for s in order]
    out = {}
    for k in ks:
        if n_pos == 0:
            for fam in ("precision", "recall", "ndcg", "hit"):
                out[f"{fam}@{k}"] = float("nan")
            continue
        hits = sum(rel[:k])
        dcg = sum(1.0 / math.log2(j + 2) for j in range(min(k, len(rel))) if rel[j])
        idcg = sum(1.0 / math.log2(j + 2) for j in range(min(k, n_pos)))
        out[f"precision@{k}"] = hits / k
        out[f"recall@{k}"] = hits / n_pos
        out[f"ndcg@{k}"] = dcg / idcg
        out[f"hit@{k}"] = 1.0 if hits > 0 else 0.0
    return out


def run_reference(name, ranker, data, emb, rows):
    """Per interaction: NumPy scores, stable argsort, metrics in Python."""
    kmax = max(KS)
    if name == "dot":
        w = np.concatenate([emb["stmt_user"], emb["stmt_item"]], axis=1)  # [S, 2d]
        ue, ie = emb["user"], emb["item"]

        def scores_of(u, i):
            return w @ np.concatenate([ue[u], ie[i]])
    else:
        counts = ranker.counts  # the fitted key x statement count matrix (CSR)
        keyed = {"userpop": "user", "itempop": "item"}.get(name, "global")

        def scores_of(u, i):
            key = u if keyed == "user" else i if keyed == "item" else 0
            s = np.zeros(data.n_statements, dtype=np.float32)
            a, b = counts.indptr[key], counts.indptr[key + 1]
            s[counts.indices[a:b]] = counts.data[a:b]
            return s

    per_row = {f"{fam}@{k}": [] for k in KS for fam in ("precision", "recall", "ndcg", "hit")}
    t0 = time.perf_counter()
    for r in rows:
        scores = scores_of(data.inter_user[r], data.inter_item[r])
        order = np.argsort(-scores, kind="stable")[:kmax]
        truth = set(data.pos_values[data.pos_offsets[r]:data.pos_offsets[r + 1]].tolist())
        for key, v in reference_metrics(order, truth).items():
            per_row[key].append(v)
    secs = time.perf_counter() - t0
    return {k: np.asarray(v, dtype=np.float64) for k, v in per_row.items()}, secs


def _child(side, ranker_name, cfg, dim, seed, n_rows, batch_size, threads, blas_threads, out_path):
    from threadpoolctl import threadpool_info, threadpool_limits

    if threads:
        torch.set_num_threads(threads)
    if blas_threads:  # NumPy's BLAS (the reference's matrix-vector product)
        threadpool_limits(limits=blas_threads, user_api="blas")
    numpy_blas = [p for p in threadpool_info() if p["user_api"] == "blas" and "numpy" in p["filepath"]]
    t0 = time.perf_counter()
    data, emb, fingerprint = make_data(cfg, dim, seed)
    ranker = build_ranker(ranker_name, data, emb)
    rows = data.rows("test")
    if n_rows is not None:
        rows = rows[:n_rows]
    setup_s = time.perf_counter() - t0
    with PeakRSS() as mem:
        if side == "ours":
            per_row, summary, secs = run_ours(ranker, data, rows, batch_size)
        else:
            per_row, secs = run_reference(ranker_name, ranker, data, emb, rows)
            summary = None
    from rexeval.pipelines.star.evaluate import batch_rows

    res = {"side": side, "ranker": ranker_name, "interactions": len(rows), "seconds": secs,
           "interactions_per_s": len(rows) / secs, "per_interaction_ms": 1000 * secs / len(rows),
           "setup_s": setup_s, "fingerprint": fingerprint, "torch_threads": torch.get_num_threads(),
           "numpy_blas_threads": numpy_blas[0]["num_threads"] if numpy_blas else None,
           "batch_rows": int(batch_size or batch_rows(data.n_statements)) if side == "ours" else 1,
           "summary": summary, **mem.stats()}
    np.savez(out_path + ".npz", **{k: np.asarray(v) for k, v in per_row.items()})
    Path(out_path + ".json").write_text(json.dumps(res, default=str))


def measure(side, ranker_name, cfg, dim, seed, n_rows, batch_size, threads, blas_threads=None,
            tmp="/tmp/rexeval-bench-star-eval"):
    os.makedirs(tmp, exist_ok=True)
    out = f"{tmp}/{side}-{ranker_name}-{cfg['interactions']}x{cfg['statements']}"
    return run_side(_child, (side, ranker_name, cfg, dim, seed, n_rows, batch_size, threads, blas_threads),
                    out, f"{side} run of {ranker_name}")


def compare(ours: dict, ref: dict, n: int) -> dict:
    """Max abs difference of every metric on the first n rows; NaN must match NaN."""
    worst, nan_mismatch, bad_metric = 0.0, 0, None
    for key, r in ref.items():
        o = ours[key][:n]
        nan_o, nan_r = np.isnan(o), np.isnan(r)
        nan_mismatch += int((nan_o != nan_r).sum())
        both = ~nan_o & ~nan_r
        d = float(np.max(np.abs(o[both] - r[both]))) if both.any() else 0.0
        if d > worst:
            worst, bad_metric = d, key
    rows_differing = int(np.sum(np.any(np.stack([
        ~((ours[k][:n] == r) | (np.isnan(ours[k][:n]) & np.isnan(r))) for k, r in ref.items()]), 0)))
    return {"max_abs_diff": worst, "worst_metric": bad_metric, "nan_mismatches": nan_mismatch,
            "rows_not_bitwise_equal": rows_differing,
            "equal": bool(worst <= TOL and nan_mismatch == 0)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="full",
                    help="full: 40,000 x 281,664 (seed-scale Toys); small: 2,000 x 20,000")
    ap.add_argument("--interactions", type=int, help="test interactions (default by --scale)")
    ap.add_argument("--statements", type=int, help="candidate statements (default by --scale)")
    ap.add_argument("--users", type=int)
    ap.add_argument("--items", type=int)
    ap.add_argument("--train", type=int, help="train interactions (popularity counts)")
    ap.add_argument("--ref-subset", type=int, help="test interactions the reference loop runs on")
    ap.add_argument("--rankers", default="dot,itempop", help="comma list: dot and/or registered baselines")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=None, help="evaluate()'s batch (default: its own)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--ref-blas-threads", type=int, default=1,
                    help="NumPy BLAS threads of the reference (default 1: its per-row product is "
                         "memory bound, and one thread was the faster setting on a busy 2-core "
                         "machine, so the speed-up is not inflated; 0 = the library default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    cfg = dict(SCALES[args.scale])
    for key in ("interactions", "statements", "users", "items", "train", "ref_subset"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    n_ref = min(cfg["ref_subset"], cfg["interactions"])
    out = Path(args.out or ROOT / "benchmarks" / "results" /
               ("star_eval.json" if args.scale == "full" else f"star_eval_{args.scale}.json"))
    from rexeval.pipelines.star.evaluate import batch_rows

    b = args.batch_size or batch_rows(cfg["statements"])
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "torch": torch.__version__,
                          "numpy": np.__version__, "torch_threads_default": torch.get_num_threads(),
                          "loadavg_at_start": list(os.getloadavg())},
              "params": {**cfg, "scale": args.scale, "ref_subset": n_ref, "dim": args.dim,
                         "seed": args.seed, "ref_blas_threads": args.ref_blas_threads or "default",
                         "ks": list(KS), "level": "global", "pool": POOL, "from_pool": FROM_POOL,
                         "batch_rows": b,
                         "dense_scores_mib_per_batch": b * cfg["statements"] * 4 / 2 ** 20},
              "rankers": {}}
    print(f"global level: {cfg['interactions']:,} test interactions x {cfg['statements']:,} statements "
          f"({cfg['users']:,} users, {cfg['items']:,} items, {cfg['train']:,} train); reference on the "
          f"first {n_ref:,}; batch {b} rows ({result['params']['dense_scores_mib_per_batch']:.0f} MiB "
          f"of scores); load avg {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus", flush=True)
    all_equal = True
    rows_out = []
    for name in [r.strip() for r in args.rankers.split(",") if r.strip()]:
        print(f"[{name}] ours (evaluate, {cfg['interactions']:,}) ...", flush=True)
        ours, ours_rows = measure("ours", name, cfg, args.dim, args.seed, None, args.batch_size,
                                  args.threads)
        print(f"  {ours['seconds']:.2f}s, {ours['interactions_per_s']:,.0f}/s, peak RSS "
              f"{ours['peak_rss_gib']:.2f} GiB (+{ours['peak_extra_gib']:.2f} over the data)", flush=True)
        print(f"[{name}] reference (loop, {n_ref:,}) ...", flush=True)
        ref, ref_rows = measure("reference", name, cfg, args.dim, args.seed, n_ref, None, args.threads,
                               args.ref_blas_threads or None)
        print(f"  {ref['seconds']:.2f}s, {ref['interactions_per_s']:,.0f}/s, peak RSS "
              f"{ref['peak_rss_gib']:.2f} GiB", flush=True)
        if ours["fingerprint"] != ref["fingerprint"]:
            raise RuntimeError(f"{name}: the two sides built different data "
                               f"({ours['fingerprint']} vs {ref['fingerprint']})")
        check = compare(ours_rows, ref_rows, n_ref)
        speedup = ref["per_interaction_ms"] / ours["per_interaction_ms"]
        ref["extrapolated_s"] = ref["per_interaction_ms"] * cfg["interactions"] / 1000
        all_equal &= check["equal"]
        result["rankers"][name] = {"ours": ours, "reference": ref, "check": check, "speedup": speedup,
                                   "target_met": speedup >= 10}
        print(f"  speed-up {speedup:.1f}x; subset metrics max abs diff {check['max_abs_diff']:.3g} "
              f"({check['nan_mismatches']} NaN mismatches) -> {'EQUAL' if check['equal'] else 'DIFFERENT'}; "
              f"hit@20 {ours['summary']['hit@20']:.3f}, ndcg@10 {ours['summary']['ndcg@10']:.3f}",
              flush=True)
        rows_out.append((name, ours, ref, speedup, check))

    print()
    head = (f"{'ranker':<9} {'side':<10} {'inter.':>7} {'wall s':>8} {'inter./s':>9} {'ms/inter.':>9} "
            f"{'peak GiB':>8} {'+GiB':>6} {'thr':>3} {'blas':>4} {'speed-up':>8} {'max|diff|':>9}")
    print(head)
    print("-" * len(head))
    for name, ours, ref, speedup, check in rows_out:
        for side, r in (("ours", ours), ("reference", ref)):
            tail = f"{speedup:>7.1f}x {check['max_abs_diff']:>9.2g}" if side == "ours" else ""
            print(f"{name:<9} {side:<10} {r['interactions']:>7,} {r['seconds']:>8.2f} "
                  f"{r['interactions_per_s']:>9,.0f} {r['per_interaction_ms']:>9.3f} "
                  f"{r['peak_rss_gib']:>8.2f} {r['peak_extra_gib']:>6.2f} {r['torch_threads']:>3} "
                  f"{r['numpy_blas_threads'] if r['numpy_blas_threads'] is not None else '-':>4} {tail}")
        print(f"{'':<9} {'(ref extrapolated to ' + format(cfg['interactions'], ',') + ': '}"
              f"{ref['extrapolated_s']:.0f}s)")
    result["all_equal"] = bool(all_equal)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    if not all_equal:
        print("FAIL: ours and the reference disagree on the subset", file=sys.stderr)
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
