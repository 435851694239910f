"""The FAISS indexes of the neighbour search (`pipelines/paraphrase/neighbours.py`).

One index per polarity group: exact inner product (`IndexFlatIP`) up to `FLAT_MAX`
vectors, IVF above (HNSW on request), on GPUs when FAISS sees some. IVF centroids are
trained on a seeded sample; an index is serialised once and deserialised in each Ray
actor. In process on CPU, an IVF group is searched by `ivf_join_pairs`: one matrix
product per inverted list instead of one FAISS search per query chunk.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import numpy as np


FLAT_MAX = 50_000
"""Exact search up to this many vectors per group: 50k x 50k x 384 took 16 s on 2 cores
(IVF 8.5 s); exact results are worth that much, quadratic growth beyond is not."""


DEFAULT_NPROBE = 16
"""IVF probes. Planted near-duplicate families, d=384, recall of the >= 0.90 pairs vs exact:
n=200k (nlist 1792): nprobe 4/8/16/32 -> 0.998/0.9995/0.99997/1.0; n=500k (nlist 2832,
sampled queries): 0.995/0.9995/0.99993/1.0, search time 52/76/125/232 s on 2 cores.
16 keeps recall >= 0.9999 at a search cost ~1.6x that of 8."""


MIN_TRAIN_PER_LIST = 39
"""FAISS k-means wants at least 39 training points per centroid."""


TRAIN_PER_LIST = 64


MAX_TRAIN = 262_144


KMEANS_ITERS = 10
"""Near-duplicate recall depends on nprobe and on the training sample's size (39 instead of
64 points a list: 0.9995 instead of 0.99997 at n=200k, nprobe 16), hardly on centroid
polish (20 iterations: same recall); 10 instead of FAISS's 25 cuts training 2.5x."""



def _blas_coretype(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The OpenBLAS kernel family this x86 CPU can run, or None to leave OpenBLAS alone.

    faiss-cpu 1.15.1 wheels bundle OpenBLAS 0.3.15, which did not recognise the AVX-512
    Xeon of the 2-core benchmark VM and fell back to its generic 'Prescott' kernels:
    FAISS's exact search and k-means (its sgemm) ran 2-3x slower there than with the
    SkylakeX kernels the CPU supports (and numpy's newer OpenBLAS picks).
    """
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= set(flags):
        return "SkylakeX"
    if {"avx2", "fma"} <= set(flags):
        return "Haswell"
    return None



def load_faiss():
    """FAISS, imported lazily; OpenBLAS is told the CPU's kernel family first (read once,
    when the library loads) unless the user set OPENBLAS_CORETYPE."""
    import sys

    if "faiss" not in sys.modules and "OPENBLAS_CORETYPE" not in os.environ:
        import platform

        core = _blas_coretype() if platform.system() == "Linux" \
            and platform.machine() in ("x86_64", "AMD64") else None
        if core:
            os.environ["OPENBLAS_CORETYPE"] = core
            try:
                import faiss
            finally:  # read while the library loads; child processes detect for themselves
                os.environ.pop("OPENBLAS_CORETYPE", None)
    import faiss

    return faiss



@dataclass(frozen=True)
class IndexPlan:
    """Which FAISS index a group gets and how it is searched."""

    kind: str  # "flat" (exact inner product) | "ivf" (IndexIVFFlat) | "hnsw" (IndexHNSWFlat)
    nlist: int = 0  # ivf
    nprobe: int = 0  # ivf
    hnsw_m: int = 32
    ef_search: int = 0  # hnsw (>= k)
    gpu: bool = False  # search on GPU(s)

    def describe(self) -> dict:
        """The plan as a plain dict for stats and manifests (only the fields that apply)."""
        out: dict = {"kind": self.kind, "gpu": self.gpu}
        if self.kind == "ivf":
            out.update(nlist=self.nlist, nprobe=self.nprobe)
        elif self.kind == "hnsw":
            out.update(hnsw_m=self.hnsw_m, ef_search=self.ef_search)
        return out



def _resolve_gpu(gpu: str | bool) -> bool:
    """'auto' means: use GPUs when this process's FAISS sees some; True insists on them."""
    if gpu == "auto":
        return load_faiss().get_num_gpus() > 0
    if gpu is True or gpu is False:
        if gpu and load_faiss().get_num_gpus() == 0:
            raise RuntimeError("gpu=True but FAISS sees no GPU here (faiss.get_num_gpus() == 0; "
                               "is faiss-gpu installed and CUDA visible?); use gpu='auto' or False")
        return gpu
    raise ValueError(f"gpu must be 'auto', True or False, not {gpu!r}")



def default_nlist(n: int) -> int:
    """~4*sqrt(n) lists (rounded to a multiple of 8), capped so each list gets >= 39
    training points; at least 1."""
    nlist = max(8, round(4 * math.sqrt(max(n, 1)) / 8) * 8)
    return max(1, min(nlist, n // MIN_TRAIN_PER_LIST))



def choose_index(n: int, d: int, k: int, kind: str = "auto", *, flat_max: int = FLAT_MAX,
                 nprobe: int | None = None, gpu: str | bool = "auto") -> IndexPlan:
    """The index for a group of `n` vectors of dimension `d` searched for `k` neighbours.

    auto: exact flat up to `flat_max` vectors (exact and fast enough there), IVF above.
    HNSW has no FAISS GPU version: it is planned on CPU, and gpu=True with it is an error.
    """
    if n < 0 or d < 1 or k < 1:
        raise ValueError(f"need n >= 0, d >= 1, k >= 1 (got n={n}, d={d}, k={k})")
    if kind == "auto":
        kind = "flat" if n <= flat_max else "ivf"
    if kind not in ("flat", "ivf", "hnsw"):
        raise ValueError(f"index kind must be 'auto', 'flat', 'ivf' or 'hnsw', not {kind!r}")
    if kind == "hnsw":
        if gpu is True:
            raise ValueError("FAISS has no GPU HNSW index; use kind='ivf' or 'flat' with gpu=True")
        use_gpu = False
    else:
        use_gpu = _resolve_gpu(gpu)
    if kind == "flat":
        return IndexPlan("flat", gpu=use_gpu)
    if kind == "hnsw":
        return IndexPlan("hnsw", hnsw_m=32, ef_search=max(2 * k, 64), gpu=False)
    nlist = default_nlist(n)
    probe = DEFAULT_NPROBE if nprobe is None else int(nprobe)
    if probe < 1:
        raise ValueError(f"nprobe must be >= 1, not {probe}")
    return IndexPlan("ivf", nlist=nlist, nprobe=min(probe, nlist), gpu=use_gpu)



def _apply_params(index, plan: IndexPlan):
    """Search-time parameters of the plan (they are not all kept by serialisation)."""
    faiss = load_faiss()
    if plan.kind == "ivf":
        faiss.extract_index_ivf(index).nprobe = plan.nprobe
    elif plan.kind == "hnsw":
        faiss.downcast_index(index).hnsw.efSearch = plan.ef_search
    return index



def to_gpu(index, plan: IndexPlan):
    """A GPU copy of a CPU index (all visible GPUs); never touches CUDA on CPU machines."""
    faiss = load_faiss()
    if faiss.get_num_gpus() == 0:
        raise RuntimeError("the index plan asks for GPU search but FAISS sees no GPU here")
    gpu_index = faiss.index_cpu_to_all_gpus(index)
    if plan.kind == "ivf":
        faiss.GpuParameterSpace().set_index_parameter(gpu_index, "nprobe", plan.nprobe)
    return gpu_index



def build_index(vectors: np.ndarray, plan: IndexPlan, *, seed: int = 0,
                train_size: int | None = None):
    """Build the plan's index over `vectors` (row i gets id i).

    IVF is trained on a seeded random sample of min(n, 64*nlist, 256k) rows (spherical
    k-means, fixed iterations), so the same input and seed give the same index. With
    plan.gpu and a local GPU the index is built and returned on the GPU; without a local
    GPU (a CPU driver feeding GPU actors) it is built on CPU.
    """
    faiss = load_faiss()
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = x.shape
    if plan.kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif plan.kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, plan.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    elif plan.kind == "ivf":
        nlist = max(1, min(plan.nlist, n))
        rows = training_rows(n, nlist, seed, train_size)
        local_gpu = plan.gpu and faiss.get_num_gpus() > 0
        # The trained quantizer makes an IVF index that needs no training.
        quantizer = faiss.IndexFlatIP(d)
        quantizer.add(train_centroids(x, nlist, rows, seed, gpu=bool(local_gpu)))
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        plan = dataclasses.replace(plan, nlist=nlist)
    else:
        raise ValueError(f"unknown index kind {plan.kind!r}")
    index = _apply_params(index, plan)
    if plan.gpu and faiss.get_num_gpus() > 0:
        index = to_gpu(index, plan)
    for s in range(0, n, 65_536):  # bounded temporaries
        index.add(x[s:s + 65_536])
    return index



def training_rows(n: int, nlist: int, seed: int, train_size: int | None = None) -> np.ndarray:
    """The seeded k-means sample: min(n, 64*nlist, 256k) rows (at least nlist), sorted."""
    size = train_size or min(n, TRAIN_PER_LIST * nlist, MAX_TRAIN)
    size = max(min(size, n), nlist)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))



def train_centroids(x: np.ndarray, nlist: int, rows: np.ndarray, seed: int, gpu: bool = False) -> np.ndarray:
    """Spherical k-means (unit vectors: centroids on the sphere) on the rows `rows` of `x`."""
    faiss = load_faiss()
    km = faiss.Kmeans(x.shape[1], nlist, niter=KMEANS_ITERS, seed=seed, spherical=True,
                      max_points_per_centroid=1 << 30, gpu=gpu)
    km.train(np.ascontiguousarray(x[rows]))
    return km.centroids



def ivf_join_pairs(x: np.ndarray, ids: np.ndarray, nlist: int, nprobe: int, k: int, tau: float, *,
                   seed: int = 0, block: int = 1 << 24) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The IVF search of a group against itself, as matrix products per inverted list.

    Same partition as the IVF index (spherical k-means, same training sample) and every
    query is compared with at least the `nprobe` lists FAISS would probe for it: first all
    members of a list against the lists nearest to its centroid (one BLAS GEMM per list),
    then each query against those of its own probes that pass missed (one GEMM per target
    list). FAISS's IndexIVFFlat scans lists query by query; batching them into GEMMs is
    several times faster on 2 cores at the same or better recall (we wrote this because
    FAISS has no batched self-join; measured in benchmarks/bench_paraphrase.py). Keeps, per
    query, the `k` best candidates with cosine >= tau (ties broken by candidate id).
    Returns (a, b, cos) with a < b global ids; both directions may appear.
    """
    faiss = load_faiss()
    n, d = x.shape
    ids = np.asarray(ids, dtype=np.int64)
    nlist = max(1, min(nlist, n))
    rows = training_rows(n, nlist, seed)
    quantizer = faiss.IndexFlatIP(d)
    quantizer.add(train_centroids(x, nlist, rows, seed))
    nprobe = max(1, min(nprobe, nlist))
    probes = np.empty((n, nprobe), dtype=np.int64)
    for s in range(0, n, 65_536):
        probes[s:s + 65_536] = quantizer.search(np.ascontiguousarray(x[s:s + 65_536]), nprobe)[1]
    list_probes = quantizer.search(quantizer.reconstruct_n(0, nlist), nprobe)[1]
    covered = np.zeros((nlist, nlist), dtype=bool)
    covered[np.arange(nlist)[:, None], list_probes] = True
    covered[np.arange(nlist), np.arange(nlist)] = True
    order = np.argsort(probes[:, 0], kind="stable")  # positions grouped by their list
    xs = np.ascontiguousarray(x[order])
    pp = probes[order]
    starts = np.searchsorted(pp[:, 0], np.arange(nlist + 1))
    tau32 = np.float32(tau)
    qs, cs, vs = [], [], []

    def gemm(qpos: np.ndarray, cpos: np.ndarray) -> None:
        cx = xs[cpos]
        step = max(1, block // max(1, len(cpos)))
        for r0 in range(0, len(qpos), step):
            q = qpos[r0:r0 + step]
            sims = xs[q] @ cx.T
            r, c = np.nonzero(sims >= tau32)
            same = q[r] == cpos[c]
            r, c = r[~same], c[~same]
            qs.append(q[r])
            cs.append(cpos[c])
            vs.append(sims[r, c])

    for lst in range(nlist):  # pass 1: a list against the lists nearest to its centroid
        lo, hi = int(starts[lst]), int(starts[lst + 1])
        if hi > lo:
            lists = np.flatnonzero(covered[lst])
            gemm(np.arange(lo, hi), np.concatenate([np.arange(starts[m], starts[m + 1]) for m in lists]))
    # pass 2: each query's own probes that its list's centroid did not reach
    missing = ~covered[pp[:, :1], pp]
    qpos, slot = np.nonzero(missing)
    target = pp[qpos, slot]
    by = np.argsort(target, kind="stable")
    qpos, target = qpos[by], target[by]
    bounds = np.searchsorted(target, np.arange(nlist + 1))
    for m in range(nlist):
        if bounds[m + 1] > bounds[m] and starts[m + 1] > starts[m]:
            gemm(qpos[bounds[m]:bounds[m + 1]], np.arange(starts[m], starts[m + 1]))
    if not qs:
        return empty_pairs()
    q, c, v = np.concatenate(qs), np.concatenate(cs), np.concatenate(vs).astype(np.float32)
    # k best per query (a candidate reached twice counts once)
    o = np.lexsort((c, -v, q))
    q, c, v = q[o], c[o], v[o]
    first = np.ones(len(q), dtype=bool)
    first[1:] = (q[1:] != q[:-1]) | (c[1:] != c[:-1])
    q, c, v = q[first], c[first], v[first]
    group_start = np.searchsorted(q, q)
    keep = (np.arange(len(q)) - group_start) < k
    ga, gb = ids[order[q[keep]]], ids[order[c[keep]]]
    return np.minimum(ga, gb), np.maximum(ga, gb), v[keep]



def _is_gpu(index) -> bool:
    return "Gpu" in type(index).__name__ or "Shards" in type(index).__name__ \
        or "Replicas" in type(index).__name__



def serialize(index) -> np.ndarray:
    """Bytes of a (CPU copy of the) index, for the object store."""
    faiss = load_faiss()
    if _is_gpu(index):
        index = faiss.index_gpu_to_cpu(index)
    return faiss.serialize_index(index)



def deserialize(blob: np.ndarray, plan: IndexPlan):
    """An index from `serialize`, with the plan's search parameters, on GPU if planned."""
    index = _apply_params(load_faiss().deserialize_index(np.asarray(blob)), plan)
    return to_gpu(index, plan) if plan.gpu else index



def empty_pairs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
