"""The FAISS index in shards against the index copied to every query actor, side by side.

Issue 48. One polarity group of planted paraphrase families (`synthetic_paraphrases`,
384 dimensions like all-MiniLM-L6-v2), searched on Ray by two designs with the same
number of actors and the same CPUs each:

- copied (the design before issue 48): the group's whole index is built by one Ray task
  and serialised into the object store; each of N query actors deserialises all of it,
  takes the vectors from the object store and searches a share of the queries
  (`CopiedIndexActor` below, written here from `index.build_index` / `serialize` /
  `deserialize` and `neighbours.search_pairs`, as that design used them);
- sharded (`neighbours.candidate_pairs` with N workers: `pipelines/paraphrase/shards.py`):
  N actors each hold a quarter of the vectors in their own index; every query chunk goes
  to all of them and the lists are merged.

Two runs: Flat (exact) at `--flat-n` vectors, where the pairs must be equal bit for bit,
and IVF at `--n` (1,000,000 by default), where recall against exact search is measured
on `--recall-queries` sampled queries (exact top-k by a float64 matrix product).
Memory per actor is the actor's peak RSS (VmHWM, reset when the actor starts: Ray may
give it a worker that ran other work) less its RSS then: what holding and searching the
index cost it; total memory sums the actors. Ratios are sharded / copied.

    .venv/bin/python benchmarks/bench_paraphrase_shards.py               # 1M IVF, 100k Flat, 4 actors
    .venv/bin/python benchmarks/bench_paraphrase_shards.py --n 200000 --flat-n 30000   # quicker

Results go to benchmarks/results/paraphrase_shards.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

K, TAU = 128, 0.90
GIB = 1 << 30


class CopiedIndexActor:
    """One query actor of the copied design: the whole index deserialised, the whole
    vector matrix from the object store, a range of queries searched."""

    def __init__(self, index_blob, vectors, plan, threads: int):
        from rexeval.pipelines.paraphrase.index import deserialize, load_faiss
        from rexeval.pipelines.paraphrase.shards import reset_peak_rss

        self.base = reset_peak_rss()  # a reused Ray worker's earlier peak does not count
        load_faiss().omp_set_num_threads(max(1, threads))
        self.index = deserialize(index_blob, plan)
        self.vectors = vectors

    def search(self, start: int, end: int, k: int, tau: float):
        from rexeval.pipelines.paraphrase.neighbours import search_pairs

        ids = np.arange(len(self.vectors), dtype=np.int64)
        return search_pairs(self.index, self.vectors, ids, start, end, k, tau)

    def held(self) -> int:
        from rexeval.pipelines.paraphrase.shards import peak_rss

        return peak_rss() - self.base


def build_blob(vectors, plan, seed: int, threads: int):
    from rexeval.pipelines.paraphrase.index import build_index, load_faiss, serialize

    load_faiss().omp_set_num_threads(max(1, threads))
    return serialize(build_index(vectors, plan, seed=seed))


def copied(x: np.ndarray, plan, actors: int, cpus: float, chunk: int) -> dict:
    """The copied design: pairs (deduplicated), seconds, bytes held per actor."""
    import ray

    from rexeval.pipelines.paraphrase.neighbours import dedupe

    t0 = time.perf_counter()
    vectors = ray.put(x)
    blob = ray.remote(build_blob).options(num_cpus=cpus).remote(vectors, plan, 0, max(1, int(cpus)))
    ray.wait([blob])
    actor_cls = ray.remote(CopiedIndexActor).options(num_cpus=cpus)
    pool = [actor_cls.remote(blob, vectors, plan, max(1, int(cpus))) for _ in range(actors)]
    # query ranges on chunk bounds (the in-process search's chunks), a few per actor
    step = max(chunk, -(-len(x) // (actors * 4)) // chunk * chunk)
    ranges = [(s, min(s + step, len(x))) for s in range(0, len(x), step)]
    refs = [pool[i % actors].search.remote(s, e, K, TAU) for i, (s, e) in enumerate(ranges)]
    parts = ray.get(refs)
    seconds = time.perf_counter() - t0
    held = ray.get([a.held.remote() for a in pool])
    for a in pool:
        ray.kill(a)
    a, b, c = (np.concatenate(v) for v in zip(*parts))
    a, b, c = dedupe(a, b, c, len(x))
    return {"pairs": (a, b, c), "seconds": seconds, "held": held}


def sharded(x: np.ndarray, kind: str, actors: int, cpus: float, budget_gib: float) -> dict:
    from rexeval.pipelines.paraphrase.neighbours import candidate_pairs

    t0 = time.perf_counter()
    res = candidate_pairs(x, np.zeros(len(x), np.int64), k=K, tau=TAU, kind=kind, workers=actors, threads=cpus,
                          index_shard_gib=budget_gib)
    seconds = time.perf_counter() - t0
    st = res.stats["0"]
    return {"pairs": (res.a, res.b, res.cos), "seconds": seconds, "held": st["shard_held_bytes"],
            "shards": st["shards"], "bounds": st["bounds"], "plan": st["plan"]}


def exact_recall(x: np.ndarray, pairs, queries: int, seed: int = 0) -> dict:
    """Of the pairs exact search finds from `queries` sampled rows (each row's top K others
    by float64 cosine, kept at >= TAU), the share the searched pairs hold."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(x), size=min(queries, len(x)), replace=False))
    found = set(zip(pairs[0].tolist(), pairs[1].tolist()))
    want = hit = 0
    x64 = x.astype(np.float64)
    for s in range(0, len(rows), 256):
        q = rows[s:s + 256]
        sims = x64[q] @ x64.T
        sims[np.arange(len(q)), q] = -np.inf
        top = np.argpartition(-sims, K, axis=1)[:, :K]
        for r, qi in enumerate(q):
            for j in top[r][sims[r, top[r]] >= TAU]:
                want += 1
                hit += (min(qi, j), max(qi, j)) in found
    return {"queries": len(rows), "exact_pairs": want, "found": hit, "recall": hit / want if want else 1.0}


def run(kind: str, x: np.ndarray, actors: int, cpus: float, chunk: int) -> dict:
    from rexeval.pipelines.paraphrase.index import choose_index

    plan = choose_index(len(x), x.shape[1], K, kind, gpu=False)
    budget = len(x) * x.shape[1] * 4 / GIB / actors * 1.1  # a budget that asks for `actors` shards
    old = copied(x, plan, actors, cpus, chunk)
    new = sharded(x, kind, actors, cpus, budget)
    same = all(np.array_equal(p, q) for p, q in zip(old["pairs"], new["pairs"]))
    out = {
        "n": len(x), "d": x.shape[1], "plan": new["plan"], "actors": actors, "cpus_per_actor": cpus,
        "shards": new["shards"], "bounds": new["bounds"],
        "copied": {"seconds": round(old["seconds"], 2), "held_gib_per_actor": [round(h / GIB, 3) for h in old["held"]],
                   "pairs": len(old["pairs"][0])},
        "sharded": {"seconds": round(new["seconds"], 2),
                    "held_gib_per_actor": [round(h / GIB, 3) for h in new["held"]], "pairs": len(new["pairs"][0])},
        "same_pairs": bool(same),
        "memory_per_actor_ratio": round(max(new["held"]) / max(old["held"]), 3),
        "memory_total_ratio": round(sum(new["held"]) / sum(old["held"]), 3),
        "time_ratio": round(new["seconds"] / old["seconds"], 3),
    }
    return out, new["pairs"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="vectors of the IVF run")
    ap.add_argument("--flat-n", type=int, default=100_000, help="vectors of the Flat run (exact: quadratic)")
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--recall-queries", type=int, default=2000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cluster_shards.json"))
    args = ap.parse_args(argv)

    from benchmarks.synthetic_paraphrases import planted_vectors
    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.core.stage import machine_cpus

    init_ray()
    cpus = max(0.001, int(machine_cpus() / args.actors * 1000) / 1000)
    chunk = 16_384
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                 "python": platform.python_version()}, "k": K, "tau": TAU}
    t = time.perf_counter()
    xf = planted_vectors(args.flat_n, seed=1)[0]
    flat, _ = run("flat", xf, args.actors, cpus, chunk)
    print(json.dumps({"flat": flat}, indent=1), flush=True)
    del xf
    x = planted_vectors(args.n, seed=0)[0]
    ivf, pairs = run("ivf", x, args.actors, cpus, chunk)
    ivf["recall"] = exact_recall(x, pairs, args.recall_queries)
    print(json.dumps({"ivf": ivf}, indent=1), flush=True)
    results.update(flat=flat, ivf=ivf, same_pairs=flat["same_pairs"], ivf_recall=round(ivf["recall"]["recall"], 5),
                   memory_per_actor_ratio=ivf["memory_per_actor_ratio"], time_ratio=ivf["time_ratio"],
                   seconds=round(time.perf_counter() - t, 1),
                   command="python benchmarks/bench_paraphrase_shards.py " + " ".join(argv or sys.argv[1:]))
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: results[k] for k in ("same_pairs", "ivf_recall", "memory_per_actor_ratio", "time_ratio")}))
    return results


if __name__ == "__main__":
    main()
