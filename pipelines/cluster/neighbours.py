"""Candidate pairs for STAR clustering: each statement's K nearest same-polarity neighbours.

STAR (seed paper 002, appendix B.3) links two statements when one is among the other's
K nearest neighbours (K=128) within the same polarity and their cosine is >= tau_pair
(0.90). Embeddings are L2-normalised, so inner product is cosine. One FAISS index per
polarity group: exact (`IndexFlatIP`) while a group is small, IVF above `flat_max`,
where exact search is quadratic (1M x 384: over an hour on 2 cores) and an IVF
index with enough probes finds >= 0.99 of the near-duplicate pairs (measured, see
`DEFAULT_NPROBE`; the indexes are planned and built in `pipelines/cluster/index.py`).
Queries are searched in chunks, so memory stays at the vectors plus one index; with
`workers > 1` each group's index is built by a Ray task on a worker (its bytes stay in
the object store, never in the calling process) and the group's queries are sharded over
Ray actors that each deserialise it once. Whether those tasks use GPUs is what they ask
for (`gpu`), not what the cluster holds at the start: an autoscaling cluster may have no
GPU node until a task asks for one.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from rexeval.pipelines.cluster.index import (FLAT_MAX, IndexPlan, build_index, choose_index, deserialize,
                                              empty_pairs, ivf_join_pairs, load_faiss, serialize)
from rexeval.pipelines.core.stage import Resources, Stage

NORM_TOL = 1e-3


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
        return empty_pairs()
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
            load_faiss().omp_set_num_threads(int(self.resources.cpus))

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


def build_serialized(vectors: np.ndarray, plan: IndexPlan, seed: int, threads: int) -> tuple[np.ndarray, dict]:
    """One group's index built where this runs (a Ray task), as bytes for the object
    store, and how it went: {"pid", "build_s"}."""
    t0 = time.perf_counter()
    faiss = load_faiss()
    faiss.omp_set_num_threads(max(1, int(threads)))
    blob = serialize(build_index(vectors, plan, seed=seed))
    return blob, {"pid": os.getpid(), "build_s": round(time.perf_counter() - t0, 3)}


def submit_build(vectors, plan: IndexPlan, seed: int, resources: Resources):
    """(index bytes, info) object refs of `build_serialized` run as a Ray task with the
    search stage's `resources` (its GPU, when the plan searches on one)."""
    import ray

    task = ray.remote(build_serialized).options(num_cpus=resources.cpus, num_gpus=resources.gpus,
                                                num_returns=2)
    return task.remote(vectors, plan, seed, int(resources.cpus))


def candidate_pairs(vectors: np.ndarray, groups: np.ndarray, *, k: int = 128, tau: float = 0.90,
                    kind: str = "auto", nprobe: int | None = None, workers: int | None = 1,
                    gpu: str | bool = "auto", seed: int = 0,
                    progress: Callable[[str], None] | None = None, flat_max: int = FLAT_MAX,
                    shards_per_worker: int = 4, ivf_join: bool = True,
                    threads: int | None = None) -> PairResult:
    """Candidate pairs within each group: k nearest neighbours with cosine >= tau.

    workers=1 (or None) builds and searches in this process with `threads` cores
    (default: every core it may run on). workers > 1 builds each group's index in a Ray
    task and shards its queries over a pool of up to `workers` Ray actors, each task and
    actor asking for `threads` CPUs (default: `stage.cpu_share(workers)`) and using as
    many; both paths give the same pairs. The settings decide, never the nodes a
    cluster has up now. In process on CPU, an IVF group is searched
    by `ivf_join_pairs` (one GEMM per list) unless `ivf_join=False` (FAISS's own
    IndexIVFFlat search, as the actors do).
    """
    t_all = time.perf_counter()
    x, g = _validate(vectors, groups, k, tau)
    say = progress or (lambda _m: None)
    n, d = x.shape
    use_ray = workers is not None and workers > 1
    if use_ray:
        from rexeval.pipelines.core.runtime import init_ray
        from rexeval.pipelines.core.stage import cpu_share

        ray = init_ray()
        gpu_search = _ray_gpu(gpu)
        task_resources = Resources(cpus=float(threads or cpu_share(workers)), gpus=1 if gpu_search else 0)
        if gpu_search and _no_gpu_now():
            say("neighbours: no GPU in the cluster now; the GPU tasks wait for one "
                "(an autoscaler adds a GPU node on demand)")

    codes, inverse = np.unique(g, return_inverse=True)
    stats: dict = {}
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    refs: dict[int, GroupRefs] = {}
    builds: dict[int, object] = {}
    tasks: list[dict] = []
    for gi, code in enumerate(codes):
        ids = np.flatnonzero(inverse == gi)
        key = _key(code)
        st = stats[key] = {"n": len(ids), "plan": None, "pairs": 0}
        if len(ids) < 2:
            continue
        if use_ray:  # GPUs, if any, are the tasks'; plan without looking for one here
            plan = choose_index(len(ids), d, k, kind, flat_max=flat_max, nprobe=nprobe, gpu=False)
            plan = dataclasses.replace(plan, gpu=gpu_search and plan.kind != "hnsw")
        else:
            plan = choose_index(len(ids), d, k, kind, flat_max=flat_max, nprobe=nprobe, gpu=gpu)
        st["plan"] = plan.describe()
        say(f"neighbours: group {key}: {len(ids):,} vectors, {plan.describe()}")
        if use_ray:
            vectors_ref, ids_ref = ray.put(x[ids]), ray.put(ids)
            index_ref, builds[gi] = submit_build(vectors_ref, plan, seed,
                                                 dataclasses.replace(task_resources,
                                                                     gpus=1 if plan.gpu else 0))
            refs[gi] = GroupRefs(plan, index_ref, vectors_ref, ids_ref)
            step = max(MIN_SHARD, -(-len(ids) // (workers * shards_per_worker)))
            tasks += [{"group": gi, "start": s, "end": min(s + step, len(ids))}
                      for s in range(0, len(ids), step)]
            continue
        parts.append(_search_here(x, ids, n, plan, st, k, tau, seed, ivf_join, threads or _cores()))
        say(f"  group {key}: {st['pairs']:,} pairs in {st['seconds']:.1f}s")
    if builds:
        for gi, info in zip(builds, ray.get(list(builds.values()))):
            stats[_key(codes[gi])]["build_s"] = info["build_s"]
    if tasks:
        t1 = time.perf_counter()
        parts += _run_on_ray(refs, tasks, codes, stats, k, tau, workers, task_resources, n, say)
        search_s = round(time.perf_counter() - t1, 3)  # one pool for all groups
    a, b, c = (tuple(np.concatenate(v) for v in zip(*parts)) if parts else empty_pairs())
    order = np.lexsort((b, a))  # groups interleave in global ids; within a group unique
    stats["total"] = {"n": n, "groups": len(codes), "pairs": len(a), "k": int(k), "tau": float(tau),
                      "seconds": round(time.perf_counter() - t_all, 3),
                      "path": "ray" if use_ray else "in-process"}
    if tasks:
        stats["total"]["ray_search_s"] = search_s
    return PairResult(a[order], b[order], c[order], stats)


def _search_here(x, ids, n, plan, st, k, tau, seed, ivf_join, threads):
    """One group built and searched in this process with `threads` cores; fills `st`."""
    faiss = load_faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
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
        part = dedupe(*search_pairs(index, gx, ids, 0, len(ids), k, tau), n)
        st.update(search_s=round(time.perf_counter() - t1, 3), pairs=len(part[0]),
                  seconds=round(time.perf_counter() - t0, 3))
        return part
    finally:
        faiss.omp_set_num_threads(before)


def _run_on_ray(refs, tasks, codes, stats, k, tau, workers, resources, n, say):
    """Shard the queries of every group over an actor pool; deduplicated pairs per group."""
    from rexeval.pipelines.core.runtime import run_tasks
    from rexeval.pipelines.core.stage import pool_size

    stage = NeighbourStage(refs, k, tau, cpus=resources.cpus, gpu=bool(resources.gpus))
    got: dict[int, list] = {gi: [] for gi in refs}
    for done, row in enumerate(run_tasks(tasks, stage, pool_size(workers, len(tasks))), 1):
        gi = row["group"]
        got[gi].append((np.frombuffer(row["a"], np.int64), np.frombuffer(row["b"], np.int64),
                        np.frombuffer(row["cos"], np.float32)))
        st = stats[_key(codes[gi])]
        st["shard_s"] = round(st.get("shard_s", 0) + row["seconds"], 3)  # actor-seconds
        say(f"  shard {done}/{len(tasks)}: group {_key(codes[gi])} rows {row['start']}-{row['end']}"
            f" in {row['seconds']:.1f}s")
    parts = []
    for gi, pieces in got.items():
        part = (tuple(np.concatenate(v) for v in zip(*pieces)) if pieces else empty_pairs())
        parts.append(dedupe(*part, n))
        stats[_key(codes[gi])]["pairs"] = len(parts[-1][0])
    return parts
