"""Candidate pairs for STAR clustering: each statement's K nearest same-polarity neighbours.

STAR (seed paper 002, appendix B.3) links two statements when one is among the other's
K nearest neighbours (K=128) within the same polarity and their cosine is >= tau_pair
(0.90). Embeddings are L2-normalised, so inner product is cosine. One FAISS index per
polarity group: exact (`IndexFlatIP`) while a group is small, IVF above `flat_max`,
where exact search is quadratic (1M x 384: over an hour on 2 cores) and an IVF
index with enough probes finds >= 0.99 of the near-duplicate pairs (measured, see
`DEFAULT_NPROBE`; the indexes are planned and built in `pipelines/paraphrase/index.py`).
Queries are searched in chunks, so memory stays at the vectors plus one index. With
`workers > 1` each group's index is split into shards held by Ray actors, one shard
each, never copied (`pipelines/paraphrase/shards.py`): as many shards as the per-shard memory
budget needs, and at least `workers`; every query chunk goes to every shard and the
per-shard lists are merged, giving the in-process pairs exactly for Flat. Whether the
shards use GPUs is what they ask for (`gpu`), not what the cluster holds at the start: an
autoscaling cluster may have no GPU node until an actor asks for one.

Ties: a query's neighbours are ranked by cosine, then by row (`shards.exact_topk`), here
as in the shards, so which of several equally near rows is the k-th does not depend on
how FAISS happened to visit them.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rexeval.pipelines.paraphrase.index import FLAT_MAX, build_index, choose_index, empty_pairs, ivf_join_pairs, load_faiss
from rexeval.pipelines.paraphrase.shards import (INDEX_SHARD_GIB, QUERY_CHUNK, EmbeddingsAt, SliceSource,
                                               check_unit, exact_topk, pairs_from_topk, sharded_pairs)
from rexeval.pipelines.core.stage import Resources
from rexeval.threads import cpu_threads



@dataclass
class PairResult:
    """Candidate pairs a < b (global row ids), sorted by (a, b), with their cosine."""

    a: np.ndarray  # int64
    b: np.ndarray  # int64
    cos: np.ndarray  # float32
    stats: dict = field(default_factory=dict)  # {str(group): {...}, "total": {...}}

    def __len__(self) -> int:
        return len(self.a)


# ---------------------------------------------------------------------------- search

def search_pairs(index, vectors: np.ndarray, ids: np.ndarray, start: int, end: int, k: int,
                 tau: float, chunk: int = QUERY_CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs from querying rows [start, end) of `vectors` (the rows the index holds).

    Each query keeps its first `k` neighbours other than itself (k+1 are asked for, so
    the self match does not cost a neighbour; ties by row), then those with cosine >= tau.
    Returns (a, b, cos) with a < b global ids (`ids[local row]`); a pair found from both
    ends appears twice (deduplicated by the caller). Chunked, so memory is O(chunk * k).
    """
    ntotal = int(index.ntotal)
    kk = min(k + 1, ntotal)
    ids = np.asarray(ids, dtype=np.int64)
    out_a, out_b, out_c = [], [], []
    if kk <= 0 or end <= start:
        return empty_pairs()

    def ask(q, kq, which):
        return index.search(q if which is None else np.ascontiguousarray(q[which]), int(kq))

    for s in range(start, end, chunk):
        e = min(s + chunk, end)
        q = np.ascontiguousarray(vectors[s:e], dtype=np.float32)
        sims, nbr = exact_topk([ask], q, kk)
        a, b, c = pairs_from_topk(sims, nbr, np.arange(s, e, dtype=np.int64), ids, k, tau)
        out_a.append(a)
        out_b.append(b)
        out_c.append(c)
    return np.concatenate(out_a), np.concatenate(out_b), np.concatenate(out_c)


def dedupe(a: np.ndarray, b: np.ndarray, cos: np.ndarray, n: int):
    """Unique (a, b) pairs sorted by (a, b), keeping the larger cosine of duplicates."""
    if len(a) == 0:
        return empty_pairs()
    key = a.astype(np.int64) * np.int64(max(n, 1)) + b
    order = np.lexsort((-cos, key))
    key = key[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    sel = order[first]
    return a[sel], b[sel], cos[sel]


# ---------------------------------------------------------------------------- validation

def _validate(vectors, groups, k: int, tau: float) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(vectors, EmbeddingsAt):  # read by the shards, which check their own rows
        g = np.asarray(groups)
        if g.ndim != 1 or len(g) != vectors.n:
            raise ValueError(f"groups must be 1-D with one entry per vector: {g.shape} vs {vectors.n} rows")
        _check_k_tau(k, tau)
        return vectors, g
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2:
        shape = getattr(vectors, "shape", None)
        raise ValueError(f"vectors must be a 2-D array [n, d], got shape {shape}")
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    g = np.asarray(groups)
    if g.ndim != 1 or len(g) != len(x):
        raise ValueError(f"groups must be 1-D with one entry per vector: {g.shape} vs {len(x)} rows")
    _check_k_tau(k, tau)
    check_unit(x, np.arange(len(x)))
    return x, g


def _check_k_tau(k: int, tau: float) -> None:
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, not {k}")
    if not -1.0 <= float(tau) <= 1.0:
        raise ValueError(f"tau is a cosine in [-1, 1], not {tau}")


# ---------------------------------------------------------------------------- driver

def _cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def _key(code) -> str:
    return str(code.item() if hasattr(code, "item") else code)


def _ray_gpu(gpu: str | bool) -> bool:
    """Whether the Ray path's build tasks and search actors each ask for a GPU: gpu=True
    asks (the cluster, or its autoscaler, provides one); "auto" asks when this process
    was given one (its FAISS sees a GPU, as in a worker task that requested a GPU). The
    cluster's nodes are not counted: one that autoscales may have no GPU node yet."""
    if gpu == "auto":
        return load_faiss().get_num_gpus() > 0
    if gpu is True or gpu is False:
        return gpu
    raise ValueError(f"gpu must be 'auto', True or False, not {gpu!r}")


def _no_gpu_now() -> bool:
    import ray

    return not ray.cluster_resources().get("GPU", 0)


def candidate_pairs(vectors: np.ndarray | EmbeddingsAt, groups: np.ndarray, *, k: int = 128, tau: float = 0.90,
                    kind: str = "auto", nprobe: int | None = None, workers: int | None = 1,
                    gpu: str | bool = "auto", seed: int = 0,
                    progress: Callable[[str], None] | None = None, flat_max: int = FLAT_MAX,
                    ivf_join: bool = True, threads: int | None = None, memory_gib: float | None = None,
                    index_shard_gib: float = INDEX_SHARD_GIB, resources: dict[str, float] | None = None,
                    chunk: int = QUERY_CHUNK) -> PairResult:
    """Candidate pairs within each group: k nearest neighbours with cosine >= tau.

    workers=1 (or None) builds and searches in this process with `threads` cores
    (default: every core it may run on). workers > 1 splits each group's index into
    shards on Ray actors (`shards.sharded_pairs`): at least `workers` shards, more when
    a shard would hold over `index_shard_gib`; each actor asks for `threads` CPUs
    (default: `stage.cpu_share(workers)`), `memory_gib` and custom `resources`, and uses
    as many threads. The settings decide, never the nodes a cluster has up now. Flat
    groups give the same pairs both ways. In process on CPU, an IVF group is searched by
    `ivf_join_pairs` (one GEMM per list) unless `ivf_join=False` (FAISS's own
    IndexIVFFlat search, as the shards do). `vectors` may be an embeddings folder
    (`shards.EmbeddingsAt`): the shards then read their own rows from it, and no process
    holds the whole matrix.
    """
    t_all = time.perf_counter()
    use_ray = workers is not None and workers > 1
    if isinstance(vectors, EmbeddingsAt) and not use_ray:  # one process searches the whole matrix
        vectors = vectors.read()
    x, g = _validate(vectors, groups, k, tau)
    say = progress or (lambda _m: None)
    n, d = (x.n, x.d) if isinstance(x, EmbeddingsAt) else x.shape
    if use_ray:
        from rexeval.pipelines.core.runtime import init_ray
        from rexeval.pipelines.core.stage import cpu_share

        ray = init_ray()
        gpu_search = _ray_gpu(gpu)
        actor_resources = Resources(cpus=float(threads or cpu_share(workers)), gpus=1 if gpu_search else 0,
                                    memory=float((memory_gib or 0) * (1 << 30)),
                                    custom=tuple(sorted((resources or {}).items())))
        if gpu_search and _no_gpu_now():
            say("neighbours: no GPU in the cluster now; the GPU shards wait for one "
                "(an autoscaler adds a GPU node on demand)")

    codes, inverse = np.unique(g, return_inverse=True)
    stats: dict = {}
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for gi, code in enumerate(codes):
        ids = np.flatnonzero(inverse == gi)
        key = _key(code)
        st = stats[key] = {"n": len(ids), "plan": None, "pairs": 0}
        if len(ids) < 2:
            continue
        if use_ray:  # GPUs, if any, are the shards'; plan without looking for one here
            plan = choose_index(len(ids), d, k, kind, flat_max=flat_max, nprobe=nprobe, gpu=False)
            plan = dataclasses.replace(plan, gpu=gpu_search and plan.kind != "hnsw")
        else:
            plan = choose_index(len(ids), d, k, kind, flat_max=flat_max, nprobe=nprobe, gpu=gpu)
        st["plan"] = plan.describe()
        say(f"neighbours: group {key}: {len(ids):,} vectors, {plan.describe()}")
        if use_ray:
            if plan.kind == "hnsw":
                raise ValueError("index 'hnsw' has no shards (a graph is not split by rows): use 'flat' or "
                                 "'ivf' with several neighbour workers, or hnsw in one process")
            t0 = time.perf_counter()

            def slices(bounds: list[int], rows=ids):
                if isinstance(x, EmbeddingsAt):  # each shard reads its own rows from storage
                    return x.source(ray.put(rows))
                return SliceSource([ray.put(x[rows[lo:hi]]) for lo, hi in zip(bounds, bounds[1:])], bounds)

            part, shard_stats = sharded_pairs(len(ids), d, slices, ids, plan, k, tau, workers=workers,
                                              budget_gib=index_shard_gib, resources=actor_resources, seed=seed,
                                              chunk=chunk, progress=lambda m, key=key: say(f"  group {key}: {m}"))
            part = dedupe(*part, n)
            st.update(shard_stats, pairs=len(part[0]), seconds=round(time.perf_counter() - t0, 3))
        else:
            part = _search_here(x, ids, n, plan, st, k, tau, seed, ivf_join, threads or _cores(), chunk)
        parts.append(part)
        say(f"  group {key}: {st['pairs']:,} pairs in {st['seconds']:.1f}s")
    a, b, c = (tuple(np.concatenate(v) for v in zip(*parts)) if parts else empty_pairs())
    order = np.lexsort((b, a))  # groups interleave in global ids; within a group unique
    stats["total"] = {"n": n, "groups": len(codes), "pairs": len(a), "k": int(k), "tau": float(tau),
                      "seconds": round(time.perf_counter() - t_all, 3),
                      "path": "ray" if use_ray else "in-process"}
    return PairResult(a[order], b[order], c[order], stats)


def _search_here(x, ids, n, plan, st, k, tau, seed, ivf_join, threads, chunk=QUERY_CHUNK):
    """One group built and searched in this process with `threads` cores; fills `st`."""
    faiss = load_faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(cpu_threads(threads))
    t0 = time.perf_counter()
    try:
        gx = x[ids]
        if ivf_join and plan.kind == "ivf" and not plan.gpu:
            st["plan"]["search"] = "gemm-join"
            part = dedupe(*ivf_join_pairs(gx, ids, plan.nlist, plan.nprobe, k, tau, seed=seed), n)
            st.update(build_s=0.0, search_s=round(time.perf_counter() - t0, 3), pairs=len(part[0]),
                      seconds=round(time.perf_counter() - t0, 3))
            return part
        index = build_index(gx, plan, seed=seed)
        st["build_s"] = round(time.perf_counter() - t0, 3)
        t1 = time.perf_counter()
        part = dedupe(*search_pairs(index, gx, ids, 0, len(ids), k, tau, chunk), n)
        st.update(search_s=round(time.perf_counter() - t1, 3), pairs=len(part[0]),
                  seconds=round(time.perf_counter() - t0, 3))
        return part
    finally:
        faiss.omp_set_num_threads(before)
