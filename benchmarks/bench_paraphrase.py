"""Paraphrase clustering at scale: neighbours + graph + refinement, ours vs a literal reference.

Input: synthetic unit vectors with planted paraphrase families in three polarity groups
(`synthetic_paraphrases.planted_vectors`), 384 dimensions like all-MiniLM-L6-v2.

- ours: `pipelines.paraphrase.neighbours.candidate_pairs` (FAISS, exact up to a size and IVF above,
  all cores) + `pipelines.paraphrase.graph.cluster_graph` (scipy components, batched
  cohesion, heap-driven Algorithm 1, vectorised representatives).
- reference: the paper followed literally in one process: an exact FAISS inner-product
  index per polarity, K neighbours per statement, and Python loops over neighbours,
  a dict-of-sets graph, breadth-first components, pairwise cohesion, Algorithm 1 with
  set operations and representatives by mean cosine.

Each run is a fresh process (spawned), so its peak RSS is its own. Both run on the same
subset; their partitions and representatives are compared (equal output), then ours
alone runs on the full size. Re-run:

    .venv/bin/python benchmarks/bench_paraphrase.py                 # 1,000,000 and a 400,000 subset
    .venv/bin/python benchmarks/bench_paraphrase.py --n 200000 --subset 50000   # quicker
    .venv/bin/python benchmarks/bench_paraphrase.py --with-flat   # also ours with exact search

Results go to benchmarks/results/paraphrase.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.subprocess_run import run_side

K, TAU_PAIR, TAU_INTRA, TAU_REMERGE = 128, 0.90, 0.85, 0.90


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2  # KiB on Linux


# -- ours ---------------------------------------------------------------------------------

def run_ours(emb, groups, kind="auto"):
    from rexeval.pipelines.paraphrase.graph import cluster_graph
    from rexeval.pipelines.paraphrase.neighbours import candidate_pairs

    t0 = time.perf_counter()
    pairs = candidate_pairs(emb, groups, k=K, tau=TAU_PAIR, kind=kind, workers=1)
    t1 = time.perf_counter()
    g = cluster_graph(emb, pairs.a, pairs.b, tau_intra=TAU_INTRA, tau_remerge=TAU_REMERGE)
    t2 = time.perf_counter()
    return {"labels": g.labels, "representatives": g.representatives,
            "pairs": int(len(pairs.a)), "components": int(g.n_components),
            "refined": int(g.refined_components), "clusters": int(g.n_clusters),
            "neighbours_s": t1 - t0, "graph_s": t2 - t1, "total_s": t2 - t0,
            "index": {str(k): v.get("plan") for k, v in pairs.stats.items() if isinstance(v, dict)}}


# -- the literal reference ------------------------------------------------------------------

def run_reference(emb, groups):
    from rexeval.pipelines.paraphrase.index import load_faiss

    faiss = load_faiss()  # loads faiss with the same OpenBLAS kernels as ours (fair comparison)

    t0 = time.perf_counter()
    n = len(emb)
    edges = set()
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        index = faiss.IndexFlatIP(emb.shape[1])
        index.add(emb[rows])
        sims, nbrs = index.search(emb[rows], min(K + 1, len(rows)))
        for qi in range(len(rows)):
            for sim, nj in zip(sims[qi], nbrs[qi]):
                if nj < 0 or nj == qi or sim < TAU_PAIR:
                    continue
                a, b = int(rows[qi]), int(rows[nj])
                edges.add((a, b) if a < b else (b, a))
    t1 = time.perf_counter()
    adj = {i: set() for i in range(n)}
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    seen = [False] * n
    components = []
    for s in range(n):
        if seen[s]:
            continue
        comp, queue = [], deque([s])
        seen[s] = True
        while queue:
            u = queue.popleft()
            comp.append(u)
            for v in adj[u]:
                if not seen[v]:
                    seen[v] = True
                    queue.append(v)
        components.append(sorted(comp))

    def cos(a, b):
        return float(np.dot(emb[a], emb[b]))

    clusters, refined = [], 0
    for comp in components:
        cohesion = min((cos(a, b) for i, a in enumerate(comp) for b in comp[i + 1:]), default=1.0)
        if cohesion >= TAU_INTRA:
            clusters.append(comp)
            continue
        refined += 1
        remaining, acc, pivots = set(comp), None, []
        while remaining:
            p = max(sorted(remaining), key=lambda s: len(adj[s] & remaining))  # ties: lowest index
            block = {p} | (adj[p] & remaining)
            if acc is None:
                acc, pivots = set(block), [p]
            elif min(cos(p, q) for q in pivots) >= TAU_REMERGE:
                acc |= block
                pivots.append(p)
            else:
                clusters.append(sorted(acc))
                acc, pivots = set(block), [p]
            remaining -= block
        clusters.append(sorted(acc))
    labels = np.empty(n, dtype=np.int64)
    reps = []
    for c in sorted(clusters, key=lambda m: m[0]):
        best, best_score = c[0], -np.inf
        for m in c:
            score = (np.mean([cos(m, o) for o in c if o != m]) if len(c) > 1 else 0.0)
            if score > best_score:
                best, best_score = m, score
        labels[c] = len(reps)
        reps.append(best)
    t2 = time.perf_counter()
    return {"labels": labels, "representatives": np.asarray(reps), "pairs": len(edges),
            "components": len(components), "refined": refined, "clusters": len(reps),
            "neighbours_s": t1 - t0, "graph_s": t2 - t1, "total_s": t2 - t0}


# -- harness ------------------------------------------------------------------------------

def _child(which, n, seed, kind, out_path):
    from benchmarks.synthetic_paraphrases import planted_vectors

    emb, groups, truth = planted_vectors(n, seed=seed)
    res = run_ours(emb, groups, kind) if which == "ours" else run_reference(emb, groups)
    res["peak_rss_gib"] = _peak_rss_gib()
    np.savez(out_path + ".npz", labels=res.pop("labels"), representatives=res.pop("representatives"),
             truth=truth)
    Path(out_path + ".json").write_text(json.dumps(res, default=str))


def measure(which, n, seed=0, kind="auto", tmp="/tmp/rexeval-bench-cluster"):
    os.makedirs(tmp, exist_ok=True)
    return run_side(_child, (which, n, seed, kind), f"{tmp}/{which}-{kind}-{n}",
                    f"{which} run on {n} vectors")


def compare(emb, a_labels, a_reps, b_labels, b_reps) -> dict:
    """Do two clusterings agree? Same partition (up to numbering), and representatives
    equal or tied: a float32 literal reference can round two members' mean cosines to a
    tie that float64 separates, so representatives count as equal within 1e-6 of score."""
    from sklearn.metrics import adjusted_rand_score

    pairs = set(zip(a_labels.tolist(), b_labels.tolist()))
    same = len(pairs) == len(set(a_labels.tolist())) == len(set(b_labels.tolist()))
    # Statements whose cluster differs: those in clusters not matched one-to-one.
    a_count, b_count = {}, {}
    for x, y in pairs:
        a_count[x] = a_count.get(x, 0) + 1
        b_count[y] = b_count.get(y, 0) + 1
    bad = np.array([a_count[x] > 1 or b_count[y] > 1 for x, y in zip(a_labels.tolist(), b_labels.tolist())])

    def score(rep, members):
        if len(members) < 2:
            return 0.0
        others = members[members != rep]
        return float(np.mean(emb[others] @ emb[rep]))

    reps_differ = 0
    if same:
        rep_of_b = {int(b_labels[r]): int(r) for r in b_reps}
        for r in a_reps.tolist():
            r2 = rep_of_b[int(b_labels[r])]
            if r2 != r:
                members = np.flatnonzero(a_labels == a_labels[r])
                if abs(score(r, members) - score(r2, members)) > 1e-6:
                    reps_differ += 1
    return {"equal_output": bool(same and reps_differ == 0), "same_partition": bool(same),
            "statements_in_differing_clusters": int(bad.sum()),
            "representatives_differing": reps_differ,
            "ari_between": float(adjusted_rand_score(a_labels, b_labels))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="full size for ours (default 1,000,000)")
    ap.add_argument("--subset", type=int, default=400_000, help="size both run on (default 400,000)")
    ap.add_argument("--with-flat", action="store_true", help="also run ours with exact search on the subset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-full", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cluster.json"))
    args = ap.parse_args(argv)
    from benchmarks.synthetic_paraphrases import pairwise_scores

    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "params": {"k": K, "tau_pair": TAU_PAIR, "tau_intra": TAU_INTRA, "tau_remerge": TAU_REMERGE,
                         "dim": 384, "seed": args.seed}}
    print(f"subset: {args.subset:,} vectors x 384 -- reference (literal) ...", flush=True)
    ref, ref_a = measure("reference", args.subset, args.seed)
    print(f"  reference: {ref['total_s']:.1f}s (search {ref['neighbours_s']:.1f}s, graph "
          f"{ref['graph_s']:.1f}s), peak RSS {ref['peak_rss_gib']:.2f} GiB", flush=True)
    sub = {"n": args.subset, "reference": ref}
    from benchmarks.synthetic_paraphrases import planted_vectors

    emb = planted_vectors(args.subset, seed=args.seed)[0]
    for kind in ("auto", "flat") if args.with_flat else ("auto",):
        print(f"  ours ({kind}) ...", flush=True)
        ours, ours_a = measure("ours", args.subset, args.seed, kind)
        ours.update(compare(emb, ours_a["labels"], ours_a["representatives"],
                            ref_a["labels"], ref_a["representatives"]))
        ours["speedup_vs_reference"] = ref["total_s"] / ours["total_s"]
        ours["graph_speedup_vs_reference"] = ref["graph_s"] / ours["graph_s"]
        ours["vs_truth"] = pairwise_scores(ours_a["truth"], ours_a["labels"])
        sub[f"ours_{kind}"] = ours
        print(f"  ours ({kind}): {ours['total_s']:.1f}s (search {ours['neighbours_s']:.1f}s, graph "
              f"{ours['graph_s']:.2f}s), peak RSS {ours['peak_rss_gib']:.2f} GiB, "
              f"{ours['speedup_vs_reference']:.1f}x, equal output: {ours['equal_output']} "
              f"({ours['statements_in_differing_clusters']} statements in differing clusters, "
              f"ARI {ours['ari_between']:.6f})", flush=True)
    sub["reference"]["vs_truth"] = pairwise_scores(ref_a["truth"], ref_a["labels"])
    result["subset"] = sub
    if not args.skip_full:
        print(f"full: {args.n:,} vectors x 384 -- ours ...", flush=True)
        full, full_a = measure("ours", args.n, args.seed)
        full["vs_truth"] = pairwise_scores(full_a["truth"], full_a["labels"])
        result["full"] = {"n": args.n, "ours": full}
        print(f"  ours: {full['total_s']:.1f}s (search {full['neighbours_s']:.1f}s, graph "
              f"{full['graph_s']:.1f}s), process {full['process_wall_s']:.1f}s, "
              f"peak RSS {full['peak_rss_gib']:.2f} GiB", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
