"""The FAISS index in shards (`pipelines/paraphrase/shards.py`): Flat shards give exactly the
one-index pairs, ties included; IVF shards keep recall >= 0.99 against exact search; each
shard holds only its rows and reads them itself; the merge rule and the sizing alone."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.paraphrase.embed import TABLE, vectors_table
from rexeval.pipelines.paraphrase.neighbours import candidate_pairs
from rexeval.pipelines.paraphrase.shards import (EmbeddingsAt, align_rows, canonical_topk, exact_topk, shard_bounds,
                                               shards_for)
from tests.pipelines.paraphrase.test_neighbours import planted_families

CHUNK = 1024  # query chunk of these tests: shards are multiples of 1024 rows


def tied(n: int, d: int, seed: int) -> np.ndarray:
    """Planted families, then runs of exact copies of a few rows (ties at 1.0 across shard
    bounds, more copies than k) and rows equally far from a centre (ties below 1.0)."""
    x = planted_families(n, d, family_frac=0.4, seed=seed)
    rng = np.random.default_rng(seed)
    for src, lo, hi in ((17, 950, 1100), (4000, 2040, 2060), (300, 3070, 3085)):
        x[lo:hi] = x[src]  # copies around the 1024-row shard bounds
    centre = x[5]
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    for j, row in enumerate(range(4500, 4530)):  # 30 rows at cosine 0.95 of row 5
        other = basis[:, j % d] - (basis[:, j % d] @ centre) * centre
        other /= np.linalg.norm(other)
        x[row] = 0.95 * centre + np.sqrt(1 - 0.95 ** 2) * other
        x[row] /= np.linalg.norm(x[row])
    return x


@pytest.fixture(scope="module")
def planted():
    x = tied(5200, 16, seed=3)
    groups = np.where(np.arange(len(x)) % 7 == 0, 1, 0)  # one big group (shards), one small
    return x, groups


# -------------------------------------------------------------------------------- sizing

def test_shards_follow_the_budget_and_the_workers_never_the_cluster():
    gib = 1 << 30
    assert shards_for(1_000_000, 384, "flat", 8.0) == 1  # 1.43 GiB
    assert shards_for(1_000_000, 384, "flat", 0.4) == 4
    assert shards_for(1_000_000, 384, "flat", 8.0, workers=6) == 6
    assert shards_for(10 ** 9, 384, "ivf", 16.0) == -(-(10 ** 9 * (4 * 384 + 16)) // (16 * gib))
    with pytest.raises(ValueError, match="index_shard_gib"):
        shards_for(10, 4, "flat", 0)


@pytest.mark.parametrize("n, shards", [(1, 4), (1023, 2), (1024, 2), (5200, 3), (5200, 4), (9000, 2),
                                       (2100, 2)])
def test_shard_bounds_are_aligned_and_never_leave_a_short_tail(n, shards):
    bounds = shard_bounds(n, shards, 1024)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == n and (sizes > 0).all() and len(sizes) <= shards
    assert all(b % 1024 == 0 for b in bounds[:-1])  # FAISS's BLAS blocks start at the same rows
    if len(sizes) > 1:  # about the share each, and no short tail
        assert sizes[-1] >= 1024 and (np.abs(np.array(bounds[1:-1]) - np.arange(1, len(sizes)) * n / shards) <= 1024).all()
    assert align_rows(16_384) == 16_384 and align_rows(256) == 1024


# -------------------------------------------------------------------------------- the merge rule

def test_exact_topk_over_parts_is_the_canonical_order_of_the_whole(planted):
    """Parts searched as FAISS does (top-k, ties in any order) and merged give the whole
    matrix's top-k by (cosine desc, row asc), computed here independently with numpy."""
    import faiss

    x, _ = planted
    q = x[940:1120]  # rows with 150 exact copies among them
    bounds = [0, 1024, 2048, 3072, len(x)]
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        index = faiss.IndexFlatIP(x.shape[1])
        index.add(x[lo:hi])

        def ask(qq, k, which, index=index, lo=lo):
            sims, rows = index.search(np.ascontiguousarray(qq if which is None else qq[which]), int(k))
            return sims, np.where(rows >= 0, rows + lo, -1)
        parts.append(ask)
    kk = 9
    sims, rows = exact_topk(parts, q, kk)
    whole = faiss.IndexFlatIP(x.shape[1])
    whole.add(x)
    all_sims, all_rows = whole.search(q, len(x))
    want_sims, want_rows = canonical_topk(all_sims, all_rows, kk)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(sims, want_sims)
    assert (want_sims[:, -1] == want_sims[:, 0]).sum() > 100  # the ties are really there
    # the canonical order itself: cosine descending, then row ascending
    order = np.lexsort((want_rows[0], -want_sims[0]))
    assert (order == np.arange(kk)).all()


# -------------------------------------------------------------------------------- on Ray

@pytest.mark.slow
def test_flat_shards_give_exactly_the_one_index_pairs_with_ties(ray_session, planted):
    x, groups = planted
    one = candidate_pairs(x, groups, k=8, tau=0.9, kind="flat", workers=1, chunk=CHUNK)
    said: list[str] = []
    sharded = candidate_pairs(x, groups, k=8, tau=0.9, kind="flat", workers=4, chunk=CHUNK, progress=said.append)
    st = sharded.stats["0"]
    assert st["shards"] == 4 and st["bounds"] == [0, 1024, 2048, 3072, 4457]
    for f in ("a", "b", "cos"):
        np.testing.assert_array_equal(getattr(one, f), getattr(sharded, f))
    copies = {(int(a), int(b)) for a, b in zip(sharded.a, sharded.b) if 950 <= a < 1100 and 950 <= b < 1100}
    assert len(one) > 1000 and len(copies) > 100
    # each shard held its own rows only: about a quarter of the group's vectors
    group_bytes = st["n"] * x.shape[1] * 4
    assert all(0 < lo_hi < st["n"] for lo_hi in np.diff(st["bounds"]))
    assert len(st["shard_held_bytes"]) == 4 and any("query chunk" in m for m in said)
    assert group_bytes > 0


@pytest.mark.slow
def test_ivf_shards_keep_recall_against_exact_search(ray_session):
    """Planted near-duplicates: sharded IVF (centroids trained once, probes found once)
    finds >= 0.99 of the pairs exact search finds, and exactly what one IVF index with
    the same centroids finds."""
    x = planted_families(6000, 32, family_frac=0.5, seed=5)
    groups = np.zeros(len(x), int)
    exact = candidate_pairs(x, groups, k=16, tau=0.9, kind="flat", workers=1)
    one_ivf = candidate_pairs(x, groups, k=16, tau=0.9, kind="ivf", workers=1, ivf_join=False)
    sharded = candidate_pairs(x, groups, k=16, tau=0.9, kind="ivf", workers=3, chunk=CHUNK)
    assert sharded.stats["0"]["shards"] == 3 and sharded.stats["0"]["plan"]["kind"] == "ivf"
    want = set(zip(exact.a.tolist(), exact.b.tolist()))
    got = set(zip(sharded.a.tolist(), sharded.b.tolist()))
    assert len(want) > 1000 and len(got & want) / len(want) >= 0.99
    np.testing.assert_array_equal(sharded.a, one_ivf.a)
    np.testing.assert_array_equal(sharded.b, one_ivf.b)


@pytest.mark.slow
def test_shards_read_their_own_rows_from_the_embeddings(ray_session, planted, tmp_path, monkeypatch):
    """Given an embeddings folder, no process reads the whole matrix: each shard reads its
    rows from storage; the pairs are those of the in-memory search. A row that is not
    unit-length is named by its row in the input."""
    import rexeval.pipelines.paraphrase.embed as embed

    x, groups = planted
    folder = tmp_path / "embeddings"
    (folder / TABLE).mkdir(parents=True)
    for part, s in enumerate(range(0, len(x), 1500)):
        pq.write_table(vectors_table(s, x[s:s + 1500]), folder / TABLE / f"part-{part:05d}.parquet")
    one = candidate_pairs(x, groups, k=8, tau=0.9, kind="flat", workers=1, chunk=CHUNK)

    def refuse(*_a, **_k):
        raise AssertionError("the whole matrix was read")

    monkeypatch.setattr(embed, "read_vectors", refuse)
    at = EmbeddingsAt(str(folder), len(x), x.shape[1])
    sharded = candidate_pairs(at, groups, k=8, tau=0.9, kind="flat", workers=4, chunk=CHUNK)
    for f in ("a", "b", "cos"):
        np.testing.assert_array_equal(getattr(one, f), getattr(sharded, f))

    bad = x.copy()
    bad[3001] *= 1.5
    pq.write_table(vectors_table(3000, bad[3000:4500]), folder / TABLE / "part-00002.parquet")
    with pytest.raises(Exception, match="row 3001 has norm 1.5"):
        candidate_pairs(at, groups, k=8, tau=0.9, kind="flat", workers=4, chunk=CHUNK)
