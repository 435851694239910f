"""Candidate pairs for STAR clustering: each statement's K nearest same-polarity neighbours.

STAR (seed paper 002, appendix B.3) links two statements when one is among the other's
K nearest neighbours (K=128) within the same polarity and their cosine is >= tau_pair
(0.90). Embeddings are L2-normalised, so inner product is cosine. One FAISS index per
polarity group: exact (`IndexFlatIP`) while a group is small, IVF above `flat_max`,
where exact search is quadratic (1M x 384: over an hour on 2 cores) and an IVF
index with enough probes finds >= 0.99 of the near-duplicate pairs (measured, see
`DEFAULT_NPROBE`). Queries are searched in chunks, so memory stays at the vectors plus
one index; with `workers > 1` the queries of each group are sharded over Ray actors
that each deserialise the group's index once.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from rexeval.pipelines.core.stage import Resources, Stage

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
NORM_TOL = 1e-3


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


def _faiss():
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


@dataclass
class PairResult:
    """Candidate pairs a < b (global row ids), sorted by (a, b), with their cosine."""

    a: np.ndarray  # int64
    b: np.ndarray  # int64
    cos: np.ndarray  # float32
    stats: dict = field(default_factory=dict)  # {str(group): {...}, "total": {...}}

    def __len__(self) -> int:
        return len(self.a)


# ---------------------------------------------------------------------------- planning

def _resolve_gpu(gpu: str | bool) -> bool:
    """'auto' means: use GPUs when this process's FAISS sees some; True insists on them."""
    if gpu == "auto":
        return _faiss().get_num_gpus() > 0
    if gpu is True or gpu is False:
        if gpu and _faiss().get_num_gpus() == 0:
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


# ---------------------------------------------------------------------------- index

def _apply_params(index, plan: IndexPlan):
    """Search-time parameters of the plan (they are not all kept by serialisation)."""
    faiss = _faiss()
    if plan.kind == "ivf":
        faiss.extract_index_ivf(index).nprobe = plan.nprobe
    elif plan.kind == "hnsw":
        faiss.downcast_index(index).hnsw.efSearch = plan.ef_search
    return index


def to_gpu(index, plan: IndexPlan):
    """A GPU copy of a CPU index (all visible GPUs); never touches CUDA on CPU machines."""
    faiss = _faiss()
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
    faiss = _faiss()
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
    faiss = _faiss()
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
    FAISS has no batched self-join; measured in benchmarks/bench_cluster.py). Keeps, per
    query, the `k` best candidates with cosine >= tau (ties broken by candidate id).
    Returns (a, b, cos) with a < b global ids; both directions may appear.
    """
    faiss = _faiss()
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
        return _empty()
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
    faiss = _faiss()
    if _is_gpu(index):
        index = faiss.index_gpu_to_cpu(index)
    return faiss.serialize_index(index)


def deserialize(blob: np.ndarray, plan: IndexPlan):
    """An index from `serialize`, with the plan's search parameters, on GPU if planned."""
    index = _apply_params(_faiss().deserialize_index(np.asarray(blob)), plan)
    return to_gpu(index, plan) if plan.gpu else index


# ---------------------------------------------------------------------------- search

def search_pairs(index, vectors: np.ndarray, ids: np.ndarray, start: int, end: int, k: int,
                 tau: float, chunk: int = 16384) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs from querying rows [start, end) of `vectors` (the rows the index holds).

    Each query keeps its first `k` neighbours other than itself (k+1 are asked for, so
    the self match does not cost a neighbour), then those with cosine >= tau. Returns
    (a, b, cos) with a < b global ids (`ids[local row]`); a pair found from both ends
    appears twice (deduplicated by the caller). Chunked, so memory is O(chunk * k).
    """
    ntotal = int(index.ntotal)
    kk = min(k + 1, ntotal)
    ids = np.asarray(ids, dtype=np.int64)
    out_a, out_b, out_c = [], [], []
    if kk <= 0 or end <= start:
        return _empty()
    for s in range(start, end, chunk):
        e = min(s + chunk, end)
        q = np.ascontiguousarray(vectors[s:e], dtype=np.float32)
        sims, nbr = index.search(q, kk)
        rows = np.arange(s, e, dtype=np.int64)[:, None]
        real = (nbr >= 0) & (nbr != rows)
        keep = real & (np.cumsum(real, axis=1) <= k) & (sims >= np.float32(tau))
        r, c = np.nonzero(keep)
        ga = ids[rows[r, 0]]
        gb = ids[nbr[r, c]]
        out_a.append(np.minimum(ga, gb))
        out_b.append(np.maximum(ga, gb))
        out_c.append(sims[r, c].astype(np.float32, copy=False))
    return np.concatenate(out_a), np.concatenate(out_b), np.concatenate(out_c)


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)


def dedupe(a: np.ndarray, b: np.ndarray, cos: np.ndarray, n: int):
    """Unique (a, b) pairs sorted by (a, b), keeping the larger cosine of duplicates."""
    if len(a) == 0:
        return _empty()
    key = a.astype(np.int64) * np.int64(max(n, 1)) + b
    order = np.lexsort((-cos, key))
    key = key[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    sel = order[first]
    return a[sel], b[sel], cos[sel]


# ---------------------------------------------------------------------------- validation

def _validate(vectors, groups, k: int, tau: float) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2:
        shape = getattr(vectors, "shape", None)
        raise ValueError(f"vectors must be a 2-D array [n, d], got shape {shape}")
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    g = np.asarray(groups)
    if g.ndim != 1 or len(g) != len(x):
        raise ValueError(f"groups must be 1-D with one entry per vector: {g.shape} vs {len(x)} rows")
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, not {k}")
    if not -1.0 <= float(tau) <= 1.0:
        raise ValueError(f"tau is a cosine in [-1, 1], not {tau}")
    for s in range(0, len(x), 65_536):  # chunked: a full isfinite mask of 1M x 384 is 384 MB
        c = x[s:s + 65_536]
        sq = np.einsum("ij,ij->i", c, c)
        bad = ~np.isfinite(sq)
        if bad.any() and not np.isfinite(c[bad]).all():
            row = s + int(np.flatnonzero(bad)[0])
            raise ValueError(f"vectors contain NaN or infinite values (first at row {row})")
        off = bad | (np.abs(np.sqrt(sq) - 1.0) > NORM_TOL)
        if off.any():
            row = s + int(np.flatnonzero(off)[0])
            raise ValueError(f"vectors must be L2-normalised (unit norm within {NORM_TOL}); "
                             f"row {row} has norm {float(np.sqrt(sq[row - s])):.6g}")
    return x, g


# ---------------------------------------------------------------------------- Ray stage

_RESULT = pa.schema([("group", pa.int64()), ("start", pa.int64()), ("end", pa.int64()),
                     ("a", pa.large_binary()), ("b", pa.large_binary()),
                     ("cos", pa.large_binary()), ("seconds", pa.float64())])


@dataclass(frozen=True)
class GroupRefs:
    """One group's index and data in the object store."""

    plan: IndexPlan
    index: object  # ObjectRef of serialize(index): uint8 array
    vectors: object  # ObjectRef of the group's float32 vectors
    ids: object  # ObjectRef of the group's global ids (int64)


class NeighbourStage(Stage):
    """Search one query shard of one group per task; pairs go back as raw array bytes.

    The index and vectors arrive as object refs (shared memory on each node, not copied
    into every task); an actor deserialises a group's index once and keeps only the
    current group's, since tasks come group by group.
    """

    name = "neighbours"
    batch_size = 1

    def __init__(self, groups: dict[int, GroupRefs], k: int, tau: float, cpus: float = 1,
                 gpu: bool = False, chunk: int = 16384):
        self.groups, self.k, self.tau, self.chunk = groups, int(k), float(tau), int(chunk)
        self.resources = Resources(cpus=cpus, gpus=1 if gpu else 0)
        self._cached: tuple[int, object, np.ndarray, np.ndarray] | None = None

    def setup(self) -> None:
        if self.resources.cpus >= 1:  # Ray sets OMP threads to 1 otherwise
            _faiss().omp_set_num_threads(int(self.resources.cpus))

    def _group(self, gid: int):
        if self._cached is None or self._cached[0] != gid:
            import ray

            self._cached = None  # free the previous group's index first
            refs = self.groups[gid]
            index = deserialize(ray.get(refs.index), refs.plan)
            self._cached = (gid, index, ray.get(refs.vectors), ray.get(refs.ids))
        return self._cached[1:]

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for task in batch.to_pylist():
            t0 = time.perf_counter()
            index, vectors, ids = self._group(task["group"])
            a, b, c = search_pairs(index, vectors, ids, task["start"], task["end"], self.k,
                                   self.tau, self.chunk)
            a, b, c = dedupe(a, b, c, int(ids.max()) + 1 if len(ids) else 1)
            rows.append({**task, "a": a.tobytes(), "b": b.tobytes(), "cos": c.tobytes(),
                         "seconds": time.perf_counter() - t0})
        return pa.Table.from_pylist(rows, schema=_RESULT)


# ---------------------------------------------------------------------------- driver

MIN_SHARD = 1024
"""Smallest query shard on the Ray path: below this, task overhead beats the search."""


def _cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def _key(code) -> str:
    return str(code.item() if hasattr(code, "item") else code)


def _ray_multi_node() -> bool:
    import ray

    return ray.is_initialized() and sum(1 for nd in ray.nodes() if nd.get("Alive")) > 1


def _ray_gpu(gpu: str | bool) -> bool:
    """On the Ray path GPUs are the cluster's: a CPU-only driver may feed GPU actors."""
    import ray

    have = ray.cluster_resources().get("GPU", 0) > 0
    if gpu == "auto":
        return have
    if gpu is True and not have:
        raise RuntimeError("gpu=True but the Ray cluster has no GPU")
    if gpu not in (True, False):
        raise ValueError(f"gpu must be 'auto', True or False, not {gpu!r}")
    return bool(gpu)


def candidate_pairs(vectors: np.ndarray, groups: np.ndarray, *, k: int = 128, tau: float = 0.90,
                    kind: str = "auto", nprobe: int | None = None, workers: int | None = 1,
                    gpu: str | bool = "auto", seed: int = 0,
                    progress: Callable[[str], None] | None = None, flat_max: int = FLAT_MAX,
                    shards_per_worker: int = 4, ivf_join: bool = True) -> PairResult:
    """Candidate pairs within each group: k nearest neighbours with cosine >= tau.

    workers=1 searches in this process with every core. workers > 1, or None on a
    multi-node Ray cluster (one actor per node, or per GPU), builds each group's index
    here and shards its queries over Ray actors; both paths give the same pairs.
    In process on CPU, an IVF group is searched by `ivf_join_pairs` (one GEMM per list)
    unless `ivf_join=False` (FAISS's own IndexIVFFlat search, as the actors do).
    """
    t_all = time.perf_counter()
    x, g = _validate(vectors, groups, k, tau)
    say = progress or (lambda _m: None)
    n, d = x.shape
    use_ray = workers is not None and workers > 1
    if workers is None:
        use_ray = _ray_multi_node()
    if use_ray:
        from rexeval.pipelines.core.runtime import init_ray

        ray = init_ray()
        gpu_search = _ray_gpu(gpu)
        res = ray.cluster_resources()
        if workers is None:
            workers = (int(res.get("GPU", 1)) if gpu_search
                       else sum(1 for nd in ray.nodes() if nd.get("Alive")))
        # no more actors than the cluster can hold at once (a fixed pool would wait forever)
        workers = max(1, min(workers, int(res.get("GPU" if gpu_search else "CPU", 1))))

    codes, inverse = np.unique(g, return_inverse=True)
    stats: dict = {}
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    refs: dict[int, GroupRefs] = {}
    tasks: list[dict] = []
    faiss = _faiss()
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(_cores())  # build (and in-process search) on every core
    try:
        for gi, code in enumerate(codes):
            ids = np.flatnonzero(inverse == gi)
            key = _key(code)
            st = stats[key] = {"n": len(ids), "plan": None, "pairs": 0}
            if len(ids) < 2:
                continue
            t0 = time.perf_counter()
            if use_ray:  # GPUs, if any, are the actors'; plan and build without them
                plan = choose_index(len(ids), d, k, kind, flat_max=flat_max, nprobe=nprobe, gpu=False)
                plan = dataclasses.replace(plan, gpu=gpu_search and plan.kind != "hnsw")
            else:
                plan = choose_index(len(ids), d, k, kind, flat_max=flat_max, nprobe=nprobe, gpu=gpu)
            st["plan"] = plan.describe()
            say(f"neighbours: group {key}: {len(ids):,} vectors, {plan.describe()}")
            gx = x[ids]
            if not use_ray and ivf_join and plan.kind == "ivf" and not plan.gpu:
                st["plan"]["search"] = "gemm-join"
                parts.append(dedupe(*ivf_join_pairs(gx, ids, plan.nlist, plan.nprobe, k, tau, seed=seed), n))
                del gx
                st.update(build_s=0.0, search_s=round(time.perf_counter() - t0, 3), pairs=len(parts[-1][0]),
                          seconds=round(time.perf_counter() - t0, 3))
                say(f"  group {key}: {st['pairs']:,} pairs in {st['seconds']:.1f}s")
                continue
            index = build_index(gx, plan, seed=seed)
            st["build_s"] = round(time.perf_counter() - t0, 3)
            if use_ray:
                refs[gi] = GroupRefs(plan, ray.put(serialize(index)), ray.put(gx), ray.put(ids))
                step = max(MIN_SHARD, -(-len(ids) // (workers * shards_per_worker)))
                tasks += [{"group": gi, "start": s, "end": min(s + step, len(ids))}
                          for s in range(0, len(ids), step)]
                continue
            t1 = time.perf_counter()
            parts.append(dedupe(*search_pairs(index, gx, ids, 0, len(ids), k, tau), n))
            del index, gx
            st.update(search_s=round(time.perf_counter() - t1, 3), pairs=len(parts[-1][0]),
                      seconds=round(time.perf_counter() - t0, 3))
            say(f"  group {key}: {st['pairs']:,} pairs in {st['seconds']:.1f}s")
    finally:
        faiss.omp_set_num_threads(threads)
    if tasks:
        t1 = time.perf_counter()
        parts += _run_on_ray(refs, tasks, codes, stats, k, tau, workers, gpu_search, n, say)
        search_s = round(time.perf_counter() - t1, 3)  # one pool for all groups
    a, b, c = (tuple(np.concatenate(v) for v in zip(*parts)) if parts else _empty())
    order = np.lexsort((b, a))  # groups interleave in global ids; within a group unique
    stats["total"] = {"n": n, "groups": len(codes), "pairs": len(a), "k": int(k), "tau": float(tau),
                      "seconds": round(time.perf_counter() - t_all, 3),
                      "path": "ray" if use_ray else "in-process"}
    if tasks:
        stats["total"]["ray_search_s"] = search_s
    return PairResult(a[order], b[order], c[order], stats)


def _run_on_ray(refs, tasks, codes, stats, k, tau, workers, gpu, n, say):
    """Shard the queries of every group over an actor pool; deduplicated pairs per group."""
    import ray

    from rexeval.pipelines.core.runtime import run_tasks

    cpus = max(1.0, float(int(ray.cluster_resources().get("CPU", 1) // workers)))
    stage = NeighbourStage(refs, k, tau, cpus=cpus, gpu=gpu)
    got: dict[int, list] = {gi: [] for gi in refs}
    for done, row in enumerate(run_tasks(tasks, stage, min(workers, len(tasks))), 1):
        gi = row["group"]
        got[gi].append((np.frombuffer(row["a"], np.int64), np.frombuffer(row["b"], np.int64),
                        np.frombuffer(row["cos"], np.float32)))
        st = stats[_key(codes[gi])]
        st["shard_s"] = round(st.get("shard_s", 0) + row["seconds"], 3)  # actor-seconds
        say(f"  shard {done}/{len(tasks)}: group {_key(codes[gi])} rows {row['start']}-{row['end']}"
            f" in {row['seconds']:.1f}s")
    parts = []
    for gi, pieces in got.items():
        part = (tuple(np.concatenate(v) for v in zip(*pieces)) if pieces else _empty())
        parts.append(dedupe(*part, n))
        stats[_key(codes[gi])]["pairs"] = len(parts[-1][0])
    return parts
