"""A polarity group's FAISS index split over Ray actors, one shard each, never copied.

Why: at the scale the platform is for, one group's flat index of 384-dimension vectors is
hundreds of GB, so no single task can build it and no actor can hold it. Here a group's rows
are cut into contiguous shards (`shard_bounds`); each `IndexShard` actor loads only its own
rows (a `RowSource`: the embeddings in storage, or an object-store slice), builds its part
and keeps nothing else (its queries are read back from its own index). How many shards
follows from the group's size and the per-shard memory budget (`index_shard_gib`), and is at
least the search workers asked for; the nodes alive at the start are never read.

- Flat shards give exact search.
- IVF shards share one set of centroids, trained once on a seeded sample of the whole group
  (`index.training_rows`, as one index would be), so every vector lands in the list one
  index would put it in; each shard adds only its own vectors. A query chunk's probes are
  found once, from those centroids, and handed to every shard (`search_preassigned`), so
  the coarse search is not repeated per shard.

Search (`sharded_pairs`): every query chunk goes to every shard (`query_chunk`, a Ray task,
so no actor waits on another), and the per-shard top-kk lists are merged into the global
top-kk by (cosine descending, row ascending) (`exact_topk`). A shard whose list may have
been cut inside a tie at the merged boundary is asked again for more, so ties resolve by row
as with one index searched under the same rule (`neighbours.search_pairs` uses it too).

Same answers, bit for bit. FAISS computes exact inner products with BLAS in blocks of
`distance_compute_blas_database_bs` (1024) database rows, and a product's last bits depend
on the block it falls in and on the query chunk. Shard bounds and query chunks are
multiples of `align_rows` (the chunk and that block size), so every product is computed as
the one-index search computes it: Flat pairs and cosines equal `candidate_pairs`'s
in-process pairs exactly (tests/pipelines/paraphrase/test_shards.py). IVF scans lists with
per-vector dot products, which do not depend on blocks.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rexeval.pipelines.paraphrase.index import (IndexPlan, empty_pairs, load_faiss, to_gpu, train_centroids,
                                              training_rows)
from rexeval.pipelines.core.stage import Resources
from rexeval.threads import cpu_threads

INDEX_SHARD_GIB = 8.0
"""Default per-shard memory budget (GiB): the vectors a shard's index holds, not counting
the query chunks in flight. 1M x 384 float32 is 1.43 GiB."""

QUERY_CHUNK = 16_384
"""Queries per search call, as `neighbours.search_pairs` chunks them."""

CHUNKS_IN_FLIGHT_PER_SHARD = 2
"""Query chunks out at once per shard: enough to keep every shard busy while results are
merged, few enough that the chunks' results stay small."""


def align_rows(chunk: int = QUERY_CHUNK) -> int:
    """The unit of shard bounds: a multiple of the query chunk and of FAISS's BLAS database
    block, so each inner product is computed in the same block as with one index."""
    block = int(getattr(load_faiss().cvar, "distance_compute_blas_database_bs", 1024)) or 1024
    return math.lcm(int(chunk), block)


def vector_bytes(d: int, kind: str) -> int:
    """Bytes one vector costs in a shard's index: its floats, plus for IVF its id in the
    inverted list and its slot in the direct map (which reads the queries back)."""
    return 4 * d + (16 if kind == "ivf" else 0)


def shards_for(n: int, d: int, kind: str, budget_gib: float, workers: int = 1) -> int:
    """How many shards a group of `n` vectors needs: enough that each holds at most
    `budget_gib`, and at least `workers` (each search worker holds a shard, not a copy)."""
    if budget_gib <= 0:
        raise ValueError(f"index_shard_gib must be > 0, not {budget_gib}")
    need = math.ceil(n * vector_bytes(d, kind) / (budget_gib * (1 << 30)))
    return max(1, int(workers), need)


def shard_bounds(n: int, shards: int, align: int) -> list[int]:
    """Row bounds [0, b1, ..., n] of up to `shards` contiguous shards: bound i is the
    multiple of `align` nearest i * n / shards, so each shard is within about half an
    `align` of its share (16,384 rows: 24 MiB at 384 dimensions), and a last shard shorter
    than `align` joins the one before it. Fewer shards come back when `n` is too small."""
    if n <= 0:
        return [0]
    shards = max(1, int(shards))
    inner = sorted({align * round(i * n / shards / align) for i in range(1, shards)} - {0})
    bounds = [0] + [b for b in inner if b < n] + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < align:
        del bounds[-2]
    return bounds


NORM_TOL = 1e-3


def check_unit(x: np.ndarray, rows: np.ndarray) -> None:
    """Refuse vectors that are not finite and L2-normalised (inner product is cosine only
    then), naming the first bad one by its row in `rows`."""
    for s in range(0, len(x), 65_536):  # chunked: a full isfinite mask of 1M x 384 is 384 MB
        c = x[s:s + 65_536]
        sq = np.einsum("ij,ij->i", c, c)
        bad = ~np.isfinite(sq)
        if bad.any() and not np.isfinite(c[bad]).all():
            row = s + int(np.flatnonzero(bad)[0])
            raise ValueError(f"vectors contain NaN or infinite values (first at row {int(rows[row])})")
        off = bad | (np.abs(np.sqrt(sq) - 1.0) > NORM_TOL)
        if off.any():
            row = s + int(np.flatnonzero(off)[0])
            raise ValueError(f"vectors must be L2-normalised (unit norm within {NORM_TOL}); "
                             f"row {int(rows[row])} has norm {float(np.sqrt(sq[row - s])):.6g}")


# ------------------------------------------------------------------------- the merge rule

def canonical_topk(sims: np.ndarray, rows: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's `kk` best (cosine descending, then row ascending), from candidate
    columns; FAISS's -1 (no result) sorts last."""
    sims = np.where(rows >= 0, sims, -np.inf).astype(np.float32, copy=False)
    big = np.where(rows >= 0, rows, np.iinfo(np.int64).max)
    order = np.lexsort((big, -sims), axis=-1)[:, :kk]
    return np.take_along_axis(sims, order, 1), np.take_along_axis(rows, order, 1)


def exact_topk(search: Sequence[Callable], q: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """The global top-`kk` of queries `q` over the parts that `search` holds (one callable
    per part: (queries, k, row selection) -> (sims, rows)), ties by row.

    A part's top-k is right above its k-th value but arbitrary among rows tied there, so a
    part whose k-th value reaches the merged boundary is asked again, with twice the k,
    for those queries, until each part's list ends below the boundary or is exhausted."""
    got = [fn(q, kk, None) for fn in search]
    asked = [kk] * len(search)
    while True:
        sims, rows = canonical_topk(np.concatenate([g[0] for g in got], 1),
                                    np.concatenate([g[1] for g in got], 1), kk)
        boundary = sims[:, -1] if sims.shape[1] else np.full(len(q), -np.inf, np.float32)
        again = False
        for p, (ps, pr) in enumerate(got):
            if pr.shape[1] < asked[p] or not pr.shape[1]:  # the part gave all it holds
                continue
            cut = (pr[:, -1] >= 0) & np.isfinite(boundary) & (ps[:, -1] >= boundary)
            which = np.flatnonzero(cut)
            if len(which) == 0:
                continue
            again = True
            more = asked[p] * 2
            ms, mr = search[p](q, more, which)
            ps2 = np.full((len(q), ms.shape[1]), -np.inf, np.float32)
            pr2 = np.full((len(q), ms.shape[1]), -1, np.int64)
            ps2[:, :ps.shape[1]], pr2[:, :pr.shape[1]] = ps, pr
            ps2[which], pr2[which] = ms, mr
            got[p], asked[p] = (ps2, pr2), more
        if not again:
            return sims, rows


def pairs_from_topk(sims: np.ndarray, rows: np.ndarray, query_rows: np.ndarray, ids: np.ndarray, k: int,
                    tau: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query's first `k` neighbours other than itself with cosine >= tau, as (a, b,
    cos) with a < b global ids (`ids[group row]`)."""
    real = (rows >= 0) & (rows != query_rows[:, None])
    keep = real & (np.cumsum(real, axis=1) <= k) & (sims >= np.float32(tau))
    r, c = np.nonzero(keep)
    ga, gb = ids[query_rows[r]], ids[rows[r, c]]
    return np.minimum(ga, gb), np.maximum(ga, gb), sims[r, c].astype(np.float32, copy=False)


# ------------------------------------------------------------------------- where rows come from

class RowSource(abc.ABC):
    """Where a shard's vectors come from: `rows(group_rows) -> float32 [len, d]`. Picklable,
    so each actor reads its own rows where it runs."""

    @abc.abstractmethod
    def rows(self, group_rows: np.ndarray) -> np.ndarray:
        """The vectors of group rows `group_rows`, in that order."""

    def global_rows(self, lo: int, hi: int) -> np.ndarray:
        """How an error names group rows [lo, hi): their rows in the whole input when the
        source knows them, else their rows in the group."""
        return np.arange(lo, hi, dtype=np.int64)


class SliceSource(RowSource):
    """Vectors already split by shard, one object-store ref per shard (a caller that holds
    the group in memory): shard `i`'s ref holds rows bounds[i]..bounds[i+1]."""

    def __init__(self, refs: list, bounds: list[int]):
        self.refs, self.bounds = refs, bounds

    def rows(self, group_rows: np.ndarray) -> np.ndarray:
        import ray

        b = np.asarray(self.bounds)
        which = np.searchsorted(b, group_rows, side="right") - 1
        out = [ray.get(self.refs[i])[group_rows[which == i] - b[i]] for i in np.unique(which)]
        return np.ascontiguousarray(np.concatenate(out)) if out else np.zeros((0, 0), np.float32)


@dataclass(frozen=True)
class EmbeddingsAt:
    """An embeddings folder of `n` rows of dimension `d` (`embed.TABLE`), searched where it
    is: `candidate_pairs` given one hands each shard an `EmbeddingSource` of its rows."""

    folder: str
    n: int
    d: int

    def source(self, ids_ref) -> "EmbeddingSource":
        return EmbeddingSource(self.folder, ids_ref)

    def read(self) -> np.ndarray:
        """The whole matrix (for a search in one process)."""
        from rexeval.pipelines.paraphrase.embed import read_vectors

        return read_vectors(self.folder, self.n)


class EmbeddingSource(RowSource):
    """A group's rows read from an embeddings folder (`embed.TABLE` shards with a `row`
    column): only the files that hold them, only the rows asked for."""

    def __init__(self, folder: str, ids: object):
        self.folder, self.ids = str(folder), ids  # ids: an object ref of the group's global ids

    def rows(self, group_rows: np.ndarray) -> np.ndarray:
        import ray

        from rexeval.pipelines.paraphrase.embed import read_rows

        return read_rows(self.folder, ray.get(self.ids)[group_rows])

    def global_rows(self, lo: int, hi: int) -> np.ndarray:
        import ray

        return np.asarray(ray.get(self.ids))[lo:hi]


# ------------------------------------------------------------------------- the shard actor

@dataclass(frozen=True)
class ShardSpec:
    """One shard: its group rows [lo, hi), the index plan, the IVF centroids' ref (None for
    Flat) and the FAISS threads it runs."""

    lo: int
    hi: int
    plan: IndexPlan
    centroids: object = None
    threads: int = 1


def reset_peak_rss() -> int:
    """Start measuring this process's peak RSS afresh (Linux: `clear_refs` 5 resets VmHWM;
    a Ray worker may have run other work before) and return its RSS now, in bytes. The
    /proc files are the kernel's view of this process, not data: not the storage module's."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    return peak_rss()


def peak_rss() -> int:
    """This process's peak RSS since the last `reset_peak_rss`, in bytes (VmHWM; the
    lifetime peak where /proc is missing)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


class IndexShard:
    """A Ray actor holding one shard's index (`ShardSpec`), built from its own rows only."""

    def __init__(self, spec: ShardSpec, source: RowSource):
        faiss = load_faiss()
        faiss.omp_set_num_threads(cpu_threads(spec.threads))
        t0 = time.perf_counter()
        self.base_rss = reset_peak_rss()
        self.spec = spec
        x = source.rows(np.arange(spec.lo, spec.hi, dtype=np.int64))
        check_unit(x, source.global_rows(spec.lo, spec.hi))
        d = x.shape[1]
        if spec.plan.kind == "ivf":
            import ray

            centroids = np.ascontiguousarray(ray.get(spec.centroids), dtype=np.float32)
            self.quantizer = faiss.IndexFlatIP(d)
            self.quantizer.add(centroids)
            self.index = faiss.IndexIVFFlat(self.quantizer, d, len(centroids), faiss.METRIC_INNER_PRODUCT)
            self.index.nprobe = spec.plan.nprobe
            self.index.set_direct_map_type(faiss.DirectMap.Array)
        else:
            self.quantizer = None
            self.index = faiss.IndexFlatIP(d)
        for s in range(0, len(x), 65_536):  # bounded temporaries
            self.index.add(x[s:s + 65_536])
        del x
        # On a GPU the shard searches a GPU copy (FAISS's GPU IVF probes for itself; its
        # sums are not the CPU's, so the bit-for-bit match with one index is a CPU property).
        self.on_gpu = bool(spec.plan.gpu) and faiss.get_num_gpus() > 0
        self.searcher = to_gpu(self.index, spec.plan) if self.on_gpu else self.index
        self.build_s = time.perf_counter() - t0

    def info(self) -> dict:
        """Where it runs, its size and what it cost: pid, node, rows, build_s, peak RSS
        (bytes) and that peak less the process's before the shard loaded."""
        import ray

        peak = peak_rss()
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "lo": self.spec.lo,
                "hi": self.spec.hi, "build_s": round(self.build_s, 3), "peak_rss": peak,
                "held": peak - self.base_rss}

    def queries(self, start: int, end: int) -> np.ndarray:
        """Group rows [start, end) of this shard's own, read back from its index."""
        return self.index.reconstruct_n(start - self.spec.lo, end - start)

    def probes(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The IVF lists each query probes (the shared centroids: the same in every shard)."""
        return self.quantizer.search(q, self.spec.plan.nprobe)

    def search(self, q: np.ndarray, k: int, which: np.ndarray | None = None,
               probes: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The top-`k` of queries `q` (rows `which` of them) in this shard, as (cosines,
        group rows); -1 rows where the shard has fewer."""
        if which is not None:
            q = q[which]
            probes = None if probes is None else (probes[0][which], probes[1][which])
        k = max(1, int(k))
        if probes is not None and not self.on_gpu:
            dq, iq = probes
            sims, local = self.index.search_preassigned(np.ascontiguousarray(q), k, iq, dq)
        else:
            sims, local = self.searcher.search(np.ascontiguousarray(q), k)
        return sims, np.where(local >= 0, local + self.spec.lo, -1)


def query_chunk(shards: list, owner: int, start: int, end: int, ids: np.ndarray, k: int, tau: float, kk: int,
                ivf: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """One chunk of group rows [start, end) of shard `owner`, searched in every shard and
    merged (a Ray task; `ids`, the group's global ids, arrives from the object store):
    its pairs (a, b, cos) and the seconds it took."""
    import ray

    t0 = time.perf_counter()
    q = ray.get(shards[owner].queries.remote(start, end))
    probes = ray.get(shards[owner].probes.remote(q)) if ivf else None
    q_ref = ray.put(q)
    p_ref = ray.put(probes) if ivf else None

    def asker(shard):
        def ask(_q, kq, which):
            return ray.get(shard.search.remote(q_ref, kq, which, p_ref))
        return ask

    # All shards are asked at once; exact_topk's follow-ups (rare: ties at a shard's cut) go one by one.
    first = ray.get([s.search.remote(q_ref, kk, None, p_ref) for s in shards])
    askers = [_first_then(f, asker(s)) for f, s in zip(first, shards)]
    sims, rows = exact_topk(askers, q, kk)
    a, b, c = pairs_from_topk(sims, rows, np.arange(start, end, dtype=np.int64), ids, k, tau)
    return a, b, c, time.perf_counter() - t0


def _first_then(first, ask):
    """A search callable whose first call answers `first` (already fetched in parallel)."""
    state = {"used": False}

    def call(q, k, which):
        if not state["used"] and which is None:
            state["used"] = True
            return first
        return ask(q, k, which)
    return call


# ------------------------------------------------------------------------- the driver side

def sharded_pairs(n: int, d: int, source_for: Callable[[list[int]], RowSource], ids: np.ndarray,
                  plan: IndexPlan, k: int, tau: float, *, workers: int = 1, budget_gib: float = INDEX_SHARD_GIB,
                  resources: Resources = Resources(), seed: int = 0, chunk: int = QUERY_CHUNK,
                  progress: Callable[[str], None] = lambda m: None) -> tuple[tuple, dict]:
    """Candidate pairs of one group of `n` vectors (dimension `d`; global ids `ids`) with
    its index in shards: ((a, b, cos) before deduplication, stats). `source_for(bounds)`
    gives the `RowSource` the shards read from; each shard actor asks for `resources`."""
    import ray

    from rexeval.pipelines.core.runtime import init_ray

    init_ray()
    bounds = shard_bounds(n, shards_for(n, d, plan.kind, budget_gib, workers), align_rows(chunk))
    resources = fit_shards(len(bounds) - 1, resources, progress)
    source = source_for(bounds)
    ids_ref = ray.put(np.asarray(ids, np.int64))
    threads = max(1, int(resources.cpus))
    centroids = None
    if plan.kind == "ivf":
        train = ray.remote(_train_centroids).options(**_task_options(resources))
        centroids = train.remote(source, n, plan.nlist, seed, threads)
        ray.wait([centroids])  # before the shards: they would hold the CPUs the training needs
    actor = ray.remote(IndexShard).options(**_task_options(resources))
    shards = [actor.remote(ShardSpec(lo, hi, plan, centroids, threads), source)
              for lo, hi in zip(bounds, bounds[1:])]
    infos = _placed(shards, progress)
    progress(f"{len(shards)} index shard(s) of {plan.kind}, {bounds[1] - bounds[0]:,} rows each "
             f"(budget {budget_gib:g} GiB a shard)")
    kk = min(k + 1, n)
    jobs = [(i, s, min(s + chunk, hi)) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))
            for s in range(lo, hi, chunk)]
    # The merge is light next to the shards' search, and a task that asked for a CPU could
    # wait behind shard actors holding them all.
    task = ray.remote(query_chunk).options(num_cpus=0)
    window = max(2, CHUNKS_IN_FLIGHT_PER_SHARD * len(shards))
    pending, parts, search_s, done = [], [], 0.0, 0
    t0 = time.perf_counter()
    try:
        for job in jobs + [None] * window:
            if job is not None:
                pending.append(task.remote(shards, job[0], job[1], job[2], ids_ref, k, tau, kk, plan.kind == "ivf"))
            if len(pending) >= window or (job is None and pending):
                ready, pending = ray.wait(pending, num_returns=1)
                a, b, c, secs = ray.get(ready[0])
                parts.append((a, b, c))
                search_s += secs
                done += 1
                progress(f"  query chunk {done}/{len(jobs)}: {len(a):,} pair(s) in {secs:.1f}s")
    finally:
        for s in shards:
            ray.kill(s)
    pairs = tuple(np.concatenate(v) for v in zip(*parts)) if parts else empty_pairs()
    stats = {"shards": len(shards), "bounds": bounds, "budget_gib": budget_gib,
             "shard_build_s": [i["build_s"] for i in infos], "shard_held_bytes": [i["held"] for i in infos],
             "search_s": round(time.perf_counter() - t0, 3), "chunk_s": round(search_s, 3)}
    return pairs, stats


def fit_shards(shards: int, resources: Resources, progress: Callable[[str], None]) -> Resources:
    """Every shard must be up at once (each query visits all). On the job's one machine,
    shards that would not all fit at `resources` share its CPUs instead (fractions of a
    CPU, one FAISS thread each); a GPU shard per GPU is the user's to size. On a cluster
    the settings stand: an autoscaler adds nodes for the shards."""
    from rexeval.pipelines.core.stage import fits_machine, machine_cpus

    fits = fits_machine(resources)
    if fits is None or fits >= shards or resources.gpus:
        return resources
    share = math.floor(machine_cpus() / shards * 1000) / 1000  # rounded down: all of them fit
    progress(f"{shards} shards of {resources.cpus:g} CPU(s) do not fit this machine at once: "
             f"{share:g} CPU each")
    return dataclasses.replace(resources, cpus=share)


def _placed(shards: list, progress: Callable[[str], None], every_s: float = 30.0) -> list[dict]:
    """Each shard's `info()` once all are built; while some wait for a node (an autoscaler
    bringing one, or a cluster too small to hold them all at once), says how many are up."""
    import ray

    from rexeval.failures import WorkerFailed, reason_of

    pending = {s.info.remote(): i for i, s in enumerate(shards)}
    infos: list = [None] * len(shards)
    t0 = time.monotonic()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=every_s)
        for ref in ready:
            try:
                infos[pending.pop(ref)] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:  # its rows could not be read or were bad
                for s in shards:
                    ray.kill(s)
                raise WorkerFailed(f"an index shard could not be built: {reason_of(exc)}") from exc
        if pending:
            progress(f"{len(shards) - len(pending)} of {len(shards)} index shards up after "
                     f"{time.monotonic() - t0:.0f}s; every shard must be placed at once (the cluster "
                     "needs room for all of them, or an autoscaler to add it)")
    return infos


def _task_options(resources: Resources) -> dict:
    """Ray options of a shard actor or the centroids' task: the job's per-worker share."""
    opts: dict = {"num_cpus": resources.cpus, "num_gpus": resources.gpus or 0}
    if resources.memory:
        opts["memory"] = resources.memory
    if resources.ray_resources:
        opts["resources"] = resources.ray_resources
    return opts


def _train_centroids(source: RowSource, n: int, nlist: int, seed: int, threads: int) -> np.ndarray:
    """The IVF centroids of a whole group, trained once (a Ray task) on the seeded sample
    one index would train on (`index.build_index`), read from the shards' source."""
    load_faiss().omp_set_num_threads(cpu_threads(threads))
    nlist = max(1, min(nlist, n))
    rows = training_rows(n, nlist, seed)
    return train_centroids(source.rows(rows), nlist, np.arange(len(rows)), seed)
