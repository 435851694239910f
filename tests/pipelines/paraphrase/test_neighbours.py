"""Candidate pairs: exact flat search equals brute force, IVF finds the near-duplicates,
the Ray path equals the in-process path, and bad input fails with a clear error."""
from __future__ import annotations

import numpy as np
import pytest

from rexeval.pipelines.paraphrase.neighbours import PairResult, candidate_pairs, search_pairs
from rexeval.pipelines.paraphrase.index import IndexPlan, build_index, choose_index, ivf_join_pairs
from rexeval.pipelines.core.stage import Resources


def planted_families(n: int, d: int, *, family_frac: float = 0.3, seed: int = 0,
                     cos_range: tuple[float, float] = (0.90, 0.98)) -> np.ndarray:
    """Unit vectors: families of 2-8 members around random centres (member-member cosine
    ~ cos_range, one noise level per family) among random background vectors, shuffled.

    Member = centre + noise with |noise|^2 = s^2, so two members have cosine ~ 1/(1+s^2).
    Built in float32 chunks, so 1M x 384 needs ~1.5 GB, not a float64 copy.
    """
    rng = np.random.default_rng(seed)
    target = int(n * family_frac)
    sizes = rng.integers(2, 9, size=max(1, target // 2))
    sizes = sizes[np.cumsum(sizes) <= target]
    fam = np.repeat(np.arange(len(sizes)), sizes)
    lo, hi = 1 / cos_range[1] - 1, 1 / cos_range[0] - 1
    scale = (np.sqrt(rng.uniform(lo, hi, size=len(sizes))) / np.sqrt(d)).astype(np.float32)
    centres = rng.standard_normal((len(sizes), d), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 65_536):
        e = min(s + 65_536, n)
        c = rng.standard_normal((e - s, d), dtype=np.float32)
        m = np.arange(s, e) < len(fam)
        if m.any():
            f = fam[s:e]
            c[m] = centres[f] + c[m] * scale[f, None]
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        x[s:e] = c
    perm = rng.permutation(n)
    out = np.empty_like(x)
    for s in range(0, n, 65_536):  # chunked gather instead of a second full temporary
        out[s:s + 65_536] = x[perm[s:s + 65_536]]
    return out


def brute_force(x: np.ndarray, groups: np.ndarray, k: int, tau: float):
    """Reference pairs: per group, each row's top-k others by float64 cosine, then >= tau.

    Also returns the smallest margin at a decision boundary (k-th vs (k+1)-th cosine of a
    row, and any kept-or-dropped cosine vs tau), so a test can check its data has no
    near-ties that float32 rounding could flip."""
    pairs: dict[tuple[int, int], float] = {}
    margin = np.inf
    for g in np.unique(groups):
        ids = np.flatnonzero(groups == g)
        if len(ids) < 2:
            continue
        s = x[ids].astype(np.float64) @ x[ids].astype(np.float64).T
        np.fill_diagonal(s, -np.inf)
        kk = min(k, len(ids) - 1)
        order = np.argsort(-s, axis=1, kind="stable")
        top = np.take_along_axis(s, order, axis=1)
        if kk < len(ids) - 1:
            gap = top[:, kk - 1] - top[:, kk]
            relevant = top[:, kk - 1] >= tau - 1e-3  # the cut only matters above tau
            if relevant.any():
                margin = min(margin, gap[relevant].min())
        near = np.abs(top[:, :kk] - tau)
        margin = min(margin, near.min())
        for r in range(len(ids)):
            for c in range(kk):
                if top[r, c] >= tau:
                    a, b = sorted((int(ids[r]), int(ids[order[r, c]])))
                    pairs[(a, b)] = top[r, c]
    return pairs, margin


def as_dict(res: PairResult) -> dict[tuple[int, int], float]:
    return {(int(a), int(b)): float(c) for a, b, c in zip(res.a, res.b, res.cos)}


@pytest.fixture(scope="module")
def small():
    x = planted_families(3000, 32, family_frac=0.5, seed=1)
    groups = np.random.default_rng(2).choice([0, 1, 2], size=len(x), p=[0.5, 0.35, 0.15])
    return x, groups


# ----------------------------------------------------------------------------- exact

@pytest.mark.parametrize("k", [3, 16])
def test_flat_equals_brute_force(small, k):
    x, groups = small
    res = candidate_pairs(x, groups, k=k, tau=0.9, kind="flat")
    ref, margin = brute_force(x, groups, k, 0.9)
    assert margin > 1e-5  # no near-ties at the k-th place or at tau in this data
    got = as_dict(res)
    assert got.keys() == ref.keys() and len(ref) > 500
    np.testing.assert_allclose([got[p] for p in ref], list(ref.values()), atol=1e-5)
    assert res.a.dtype == np.int64 and res.b.dtype == np.int64 and res.cos.dtype == np.float32


def test_pairs_are_unique_sorted_and_within_groups(small):
    x, groups = small
    res = candidate_pairs(x, groups, k=8, tau=0.9)
    assert (res.a < res.b).all()
    key = res.a * len(x) + res.b
    assert (np.diff(key) > 0).all()  # sorted by (a, b), no duplicates
    assert (groups[res.a] == groups[res.b]).all()
    assert (res.cos >= 0.9).all()
    st = res.stats
    assert st["total"]["pairs"] == len(res) == sum(st[g]["pairs"] for g in "012")
    assert st["0"]["plan"] == {"kind": "flat", "gpu": False}


def test_k_larger_than_group_and_singleton_groups():
    x = planted_families(40, 16, family_frac=1.0, seed=3)
    groups = np.array([0] * 39 + [7])  # group 7 has one row: no index, no pairs
    res = candidate_pairs(x, groups, k=128, tau=-1.0)
    assert len(res) == 39 * 38 // 2  # every pair of group 0
    assert res.stats["7"]["pairs"] == 0
    one = candidate_pairs(x[:1], np.zeros(1), k=5)
    assert len(one) == 0 and one.a.dtype == np.int64
    none = candidate_pairs(np.zeros((0, 16), np.float32), np.zeros(0, int))
    assert len(none) == 0 and none.cos.dtype == np.float32 and none.stats["total"]["n"] == 0


def test_exact_duplicates_and_tau_one():
    rng = np.random.default_rng(4)
    v = rng.standard_normal((5, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    x = np.concatenate([v, v[:2]])  # rows 5, 6 duplicate rows 0, 1
    res = candidate_pairs(x, np.zeros(len(x), int), k=1, tau=0.999)
    assert list(zip(res.a.tolist(), res.b.tolist())) == [(0, 5), (1, 6)]


def test_search_pairs_maps_local_rows_to_global_ids(small):
    x, _ = small
    sub = x[:500]
    ids = np.arange(500, dtype=np.int64) * 10 + 7
    index = build_index(sub, IndexPlan("flat"))
    a, b, c = search_pairs(index, sub, ids, 100, 300, k=4, tau=0.9, chunk=64)
    assert len(a) and (a < b).all() and ((a - 7) % 10 == 0).all() and ((b - 7) % 10 == 0).all()
    rows = (a - 7) // 10, (b - 7) // 10
    assert (((rows[0] >= 100) & (rows[0] < 300)) | ((rows[1] >= 100) & (rows[1] < 300))).all()
    np.testing.assert_allclose(c, np.einsum("ij,ij->i", sub[rows[0]], sub[rows[1]]), atol=1e-5)


# ----------------------------------------------------------------------------- approximate

@pytest.mark.slow
def test_ivf_and_hnsw_find_the_near_duplicates():
    x = planted_families(8_000, 32, seed=5)
    groups = np.zeros(len(x), int)
    exact = as_dict(candidate_pairs(x, groups, k=16, tau=0.9, kind="flat"))
    for kind in ("ivf", "hnsw"):
        res = candidate_pairs(x, groups, k=16, tau=0.9, kind=kind)
        got = as_dict(res)
        assert set(got) <= set(exact)  # approximate search only loses pairs
        assert len(got) / len(exact) >= 0.99, kind
    assert res.stats["0"]["plan"]["kind"] == "hnsw"


def test_ivf_is_deterministic():
    x = planted_families(5_000, 32, seed=6)
    plan = choose_index(len(x), 32, 8, "ivf")
    runs = [candidate_pairs(x, np.zeros(len(x), int), k=8, kind="ivf", seed=1) for _ in range(2)]
    assert plan.nlist == 5_000 // 39 and plan.nprobe > 0  # capped by training points
    for f in ("a", "b", "cos"):
        np.testing.assert_array_equal(getattr(runs[0], f), getattr(runs[1], f))


def test_choose_index_auto():
    flat = choose_index(10_000, 384, 128)
    assert flat == IndexPlan("flat") and flat.gpu is False  # no GPU on this machine
    ivf = choose_index(1_000_000, 384, 128)
    assert ivf.kind == "ivf" and ivf.nlist == 4000 and 1 <= ivf.nprobe <= ivf.nlist
    assert choose_index(1_000_000, 384, 128, flat_max=2_000_000).kind == "flat"
    small_ivf = choose_index(1_000, 8, 4, "ivf")  # >= 39 training points per list
    assert small_ivf.nlist == 1_000 // 39
    assert choose_index(10, 8, 4, "ivf", nprobe=500).nprobe == 1  # never more than nlist
    hnsw = choose_index(100, 8, 128, "hnsw")
    assert hnsw.ef_search >= 128 and hnsw.describe() == {"kind": "hnsw", "gpu": False,
                                                        "hnsw_m": 32, "ef_search": 256}
    with pytest.raises(ValueError, match="index kind"):
        choose_index(100, 8, 4, "lsh")


# ----------------------------------------------------------------------------- GPU (planned on CPU)

def test_gpu_auto_is_off_and_gpu_true_fails_clearly_without_gpus():
    import faiss

    if faiss.get_num_gpus() > 0:
        pytest.skip("this machine has GPUs")
    assert choose_index(100_000, 384, 128, gpu="auto").gpu is False
    with pytest.raises(RuntimeError, match="no GPU"):
        choose_index(100_000, 384, 128, gpu=True)
    with pytest.raises(RuntimeError, match="no GPU"):
        candidate_pairs(np.eye(4, dtype=np.float32), np.zeros(4), gpu=True)


def _spy_shards(monkeypatch) -> list[dict]:
    """Replace `sharded_pairs` by a recorder of what each group's shards would ask for."""
    import rexeval.pipelines.paraphrase.neighbours as nb

    calls: list[dict] = []

    def fake(n, d, source_for, ids, plan, k, tau, **kw):
        calls.append({"n": n, "plan": plan, **kw})
        return (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)), {"shards": 0}

    monkeypatch.setattr(nb, "sharded_pairs", fake)
    return calls


def test_ray_path_gpus_are_what_the_shards_ask_for_not_what_the_cluster_has(ray_session, small, monkeypatch):
    """Plan-inspected on CPU: gpu=True makes every index shard ask for a GPU, though this
    cluster has none now (an autoscaler would bring one); "auto" asks only when this
    process was given a GPU. Nothing touches CUDA."""
    import ray

    calls = _spy_shards(monkeypatch)
    x, groups = small
    said: list[str] = []
    res = candidate_pairs(x, groups, k=8, kind="ivf", workers=2, gpu=True, progress=said.append)
    assert not ray.cluster_resources().get("GPU")
    assert any("no GPU in the cluster now" in m for m in said)
    assert [(c["plan"].gpu, c["plan"].kind, c["resources"].gpus, c["workers"]) for c in calls] == [(True, "ivf", 1, 2)] * 3
    assert res.stats["0"]["plan"]["gpu"] is True and len(res) == 0

    calls.clear()
    candidate_pairs(x, groups, k=8, kind="ivf", workers=2, gpu="auto")
    assert [c["resources"].gpus for c in calls] == [0] * 3


def test_ray_path_sizes_its_shards_from_the_settings_not_the_cluster(ray_session, small, monkeypatch):
    """threads=4, workers=3, 2 GiB and a custom resource on a cluster joined by address (one
    whose nodes may not be read: a cold autoscaling one): every shard actor asks for 4
    CPUs (FAISS threads), 2 GiB and {accel: 1}, with the shard budget the settings give."""
    import ray

    def refuse(*_a, **_k):
        raise AssertionError("the cluster's nodes or resources were read")

    for name in ("cluster_resources", "available_resources", "nodes"):
        monkeypatch.setattr(ray, name, refuse)
    monkeypatch.delenv("REXEVAL_ONE_MACHINE", raising=False)  # joined, not started here
    calls = _spy_shards(monkeypatch)
    x, groups = small
    candidate_pairs(x, groups, k=8, kind="ivf", workers=3, gpu=False, threads=4, memory_gib=2,
                    resources={"accel": 1}, index_shard_gib=0.5)
    want = Resources(cpus=4, gpus=0, memory=2 * (1 << 30), custom=(("accel", 1),))
    assert [(c["resources"], c["workers"], c["budget_gib"]) for c in calls] == [(want, 3, 0.5)] * 3


@pytest.mark.slow
def test_ray_path_equals_in_process(ray_session, small, monkeypatch):
    """One Ray run covers both index kinds: the largest group is IVF, the others flat. No
    index is built in this process."""
    x, groups = small
    sizes = np.bincount(groups)
    opts = {"k": 8, "tau": 0.9, "flat_max": int(sizes.max()) - 1}
    local = candidate_pairs(x, groups, workers=1, ivf_join=False, **opts)  # FAISS's IVF search, as shards

    import rexeval.pipelines.paraphrase.index as index
    import rexeval.pipelines.paraphrase.neighbours as nb

    def refuse(*_a, **_k):
        raise AssertionError("an index was built in the calling process")

    monkeypatch.setattr(nb, "build_index", refuse)
    monkeypatch.setattr(index, "build_index", refuse)
    seen = []
    remote = candidate_pairs(x, groups, workers=2, progress=seen.append, chunk=256, **opts)
    assert remote.stats["total"]["path"] == "ray" and local.stats["total"]["path"] == "in-process"
    kinds = sorted(st["plan"]["kind"] for st in remote.stats.values() if "plan" in st)
    assert kinds == ["flat", "flat", "ivf"] and len(local) > 500
    for f in ("a", "b", "cos"):
        np.testing.assert_array_equal(getattr(local, f), getattr(remote, f))
    assert all(remote.stats[g]["shards"] >= 1 for g in "012") and any("query chunk" in m for m in seen)
    assert {g: remote.stats[g]["pairs"] for g in "012"} == {g: local.stats[g]["pairs"] for g in "012"}


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("vectors, groups, match", [
    (np.ones(4, np.float32), np.zeros(4), "2-D"),
    (np.eye(4, dtype=np.float32), np.zeros(3), "one entry per vector"),
    (np.where(np.eye(4) == 1, np.nan, 0).astype(np.float32), np.zeros(4), "NaN"),
    (np.eye(4, dtype=np.float32) * 1.01, np.zeros(4), "L2-normalised"),
    (np.zeros((4, 4), np.float32), np.zeros(4), "L2-normalised"),
])
def test_bad_input_is_rejected(vectors, groups, match):
    with pytest.raises(ValueError, match=match):
        candidate_pairs(vectors, groups)


def test_float64_and_nearly_unit_input_is_accepted():
    x = np.eye(4) * (1 + 5e-4)
    res = candidate_pairs(x, np.zeros(4), k=3, tau=-1)
    assert len(res) == 6 and res.stats["0.0"]["n"] == 4


def test_blas_coretype_from_cpu_flags(tmp_path):
    from rexeval.pipelines.paraphrase.index import _blas_coretype

    info = tmp_path / "cpuinfo"
    info.write_text("processor: 0\nflags\t: fpu sse avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl\n")
    assert _blas_coretype(str(info)) == "SkylakeX"
    info.write_text("flags : fpu sse avx avx2 fma\n")
    assert _blas_coretype(str(info)) == "Haswell"
    info.write_text("flags : fpu sse\n")
    assert _blas_coretype(str(info)) is None
    assert _blas_coretype(str(tmp_path / "missing")) is None


def test_ivf_join_matches_exact_with_every_list_probed_and_keeps_faiss_recall():
    """The GEMM self-join: with nprobe = nlist it is an exact search; with the default
    probes it finds at least the pairs FAISS's own IVF search finds (same lists, and
    every query still sees its own nprobe lists), and it is deterministic."""
    x = planted_families(6_000, 32, seed=11)
    groups = np.zeros(len(x), int)
    exact = as_dict(candidate_pairs(x, groups, k=8, tau=0.9, kind="flat"))
    nlist = choose_index(len(x), 32, 8, "ivf").nlist
    full = candidate_pairs(x, groups, k=8, tau=0.9, kind="ivf", nprobe=nlist)
    assert full.stats["0"]["plan"]["search"] == "gemm-join"
    assert set(as_dict(full)) == set(exact)
    for (a, b), c in as_dict(full).items():
        assert c == pytest.approx(exact[(a, b)], abs=1e-5)
    joined = candidate_pairs(x, groups, k=8, tau=0.9, kind="ivf", nprobe=2)
    faiss_ivf = candidate_pairs(x, groups, k=8, tau=0.9, kind="ivf", nprobe=2, ivf_join=False)
    assert set(as_dict(faiss_ivf)) <= set(as_dict(joined)) <= set(exact)
    again = candidate_pairs(x, groups, k=8, tau=0.9, kind="ivf", nprobe=2)
    np.testing.assert_array_equal(joined.a, again.a)
    np.testing.assert_array_equal(joined.cos, again.cos)


def test_ivf_join_keeps_k_best_per_query():
    """Ten identical vectors: each query keeps its k=3 best others (ties: lowest ids),
    not all nine. Queries 0-2 keep the other three of {0,1,2,3}, queries 3-9 keep
    {0,1,2}: 30 directed results, 6 + 3*6 = 24 distinct pairs out of 45."""
    x = np.tile(np.eye(8, dtype=np.float32)[:1], (10, 1))
    a, b, c = ivf_join_pairs(x, np.arange(10), nlist=1, nprobe=1, k=3, tau=0.5)
    assert len(a) == 30
    pairs = set(zip(a.tolist(), b.tolist()))
    assert len(pairs) == 24 and (0, 3) in pairs and (3, 4) not in pairs
