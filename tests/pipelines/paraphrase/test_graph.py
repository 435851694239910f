"""Paraphrase graph clustering (seed 002, appendix B.3): hand-traced graphs and a literal reference.

Most embeddings are 2-D unit vectors at chosen angles, so cos(a, b) = cos(angle difference):
cos 10 = 0.985, cos 20 = 0.940, cos 25 = 0.906, cos 30 = 0.866, cos 40 = 0.766,
cos 50 = 0.643, cos 58 = 0.530, cos 60 = 0.5. Thresholds: tau_intra 0.85 (angle span
31.8 deg), tau_remerge 0.90 (25.8 deg).
"""
from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest

from rexeval.pipelines.paraphrase import graph as cg
from rexeval.pipelines.paraphrase.graph import (
    GraphClusters,
    cluster_graph,
    connected_components,
    min_intra_cosine,
    refine_component,
    representatives,
)


def ang(*degrees: float) -> np.ndarray:
    r = np.radians(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(r), np.sin(r)], axis=1).astype(np.float32)


def edges(pairs):
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    return a, b


def partition(labels) -> set[frozenset[int]]:
    out: dict[int, set[int]] = {}
    for node, lab in enumerate(np.asarray(labels).tolist()):
        out.setdefault(lab, set()).add(node)
    return {frozenset(s) for s in out.values()}


def run(emb, pairs, **kw) -> GraphClusters:
    return cluster_graph(emb, *edges(pairs), **kw)


# ----------------------------------------------------------------------------- hand-drawn graphs
def test_cohesive_component_kept_whole_even_if_only_a_path():
    # Path 0-1-2 at 0, 10, 20 deg: min cos over ALL pairs = cos 20 = 0.94 >= 0.85 -> kept.
    # Pair 3-4 at 90, 100 deg: cos 10 -> kept. Node 5 isolated.
    emb = np.concatenate([ang(0, 10, 20, 90, 100), ang(200)])
    res = run(emb, [(0, 1), (1, 2), (3, 4)])
    assert res.labels.tolist() == [0, 0, 0, 1, 1, 2]
    assert res.component_labels.tolist() == [0, 0, 0, 1, 1, 2]
    assert res.refined_components == 0
    np.testing.assert_allclose(res.min_intra_cos, [math.cos(math.radians(20)),
                                                   math.cos(math.radians(10)), 1.0], atol=1e-6)
    # representatives: 1 is in the middle (mean cos 0.985 vs 0.962); pair -> lowest index 3
    assert res.representatives.tolist() == [1, 3, 5]
    assert res.n_clusters == 3 and res.n_components == 3


def test_dumbbell_split_at_the_bridge():
    # Left: 0 hub -> 1, 2, 3 and 1-2; right: 4 hub -> 5, 6, 7; bridge 3-5.
    # Angles: left 0..6 deg, right 60..66 deg -> min cos ~ cos 66 < 0.85 -> refine.
    # Degrees: 0:3, 1:2, 2:2, 3:2, 4:3, 5:2, 6:1, 7:1.
    # step 1: max degree 3 at {0, 4}, tie -> 0; B = {0,1,2,3}; A = B, P = {0}
    # step 2: R = {4,5,6,7}, degrees in R: 4:3, 5:1 (lost 3), 6:1, 7:1 -> pivot 4;
    #         B = {4,5,6,7}; cos(4, 0) = cos 60 = 0.5 < 0.9 -> C = [A]; A = B
    # result {0,1,2,3}, {4,5,6,7}: the bridge 3-5 is cut.
    emb = ang(0, 2, 4, 6, 60, 62, 64, 66)
    res = run(emb, [(0, 1), (0, 2), (0, 3), (1, 2), (4, 5), (4, 6), (4, 7), (3, 5)])
    assert res.component_labels.tolist() == [0] * 8
    assert res.refined_components == 1
    assert res.labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_chain_split_with_lowest_index_tie_break():
    # Path 0-1-2-3-4 at 0, 15, 30, 45, 60 deg: min cos = cos 60 -> refine.
    # step 1: degree 2 at {1,2,3}, tie -> 1; B = {0,1,2}; P = {1}
    # step 2: R = {3,4}, both degree 1 -> 3; cos(3,1) = cos 30 = 0.866 < 0.9 -> new cluster
    emb = ang(0, 15, 30, 45, 60)
    res = run(emb, [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert partition(res.labels) == {frozenset({0, 1, 2}), frozenset({3, 4})}
    assert res.labels.tolist() == [0, 0, 0, 1, 1]


def test_pivot_degree_tie_goes_to_lowest_index():
    # Path 0-1-2-3 at 0, 10, 20, 60 deg (min cos 0.5 -> refine); degrees 1,2,2,1.
    # Tie 1 vs 2 -> pivot 1: B = {0,1,2}; then 3 alone, cos(3,1) = cos 50 < 0.9.
    # (Highest-index tie-break would give {1,2,3}, {0}.)
    res = run(ang(0, 10, 20, 60), [(0, 1), (1, 2), (2, 3)])
    assert res.labels.tolist() == [0, 0, 0, 1]
    # Angles reversed (60, 20, 10, 0): the tie 1 vs 2 picks 1 (20 deg): B = {0,1,2}; then {3}
    # (0 deg): cos(3,1) = cos 20 = 0.94 >= 0.9 -> remerge, one cluster. Picking 2 instead
    # would give {1,2,3} and {0} (cos(0,2) = cos 50 < 0.9).
    res = run(ang(60, 20, 10, 0), [(0, 1), (1, 2), (2, 3)])
    assert res.labels.tolist() == [0, 0, 0, 0]


def test_consecutive_pivots_remerge():
    # Path 0-1-2-3-4 at 0, 8, 16, 24, 40 deg: min cos = cos 40 = 0.766 -> refine.
    # step 1: pivot 1 (degree-2 tie 1,2,3), B = {0,1,2}; step 2: pivot 3 (tie 3,4), B = {3,4};
    # cos(3,1) = cos 16 = 0.961 >= 0.9 -> remerge: one cluster despite low cohesion.
    res = run(ang(0, 8, 16, 24, 40), [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert res.refined_components == 1
    assert res.labels.tolist() == [0] * 5
    assert res.min_intra_cos[0] < 0.85


def test_remerge_needs_every_pivot_of_the_cluster():
    # Path 0-...-7 at -5, 0, 5, 15, 20, 25, 40, 45 deg; min cos = cos 50 -> refine.
    # step 1: pivot 1 (tie of degree 2 -> lowest), B = {0,1,2}; P = {1}
    # step 2: R = {3..7}: degrees 3:1, 4:2, 5:2, 6:2, 7:1 -> pivot 4, B = {3,4,5};
    #         cos(4,1) = cos 20 = 0.94 -> remerge, P = {1,4}
    # step 3: R = {6,7}, pivot 6, B = {6,7}; cos(6,4) = cos 20 = 0.94 but cos(6,1) = cos 40
    #         = 0.77 -> min over P < 0.9 -> new cluster. (Checking only the last pivot: 1 cluster.)
    emb = ang(-5, 0, 5, 15, 20, 25, 40, 45)
    res = run(emb, [(k, k + 1) for k in range(7)])
    assert res.labels.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]


def test_degrees_are_updated_inside_the_remaining_set():
    # Hub 0 -> 1..5; 6 -> 1, 2, 7; 8 -> 7, 9, 10. Original degrees 0:5, 6:3, 8:3.
    # step 1: pivot 0, B = {0..5}. Degrees in R now: 6:1 (only 7), 7:2, 8:3 -> pivot 8,
    #         B = {7,8,9,10}, cos(8,0) = cos 62 < 0.9 -> new cluster.
    # step 2: R = {6} -> B = {6}; cos(6, 8) = cos 58 < 0.9 -> new cluster.
    # With stale (original) degrees 6 would tie 8 and win: {6,7}, {8,9,10}.
    emb = ang(0, 2, 4, 6, 8, 10, 120, 60, 62, 64, 66)
    pairs = [(0, k) for k in range(1, 6)] + [(6, 1), (6, 2), (6, 7), (8, 7), (8, 9), (8, 10)]
    res = run(emb, pairs)
    assert partition(res.labels) == {frozenset(range(6)), frozenset({7, 8, 9, 10}),
                                     frozenset({6})}
    assert res.labels.tolist() == [0] * 6 + [1, 2, 2, 2, 2]


def test_component_with_a_universal_node_stays_whole():
    # Star 0 -> 1..4 at 0, 20, -20, 40, -40 deg: cohesion cos 80 < 0.85 -> refined, but the
    # first pivot (0, degree 4 = all others) takes everything: one cluster (cluster_graph
    # shortcuts this case; refine_component runs the loop and must agree).
    emb = ang(0, 20, -20, 40, -40)
    pairs = [(0, k) for k in range(1, 5)]
    res = run(emb, pairs)
    assert res.refined_components == 1 and res.labels.tolist() == [0] * 5
    adj = cg.adjacency(5, *edges(pairs))
    assert [p.tolist() for p in refine_component(np.arange(5), adj.indptr, adj.indices, emb, 0.9)] \
        == [[0, 1, 2, 3, 4]]
    # attach 4 through 3 instead of the hub: nobody is adjacent to all others any more
    res = run(emb, [(0, 1), (0, 2), (0, 3), (3, 4)])
    # pivot 0 (degree 3): {0,1,2,3}; then {4}: cos(4,0) = cos 40 < 0.9 -> split
    assert res.labels.tolist() == [0, 0, 0, 0, 1]


def test_duplicate_reversed_edges_and_self_loops_are_ignored():
    emb = ang(0, 2, 4, 6, 60, 62, 64, 66)
    clean = [(0, 1), (0, 2), (0, 3), (1, 2), (4, 5), (4, 6), (4, 7), (3, 5)]
    noisy = clean + [(b, a) for a, b in clean] + clean[:3] + [(k, k) for k in range(8)]
    a, b = run(emb, clean), run(emb, noisy)
    assert a.labels.tolist() == b.labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert a.representatives.tolist() == b.representatives.tolist()
    # a self loop alone does not connect anything
    assert run(ang(0, 1, 2), [(1, 1)]).labels.tolist() == [0, 1, 2]


def test_isolated_nodes_and_empty_graphs():
    # nodes at 0, 50, 100, 55, 200 deg; only edge 3-1 (cos 5 = 0.996, cohesive)
    res = run(ang(0, 50, 100, 55, 200), [(3, 1)])
    assert res.labels.tolist() == [0, 1, 2, 1, 3]            # numbered by smallest member
    assert res.representatives.tolist() == [0, 1, 2, 4]      # pair tie -> 1; singletons: self
    assert res.min_intra_cos.tolist() == pytest.approx([1.0, math.cos(math.radians(5)), 1.0, 1.0],
                                                       abs=1e-6)
    assert res.refined_components == 0
    none = cluster_graph(ang(0, 1, 2), np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert none.labels.tolist() == [0, 1, 2] and none.representatives.tolist() == [0, 1, 2]
    empty = cluster_graph(np.zeros((0, 4), dtype=np.float32), [], [])
    assert empty.labels.shape == (0,) and empty.representatives.shape == (0,)
    assert empty.n_clusters == 0 and empty.n_components == 0
    assert empty.labels.dtype == np.int64 and empty.min_intra_cos.dtype == np.float32


def test_bad_edges_rejected():
    with pytest.raises(ValueError):
        cluster_graph(ang(0, 1), [0], [2])
    with pytest.raises(ValueError):
        cluster_graph(ang(0, 1), [0, 1], [1])


# Exactly representable 4-D vectors: dot products are exactly 0.5 or 1.0 in float32.
H = [0.5, 0.5, 0.5, 0.5]
E = [1.0, 0.0, 0.0, 0.0]


def test_thresholds_are_inclusive():
    # Path 0-1-2-3-4; nodes 0-2 = H, 3-4 = E. All pairs cos 1 or 0.5 -> cohesion exactly 0.5.
    # Refinement: pivot 1 -> {0,1,2}; pivot 3 -> {3,4}; cos(3,1) = 0.5 exactly.
    emb = np.array([H, H, H, E, E], dtype=np.float32)
    pairs = [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert run(emb, pairs, tau_intra=0.5).labels.tolist() == [0] * 5          # 0.5 >= 0.5: kept
    split = run(emb, pairs, tau_intra=0.5000001)
    assert split.labels.tolist() == [0, 0, 0, 1, 1] and split.refined_components == 1
    assert run(emb, pairs, tau_intra=0.9, tau_remerge=0.5).labels.tolist() == [0] * 5
    assert run(emb, pairs, tau_intra=0.9, tau_remerge=0.5000001).labels.tolist() == [0, 0, 0, 1, 1]


# ----------------------------------------------------------------------------- representatives
def test_representatives_by_hand_with_a_tie():
    # Cluster A = nodes {0,1,2} at 0, 10, 30 deg:
    #   mean cos: 0 -> (cos10 + cos30)/2 = 0.925, 1 -> (cos10 + cos20)/2 = 0.962,
    #             2 -> (cos30 + cos20)/2 = 0.903  -> node 1.
    # Cluster B = nodes {3,4,5} in 3-D: 3 = (0, 0, 1), 4 = (y, x, 0), 5 = (x, y, 0):
    #   mean(3) = 0, mean(4) = mean(5) = (2xy + 0)/2 = 0.48 (exact tie: swapping axes 0 and 1
    #   maps 4 <-> 5) -> lowest index 4. Node 6 is a singleton -> itself.
    x, y = 0.8, 0.6
    emb3 = np.zeros((7, 3), dtype=np.float32)
    emb3[:3, :2] = ang(0, 10, 30)
    emb3[3] = [0, 0, 1]
    emb3[4] = [y, x, 0]
    emb3[5] = [x, y, 0]
    emb3[6] = [1, 0, 0]                              # singleton
    labels = np.array([0, 0, 0, 1, 1, 1, 2])
    assert representatives(emb3, labels).tolist() == [1, 4, 6]
    # a pair is always a tie -> lowest index, whatever the order of the labels
    assert representatives(ang(0, 40, 20), np.array([1, 0, 1])).tolist() == [1, 0]
    assert representatives(np.zeros((0, 3), dtype=np.float32), np.zeros(0, np.int64)).size == 0


def test_representative_tie_inside_cluster_graph():
    # Cohesive triangle (kept whole, so cluster_graph takes the representative from the
    # cohesion Gram matrices): 0 = (s, s, w) with s = 0.65, 1 = (y, x, 0), 2 = (x, y, 0).
    # cos(1,2) = 2xy = 0.96, cos(0,1) = cos(0,2) = 1.4 s = 0.91 -> cohesion 0.91 >= 0.85.
    # mean(0) = 0.91; mean(1) = mean(2) = (0.96 + 0.91)/2 = 0.935 (exact twins) -> lowest: 1.
    x, y, sv = 0.8, 0.6, 0.65
    emb = np.array([[sv, sv, math.sqrt(1 - 2 * sv * sv)], [y, x, 0], [x, y, 0]], dtype=np.float32)
    res = run(emb, [(0, 1), (1, 2), (0, 2)])
    assert res.refined_components == 0 and res.labels.tolist() == [0, 0, 0]
    assert res.representatives.tolist() == [1] == representatives(emb, res.labels).tolist()


def test_representatives_across_blocks(monkeypatch):
    # tiny blocks: label ranges and the one-big-label path must agree with the default
    rng = np.random.default_rng(3)
    emb = unit(rng.standard_normal((300, 6)))
    labels = np.concatenate([np.zeros(120, np.int64), np.arange(1, 40), rng.integers(1, 40, 141)])
    rng.shuffle(labels)
    want = reference_representatives(emb, labels)
    assert representatives(emb, labels).tolist() == want
    monkeypatch.setattr(cg, "BLOCK_BYTES", 6 * 8 * 3 * 16)      # 16 rows per block
    assert representatives(emb, labels).tolist() == want


# ----------------------------------------------------------------------------- cohesion
def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def brute_min_cos(emb, labels):
    e = emb.astype(np.float64)
    out = []
    for lab in range(int(labels.max()) + 1):
        idx = np.flatnonzero(labels == lab)
        vals = [float(e[a] @ e[b]) for a, b in itertools.combinations(idx, 2)]
        out.append(min(vals) if vals else 1.0)
    return np.array(out)


@pytest.mark.parametrize("small_max,block", [(1024, cg.BLOCK_BYTES), (8, 4096), (2, 1)])
def test_min_intra_cosine_matches_brute_force(monkeypatch, small_max, block):
    rng = np.random.default_rng(11)
    sizes = [1, 1, 2, 2, 3, 5, 5, 5, 9, 40, 130]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(labels)
    emb = unit(rng.standard_normal((labels.size, 16)) + 2.0)
    monkeypatch.setattr(cg, "SMALL_MAX", small_max)
    got = min_intra_cosine(emb, labels, block=block)
    assert got.dtype == np.float32 and got.shape == (len(sizes),)
    np.testing.assert_allclose(got, brute_min_cos(emb, labels), atol=2e-6)


def test_min_intra_cosine_skips_missing_labels():
    emb = ang(0, 10, 90)
    assert min_intra_cosine(emb, np.array([2, 2, 0])).tolist() == pytest.approx(
        [1.0, 1.0, math.cos(math.radians(10))], abs=1e-6)
    assert min_intra_cosine(emb[:0], np.zeros(0, np.int64)).shape == (0,)


def test_connected_components_numbered_by_smallest_member():
    lab = connected_components(7, np.array([5, 6, 2, 2]), np.array([1, 5, 4, 2]))
    assert lab.tolist() == [0, 1, 2, 3, 2, 1, 1]
    assert connected_components(0, np.array([]), np.array([])).tolist() == []


def test_refine_component_uses_only_member_edges():
    # CSR over 9 global nodes; members are the even nodes, path 0-2-4-6-8, plus edges from 8 to
    # the outside nodes 1, 3, 5, which must be ignored (a sloppy id lookup maps them onto the
    # members 2, 4, 6, giving 8 degree 3 and the pivot: {2,4,6,8}, {0}).
    # Correct: degrees 0:1, 2:2, 4:2, 6:2, 8:1 -> pivot 2: {0,2,4}; then pivot 6: {6,8},
    # cos(6,2) = cos 50 < 0.9 -> separate.
    emb = ang(0, 0, 10, 0, 20, 0, 60, 0, 70)
    adj = cg.adjacency(9, np.array([0, 2, 4, 6, 8, 8, 8]), np.array([2, 4, 6, 8, 1, 3, 5]))
    pieces = refine_component(np.array([8, 0, 6, 4, 2]), adj.indptr, adj.indices, emb, 0.9)
    assert [p.tolist() for p in pieces] == [[0, 2, 4], [6, 8]]
    assert refine_component(np.array([], np.int64), adj.indptr, adj.indices, emb, 0.9) == []


# ----------------------------------------------------------------------------- literal reference
def reference_representatives(emb, labels) -> list[int]:
    e = emb.astype(np.float64)
    reps = []
    for lab in range(int(labels.max()) + 1):
        idx = [int(v) for v in np.flatnonzero(labels == lab)]
        if len(idx) == 1:
            reps.append(idx[0])
            continue
        means = {a: sum(float(e[a] @ e[b]) for b in idx if b != a) / (len(idx) - 1) for a in idx}
        best = max(means.values())
        reps.append(min(a for a in idx if means[a] >= best - cg.TIE_TOL))
    return reps


def reference_cluster(emb, pairs, n, tau_intra=0.85, tau_remerge=0.90):
    """The procedure written literally: dict adjacency, networkx components, O(V^2) loops."""
    e = emb.astype(np.float64)
    cos = lambda a, b: float(e[a] @ e[b])
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((a, b) for a, b in pairs if a != b)
    clusters = []
    for comp in nx.connected_components(g):
        comp = sorted(comp)
        cohesion = min((cos(a, b) for a, b in itertools.combinations(comp, 2)), default=1.0)
        if cohesion >= tau_intra:
            clusters.append(comp)
            continue
        nbr = {s: set(g.neighbors(s)) for s in comp}
        out, rest, acc, piv = [], set(comp), [], []
        while rest:
            p = min(rest, key=lambda s: (-len(nbr[s] & rest), s))
            cut = {p} | (nbr[p] & rest)
            if not acc:
                acc, piv = list(cut), [p]
            elif min(cos(p, q) for q in piv) >= tau_remerge:
                acc += list(cut)
                piv.append(p)
            else:
                out.append(acc)
                acc, piv = list(cut), [p]
            rest -= cut
        out.append(acc)
        clusters.extend(out)
    labels = np.empty(n, dtype=np.int64)
    for k, members in enumerate(sorted(clusters, key=min)):
        labels[members] = k
    return labels, reference_representatives(emb, labels)


@pytest.mark.parametrize("seed", range(8))
def test_random_graphs_match_literal_reference(seed):
    rng = np.random.default_rng(seed)
    n, d = 90, 8
    fam = rng.integers(0, 14, n)
    centres = rng.standard_normal((14, d))
    emb = unit(centres[fam] + rng.normal(0, 0.25, (n, d)))
    same = [(a, b) for a in range(n) for b in range(a + 1, n) if fam[a] == fam[b]]
    pick = rng.random(len(same)) < 0.35
    pairs = [p for p, k in zip(same, pick) if k]
    pairs += [tuple(rng.integers(0, n, 2).tolist()) for _ in range(12)]   # noise, self loops too
    pairs += [(b, a) for a, b in pairs[:10]]                               # reversed duplicates
    want_labels, want_reps = reference_cluster(emb, pairs, n)
    res = run(emb, pairs)
    assert res.labels.tolist() == want_labels.tolist()
    assert res.representatives.tolist() == want_reps
    # representatives from the cohesion pass agree with the stand-alone computation
    assert res.representatives.tolist() == representatives(emb, res.labels).tolist()
    # the one-component entry point agrees with the batched refinement inside cluster_graph
    adj = cg.adjacency(n, *edges(pairs))
    for c in np.flatnonzero(res.min_intra_cos < 0.85):
        members = np.flatnonzero(res.component_labels == c)
        pieces = refine_component(members[::-1], adj.indptr, adj.indices, emb, 0.90)
        assert {frozenset(p.tolist()) for p in pieces} == \
            {frozenset(np.flatnonzero(res.labels == lab).tolist()) for lab in set(res.labels[members])}


def test_random_graphs_exercise_both_branches():
    # guard that the reference comparison above is not vacuous
    refined = kept = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        fam = rng.integers(0, 14, 90)
        emb = unit(rng.standard_normal((14, 8))[fam] + rng.normal(0, 0.25, (90, 8)))
        same = [(a, b) for a in range(90) for b in range(a + 1, 90) if fam[a] == fam[b]]
        pairs = [p for p, k in zip(same, rng.random(len(same)) < 0.35) if k]
        pairs += [tuple(rng.integers(0, 90, 2).tolist()) for _ in range(12)]
        res = run(emb, pairs)
        refined += res.refined_components
        sizes = np.bincount(res.component_labels)
        kept += int(((res.min_intra_cos >= 0.85) & (sizes > 1)).sum())
    assert refined >= 5 and kept >= 5


def test_refine_component_ignores_self_loops_and_duplicates_in_raw_csr():
    # Path 0-1-2-3 given as a hand-made CSR with a self loop on 2 and a duplicated 2->3 entry.
    # Counting those, 2 would have degree 4 and be the pivot: {1,2,3}, {0}. Ignoring them:
    # degrees 1,2,2,1 -> pivot 1: {0,1,2}; then {3}: cos(3,1) = cos 50 < 0.9.
    indptr = np.array([0, 1, 3, 7, 8])
    indices = np.array([1, 0, 2, 1, 2, 3, 3, 2])
    pieces = refine_component(np.arange(4), indptr, indices, ang(0, 10, 20, 60), 0.9)
    assert [p.tolist() for p in pieces] == [[0, 1, 2], [3]]


@pytest.mark.parametrize("block_rows", [None, 3])
def test_representatives_use_exact_self_dot(monkeypatch, block_rows):
    # Rows off unit norm (0.5..1.5): the score must still be the mean dot product with the
    # OTHER members, i.e. e.S - e.e, not e.S. With 3-row blocks every cluster of 4+ members
    # goes through the one-big-label path.
    rng = np.random.default_rng(5)
    emb = unit(rng.standard_normal((120, 6)) + 1.0) * rng.uniform(0.5, 1.5, (120, 1)).astype(np.float32)
    labels = np.repeat(np.arange(20), rng.integers(2, 11, 20))[:120]
    rng.shuffle(labels)
    if block_rows:
        monkeypatch.setattr(cg, "BLOCK_BYTES", 6 * 8 * 3 * block_rows)
    assert representatives(emb, labels).tolist() == reference_representatives(emb, labels)


def test_gram_representatives_near_ties_match_float64():
    # 300 cohesive clusters of 4 vectors at 0, 10, 20, 30 deg in random planes of R^16: the
    # middle two tie exactly in exact arithmetic and differ by float32 rounding only. The
    # representatives cluster_graph takes from the float32 cohesion Gram matrices must be
    # re-decided in float64 there, i.e. agree with the stand-alone float64 computation.
    rng = np.random.default_rng(7)
    rows, pairs = [], []
    for c in range(300):
        q, _ = np.linalg.qr(rng.standard_normal((16, 2)))
        rows.append(ang(0, 10, 20, 30).astype(np.float64) @ q.T)
        pairs += [(4 * c + k, 4 * c + k + 1) for k in range(3)]
    emb = unit(np.concatenate(rows))
    res = run(emb, pairs)
    assert res.refined_components == 0 and res.n_clusters == 300
    want = representatives(emb, res.labels)
    assert set((want % 4).tolist()) == {1, 2}           # the tie really is decided by rounding
    assert res.representatives.tolist() == want.tolist()
