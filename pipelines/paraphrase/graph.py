"""Paraphrase clustering on the graph of validated pairs (seed 002, appendix B.3).

Statements are nodes (one L2-normalised embedding row each), validated paraphrase
pairs are edges. The paper's procedure, as implemented here:

1. Connected components of the undirected graph are the initial clusters.
2. A component is *cohesive* when the minimum cosine over **all** pairs of its members
   (from the embeddings, not only the edges) reaches ``tau_intra`` (0.85). We read the
   paper's "dépasse" as ``>=``. Singletons are cohesive. Cohesive components are kept.
3. Other components are refined with Algorithm 1 (:func:`refine_component`): repeatedly
   take the remaining node with the most remaining neighbours as pivot, cut the pivot
   with its remaining neighbours; consecutive cuts are merged while the new pivot has
   cosine ``>= tau_remerge`` (0.90) with every pivot of the cluster being built.
   Degree ties are broken by the lowest node index (node order is the caller's, which
   is deterministic), so the result does not depend on hash or heap order.
4. The representative of a cluster is the member with the highest mean cosine to the
   other members (a singleton represents itself); ties go to the lowest node index,
   where scores within ``TIE_TOL`` (float32 epsilon) count as ties.

Everything is vectorised numpy/scipy: the code must handle 10^6 nodes x 384 dims with
millions of edges on a small machine. Components come from scipy; cohesion from batched
Gram matrices of same-size components (which also give the representatives of every
component kept whole); Algorithm 1 runs in Python only on non-cohesive components that
no single member covers (if one does, the first pivot takes everything), O(E log V).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph

#: components up to this size get their pairwise cosines by batched matmul of
#: (count, m, d) stacks; larger ones are processed one by one in row blocks.
SMALL_MAX = 1024
#: temporary memory (bytes) one matmul / gather chunk may use. 64 MiB rather than more:
#: temporaries under glibc's 32 MiB mmap threshold are reused instead of page-faulted
#: in again for every block (measured ~30% faster at 10^6 x 384).
BLOCK_BYTES = 64 << 20
#: mean cosines closer than this count as a tie for the representative (lowest index
#: wins). Scores are float64 from float32 rows (error ~1e-13), so exactly tied members
#: (every pair, duplicate vectors, symmetric members) fall within it.
TIE_TOL = 1e-9
#: representatives taken from the float32 cohesion Gram matrices are recomputed in float64
#: for clusters whose two best mean cosines are closer than this (float32 rounding there
#: is ~1e-7), so the result is always that of the float64 computation.
RECHECK_GAP = 1e-4


@dataclass(frozen=True)
class GraphClusters:
    """Result of :func:`cluster_graph`; every array is indexed by node (or cluster)."""

    labels: np.ndarray            # int64 [n]: final cluster, numbered by smallest member index
    representatives: np.ndarray   # int64 [n_clusters]: representative node of each cluster
    component_labels: np.ndarray  # int64 [n]: connected component before refinement
    min_intra_cos: np.ndarray     # float32 [n_components]: cohesion (1.0 for singletons)
    refined_components: int       # components that went through Algorithm 1

    @property
    def n_clusters(self) -> int:
        return int(self.representatives.shape[0])

    @property
    def n_components(self) -> int:
        return int(self.min_intra_cos.shape[0])


# ----------------------------------------------------------------------------- graph
def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique by sort + neighbour compare (np.unique is several times slower here)."""
    x = np.sort(x)
    return x[np.r_[True, x[1:] != x[:-1]]] if x.size else x


def _csr_from_sorted(n: int, rows: np.ndarray, cols: np.ndarray) -> sparse.csr_matrix:
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    idx = cols.astype(np.int32 if n < 2**31 else np.int64)
    return sparse.csr_matrix((np.ones(cols.size, dtype=np.int8), idx, indptr), shape=(n, n))


def adjacency(n: int, i: np.ndarray, j: np.ndarray) -> sparse.csr_matrix:
    """Symmetric CSR adjacency without duplicates or self loops (sorted column indices)."""
    i = np.asarray(i, dtype=np.int64).ravel()
    j = np.asarray(j, dtype=np.int64).ravel()
    if i.shape != j.shape:
        raise ValueError(f"edge endpoint arrays differ in length: {i.size} != {j.size}")
    if i.size and (min(i.min(), j.min()) < 0 or max(i.max(), j.max()) >= n):
        raise ValueError(f"edge endpoint out of range for {n} nodes")
    keep = i != j
    a, b = i[keep], j[keep]
    key = _sorted_unique(np.concatenate([a * n + b, b * n + a]))   # row-major, both directions
    return _csr_from_sorted(n, key // n, key % n)


def _renumber(raw: np.ndarray) -> np.ndarray:
    """Relabel so clusters are numbered 0.. in order of their smallest member index."""
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    k = int(raw.max()) + 1
    first = np.full(k, raw.size, dtype=np.int64)
    np.minimum.at(first, raw, np.arange(raw.size))
    present = np.flatnonzero(first < raw.size)
    rank = np.full(k, -1, dtype=np.int64)
    rank[present[np.argsort(first[present], kind="stable")]] = np.arange(present.size)
    return rank[raw]


def _components(adj: sparse.csr_matrix) -> np.ndarray:
    if adj.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    _, raw = csgraph.connected_components(adj, directed=False)
    return _renumber(raw)


def connected_components(n: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Component label per node (scipy), renumbered by the smallest member index."""
    return _components(adjacency(n, i, j))


# ----------------------------------------------------------------------------- groups
def _groups(labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, sizes, starts): nodes sorted by label (index order within a label)."""
    order = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels, minlength=k)
    starts = np.zeros(k, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return order, sizes, starts


def _label_ranges(sizes: np.ndarray, max_rows: int) -> Iterator[tuple[int, int]]:
    """Consecutive label ranges holding at most ``max_rows`` nodes (or one big label)."""
    ends = np.cumsum(sizes)
    k, lo = sizes.size, 0
    while lo < k:
        base = ends[lo] - sizes[lo]
        hi = int(np.searchsorted(ends, base + max_rows, side="right"))
        hi = max(hi, lo + 1)
        yield lo, hi
        lo = hi


def _rows_per_block(d: int) -> int:
    """Rows of float64 work (about three [rows, d] temporaries) that fit in BLOCK_BYTES."""
    return max(1, BLOCK_BYTES // (max(d, 1) * 8 * 3))


def _segment_sums(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Sums of consecutive row segments of ``x`` (lengths ``counts`` > 0) via a sparse
    one-hot product: ~10x faster than ``np.add.reduceat`` along axis 0."""
    indptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    onehot = sparse.csr_matrix((np.ones(x.shape[0], dtype=x.dtype), np.arange(x.shape[0]), indptr),
                               shape=(counts.size, x.shape[0]))
    return np.asarray(onehot @ x)


def _sum_rows(emb: np.ndarray, nodes: np.ndarray, rows: int) -> np.ndarray:
    """float64 sum of ``emb[nodes]``, gathered ``rows`` at a time."""
    total = np.zeros(emb.shape[1], dtype=np.float64)
    for s in range(0, nodes.size, rows):
        total += emb[nodes[s:s + rows]].sum(axis=0, dtype=np.float64)
    return total


# ----------------------------------------------------------------------------- cohesion
def _min_small(emb: np.ndarray, nodes: np.ndarray, block: int,
               sum_cos: np.ndarray | None = None) -> np.ndarray:
    """Min off-diagonal cosine of each row-group of ``nodes`` [c, m] (batched matmul).

    With ``sum_cos`` (float64 [c, m]) the same Gram matrices also give each member's sum
    of cosines to the others (symmetrised in float64, so the two members of a pair tie
    exactly): the representatives of clusters that stay whole come for free.
    """
    c, m = nodes.shape
    d = emb.shape[1]
    per = max(1, block // (4 * m * (d + m) * 2 + (16 * m * m if sum_cos is not None else 0)))
    diag = np.arange(m)
    out = np.empty(c, dtype=np.float32)
    for s in range(0, c, per):
        x = emb[nodes[s:s + per]]                       # [b, m, d]
        g = np.matmul(x, x.transpose(0, 2, 1))          # [b, m, m]
        if sum_cos is not None:
            g64 = g.astype(np.float64)
            g64 = g64 + g64.transpose(0, 2, 1)
            g64[:, diag, diag] = 0.0
            sum_cos[s:s + per] = g64.sum(axis=2) / 2
        g[:, diag, diag] = np.inf
        out[s:s + per] = g.reshape(g.shape[0], -1).min(axis=1)
    return out


def _min_large(emb: np.ndarray, members: np.ndarray, block: int) -> float:
    """Min off-diagonal cosine of one big component, upper triangle in row blocks."""
    x = emb[members]
    m = x.shape[0]
    rows = max(1, block // (4 * m * 2))
    best = np.inf
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        g = x[r0:r1] @ x[r0:].T                          # rows r0:r1 against columns r0:
        t = np.arange(r1 - r0)
        g[t, t] = np.inf
        best = min(best, float(g.min()))
    return best


def _cohesion(emb: np.ndarray, labels: np.ndarray, block: int,
              want_sums: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Min pairwise cosine per label and, optionally, per node the float64 sum of its
    cosines to the other members of its label (NaN for singletons and big labels)."""
    labels = np.asarray(labels, dtype=np.int64)
    k = int(labels.max()) + 1 if labels.size else 0
    out = np.ones(k, dtype=np.float32)
    sums = np.full(labels.size, np.nan) if want_sums else None
    if k == 0:
        return out, sums
    order, sizes, starts = _groups(labels, k)
    by_size = np.argsort(sizes, kind="stable")
    bounds = np.flatnonzero(np.diff(sizes[by_size])) + 1
    for grp in np.split(by_size, bounds):
        m = int(sizes[grp[0]])
        if m < 2:
            continue
        if m <= SMALL_MAX:
            nodes = order[starts[grp][:, None] + np.arange(m)]
            part = np.empty(nodes.shape) if want_sums else None
            out[grp] = _min_small(emb, nodes, block, part)
            if want_sums:
                sums[nodes] = part
        else:
            for c in grp:
                out[c] = _min_large(emb, order[starts[c]:starts[c] + m], block)
    return out, sums


def min_intra_cosine(emb: np.ndarray, labels: np.ndarray, block: int = BLOCK_BYTES) -> np.ndarray:
    """Minimum pairwise cosine inside each label 0..max(labels) (1.0 for singletons).

    Labels are grouped by exact size: sizes up to ``SMALL_MAX`` are stacked and
    multiplied in batches of at most ``block`` bytes; bigger ones go block by block.
    """
    return _cohesion(emb, labels, block)[0]


# ----------------------------------------------------------------------------- Algorithm 1
def _gather_neighbours(nodes: np.ndarray, indptr: np.ndarray,
                       indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row position in ``nodes``, neighbour id) for every CSR entry of ``nodes``."""
    lo, hi = indptr[nodes].astype(np.int64), indptr[nodes + 1].astype(np.int64)
    lens = hi - lo
    row = np.repeat(np.arange(nodes.size), lens)
    pos = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(lo, lens)
    return row, np.asarray(indices)[pos].astype(np.int64)


def _local_graph(members: np.ndarray, indptr: np.ndarray,
                 indices: np.ndarray) -> tuple[list[int], list[int]]:
    """CSR of the subgraph induced by sorted ``members``, in local ids (python lists).

    Neighbours outside ``members``, self loops and duplicate entries are dropped."""
    m = members.size
    row, nbr = _gather_neighbours(members, indptr, indices)
    local = np.searchsorted(members, nbr)
    ok = local < m
    ok[ok] = members[local[ok]] == nbr[ok]
    ok &= local != row
    key = _sorted_unique(row[ok] * m + local[ok])       # drops duplicates, sorts by row
    rows, cols = key // m, key % m
    lptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=lptr[1:])
    return lptr.tolist(), cols.tolist()


def _algorithm1(ptr: list[int], nbrs: list[int], base: int, m: int, vec: np.ndarray,
                tau_remerge: float) -> list[list[int]]:
    """Algorithm 1 on local nodes 0..m-1 (ordered by node index); returns local clusters.

    Neighbours of local node v are ``nbrs[ptr[base + v]:ptr[base + v + 1]]`` (local ids),
    ``vec[v]`` its embedding. The pivot is the top of a lazy max-heap keyed (-degree in
    R, id): stale entries are skipped, so ties go to the lowest id and each degree
    decrement costs one push, O(E log V) overall.
    """
    deg = [ptr[base + v + 1] - ptr[base + v] for v in range(m)]
    remaining = [True] * m
    heap = [(-deg[v], v) for v in range(m)]
    heapq.heapify(heap)
    pivots = np.empty((min(m, 64), vec.shape[1]), dtype=vec.dtype)
    clusters: list[list[int]] = []
    current: list[int] = []
    n_piv = 0
    while heap:
        negd, p = heapq.heappop(heap)
        if not remaining[p] or -negd != deg[p]:
            continue                                    # stale heap entry
        cut = [p] + [u for u in nbrs[ptr[base + p]:ptr[base + p + 1]] if remaining[u]]
        for u in cut:
            remaining[u] = False
        for u in cut:
            for w in nbrs[ptr[base + u]:ptr[base + u + 1]]:
                if remaining[w]:
                    deg[w] -= 1
                    heapq.heappush(heap, (-deg[w], w))
        if n_piv and float((pivots[:n_piv] @ vec[p]).min()) >= tau_remerge:
            current.extend(cut)
        else:
            if n_piv:
                clusters.append(current)
            current, n_piv = cut, 0
        if n_piv == pivots.shape[0]:
            pivots = np.concatenate([pivots, np.empty_like(pivots)])
        pivots[n_piv] = vec[p]
        n_piv += 1
    if current:
        clusters.append(current)
    return clusters


def refine_component(members: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                     emb: np.ndarray, tau_remerge: float) -> list[np.ndarray]:
    """Algorithm 1 on one component; returns its clusters (sorted global indices).

    ``indptr``/``indices`` are a CSR adjacency over global node ids; only edges between
    ``members`` count. Members are sorted first, so degree ties go to the lowest index.
    """
    members = _sorted_unique(np.asarray(members, dtype=np.int64).ravel())
    if members.size == 0:
        return []
    ptr, nbrs = _local_graph(members, indptr, indices)
    pieces = _algorithm1(ptr, nbrs, 0, members.size, emb[members], tau_remerge)
    return [members[np.sort(np.asarray(c, dtype=np.int64))] for c in pieces]


def _refine_all(comp: np.ndarray, bad: np.ndarray, adj: sparse.csr_matrix, emb: np.ndarray,
                tau_remerge: float) -> np.ndarray:
    """Algorithm 1 on every component in ``bad``; returns raw labels (first piece keeps
    the component label, later pieces get new ones above ``comp.max()``). ``adj`` must be
    the graph ``comp`` was computed from.

    Same result as :func:`refine_component` per component, but the local graphs of all
    of them are extracted in one vectorised pass: ``adj`` is canonical (no duplicates or
    self loops) and components are closed under adjacency, so no membership check is
    needed; this removes the per-component numpy overhead (10^5 small components).
    """
    raw = comp.copy()
    if bad.size == 0:
        return raw
    k = int(comp.max()) + 1
    # Shortcut: when some member is adjacent to all others, Algorithm 1's first pivot (the
    # highest degree) takes the whole component, so it stays one cluster (e.g. cliques,
    # stars, every component of <= 3 nodes); only the others need the Python loop.
    maxdeg = np.zeros(k, dtype=np.int64)
    np.maximum.at(maxdeg, comp, np.diff(adj.indptr))
    sizes = np.bincount(comp, minlength=k)
    bad = bad[maxdeg[bad] < sizes[bad] - 1]
    if bad.size == 0:
        return raw
    is_bad = np.zeros(k, dtype=bool)
    is_bad[bad] = True
    cand = np.flatnonzero(is_bad[comp])
    nodes = cand[np.argsort(comp[cand], kind="stable")]  # by component, then node index
    ccomp = comp[nodes]
    first = np.flatnonzero(np.r_[True, ccomp[1:] != ccomp[:-1]])
    counts = np.diff(np.r_[first, nodes.size])
    local = np.arange(nodes.size) - np.repeat(first, counts)
    local_of = np.full(comp.size, -1, dtype=np.int64)
    local_of[nodes] = local
    row, nbr = _gather_neighbours(nodes, adj.indptr, adj.indices)
    ptr = np.zeros(nodes.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=nodes.size), out=ptr[1:])
    ptr_l, nbrs_l = ptr.tolist(), local_of[nbr].tolist()
    next_label = k
    for base, m in zip(first.tolist(), counts.tolist()):
        members = nodes[base:base + m]
        pieces = _algorithm1(ptr_l, nbrs_l, base, m, emb[members], tau_remerge)
        for piece in pieces[1:]:
            raw[members[piece]] = next_label
            next_label += 1
    return raw


# ----------------------------------------------------------------------------- representatives
def _dot_to_others(emb: np.ndarray, nodes: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """e_i.S - e_i.e_i for ``nodes`` grouped in consecutive runs of ``sizes`` (all > 0).

    float64, in blocks of whole groups (a group larger than a block goes on its own)."""
    score = np.empty(nodes.size, dtype=np.float64)
    starts = np.zeros(sizes.size, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    rows = _rows_per_block(emb.shape[1])
    for lo, hi in _label_ranges(sizes, rows):
        s0, s1 = int(starts[lo]), int(starts[hi - 1] + sizes[hi - 1])
        if s1 - s0 <= rows:
            x = emb[nodes[s0:s1]].astype(np.float64)
            cnt = sizes[lo:hi]
            own = _segment_sums(x, cnt)[np.repeat(np.arange(cnt.size), cnt)]
            score[s0:s1] = np.einsum("ij,ij->i", x, own) - np.einsum("ij,ij->i", x, x)
        else:                                           # one group larger than a block
            total = _sum_rows(emb, nodes[s0:s1], rows)
            for s in range(s0, s1, rows):
                x = emb[nodes[s:min(s + rows, s1)]].astype(np.float64)
                score[s:s + x.shape[0]] = x @ total - np.einsum("ij,ij->i", x, x)
    return score


def _representatives(emb: np.ndarray, labels: np.ndarray,
                     sum_cos: np.ndarray | None = None) -> np.ndarray:
    """:func:`representatives`, reusing per-node sums of cosines to the other members
    where ``sum_cos`` has them (NaN: compute) for every member of a label."""
    labels = np.asarray(labels, dtype=np.int64)
    k = int(labels.max()) + 1 if labels.size else 0
    reps = np.full(k, -1, dtype=np.int64)
    if k == 0:
        return reps
    order, sizes, starts = _groups(labels, k)
    single = sizes == 1
    reps[single] = order[starts[single]]
    multi = np.flatnonzero(sizes >= 2)
    if multi.size == 0:
        return reps
    nodes = order[sizes[labels[order]] >= 2]            # grouped by label, index order inside
    msizes = sizes[multi]
    mstarts = np.zeros(multi.size, dtype=np.int64)
    np.cumsum(msizes[:-1], out=mstarts[1:])
    lab = np.repeat(np.arange(multi.size), msizes)      # position in `multi` of each node
    score = np.full(nodes.size, np.nan) if sum_cos is None else sum_cos[nodes] / (msizes[lab] - 1)
    missing = np.logical_or.reduceat(np.isnan(score), mstarts)
    if sum_cos is not None:     # float32 Gram sums: redo near-ties in float64
        best = np.maximum.reduceat(np.nan_to_num(score, nan=-np.inf), mstarts)
        near = np.add.reduceat((score >= best[lab] - RECHECK_GAP).astype(np.int64), mstarts)
        missing |= near >= 2
    if missing.any():
        rows = missing[lab]
        score[rows] = _dot_to_others(emb, nodes[rows], msizes[missing]) / (msizes[lab[rows]] - 1)
    best = np.maximum.reduceat(score, mstarts)
    cand = score >= best[lab] - TIE_TOL
    # nodes are in index order within a label, so the first candidate is the lowest index
    lc, nc = lab[cand], nodes[cand]
    first = np.r_[True, lc[1:] != lc[:-1]]
    reps[multi[lc[first]]] = nc[first]
    return reps


def representatives(emb: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per label, the member with the highest mean cosine to the other members.

    For unit rows, mean cos to others = (e_i.S - e_i.e_i) / (m - 1) with S the cluster
    sum (the exact e_i.e_i, not 1), computed in float64 over label-aligned blocks;
    singletons skip it. Scores within ``TIE_TOL`` of the cluster best are ties and go to
    the lowest node index. Labels absent from ``labels`` get -1.
    """
    return _representatives(emb, labels)


# ----------------------------------------------------------------------------- pipeline
def cluster_graph(emb: np.ndarray, i: np.ndarray, j: np.ndarray, tau_intra: float = 0.85,
                  tau_remerge: float = 0.90) -> GraphClusters:
    """Components, cohesion check, Algorithm 1 on non-cohesive ones, representatives."""
    emb = np.asarray(emb)
    if emb.ndim != 2:
        raise ValueError(f"embeddings must be 2-D, got shape {emb.shape}")
    n = emb.shape[0]
    adj = adjacency(n, i, j)
    comp = _components(adj)
    cohesion, sum_cos = _cohesion(emb, comp, BLOCK_BYTES, want_sums=True)
    bad = np.flatnonzero(cohesion < tau_intra)
    labels = _renumber(_refine_all(comp, bad, adj, emb, tau_remerge))
    if n:   # sums of cosines within a component are void where Algorithm 1 split it
        lo = np.full(cohesion.size, n, dtype=np.int64)
        hi = np.full(cohesion.size, -1, dtype=np.int64)
        np.minimum.at(lo, comp, labels)
        np.maximum.at(hi, comp, labels)
        sum_cos[(lo != hi)[comp]] = np.nan
    return GraphClusters(labels=labels, representatives=_representatives(emb, labels, sum_cos),
                         component_labels=comp, min_intra_cos=cohesion,
                         refined_components=int(bad.size))
