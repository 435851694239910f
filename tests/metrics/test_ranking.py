"""Batched ranking metrics: tie rule of top_k, CSR padding, relevance and eq. (1)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rexeval.metrics.ranking import (
    metric_names,
    pad_positives,
    ranking_metrics,
    relevance,
    summarise,
    top_k,
)
from rexeval.metrics.registry import get_metric

INF = float("inf")
NAN = float("nan")


def _reference_top_k(row: list[float], k: int) -> list[int]:
    """Slow but obviously right: score desc, index asc, NaN as -inf."""
    key = [(-INF if math.isnan(v) else v) for v in row]
    return sorted(range(len(row)), key=lambda j: (-key[j], j))[:k]


def _tk(rows: list[list[float]], k: int, **kw) -> list[list[int]]:
    return top_k(torch.tensor(rows, dtype=torch.float32), k, **kw).tolist()


# ------------------------------------------------------------------------- top_k


def test_all_equal_row_takes_lowest_indices():
    assert _tk([[1.0] * 6], 3) == [[0, 1, 2]]
    assert _tk([[0.0] * 6], 6) == [[0, 1, 2, 3, 4, 5]]


def test_boundary_tie_at_kth_position():
    # 7 (idx 3) > 5 (idx 0) > four 3s at idx 1, 2, 4, 5: the cut falls inside the 3s.
    row = [5.0, 3.0, 3.0, 7.0, 3.0, 3.0]
    assert _tk([row], 3) == [[3, 0, 1]]
    assert _tk([row], 4) == [[3, 0, 1, 2]]
    assert _tk([row], 5) == [[3, 0, 1, 2, 4]]


def test_interior_ties_ordered_by_index():
    row = [2.0, 9.0, 9.0, 1.0, 9.0]
    assert _tk([row], 3) == [[1, 2, 4]]
    assert _tk([row], 4) == [[1, 2, 4, 0]]


def test_popularity_counts_mostly_zero():
    # 1000 candidates, three non-zero counts; the rest of the top 10 are the
    # lowest-index zeros (0, 1, ... skipping the non-zero ones).
    counts = torch.zeros(2, 1000, dtype=torch.float64)
    counts[0, [500, 7, 999]] = torch.tensor([3.0, 3.0, 1.0], dtype=torch.float64)
    got = top_k(counts, 10).tolist()
    assert got[0] == [7, 500, 999, 0, 1, 2, 3, 4, 5, 6]
    assert got[1] == list(range(10))


def test_integer_scores_accepted():
    counts = torch.tensor([[0, 4, 0, 4, 2]], dtype=torch.int64)
    assert top_k(counts, 3).tolist() == [[1, 3, 4]]


def test_nan_counts_as_minus_inf():
    assert _tk([[NAN, 1.0, NAN, 0.0]], 4) == [[1, 3, 0, 2]]


def test_fewer_finite_candidates_than_k():
    # Masked (-inf) candidates come last, by index.
    assert _tk([[-INF, 2.0, -INF, 1.0, -INF]], 4) == [[1, 3, 0, 2]]
    assert _tk([[-INF, -INF, -INF]], 2) == [[0, 1]]


def test_k_larger_than_n():
    out = top_k(torch.tensor([[0.1, 0.3, 0.2], [1.0, 1.0, 1.0]]), 5)
    assert out.shape == (2, 3) and out.dtype == torch.long
    assert out.tolist() == [[1, 2, 0], [0, 1, 2]]


def test_bad_k_and_shape():
    with pytest.raises(ValueError):
        top_k(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError):
        top_k(torch.zeros(3), 1)


def test_empty_inputs():
    assert top_k(torch.zeros(0, 5), 3).shape == (0, 3)
    assert top_k(torch.zeros(4, 0), 3).shape == (4, 0)


@pytest.mark.parametrize("n", [1, 7, 40, 3000])
def test_random_ties_match_reference(n):
    gen = torch.Generator().manual_seed(n)
    rows = 48 if n < 1000 else 6
    scores = torch.randint(0, 4, (rows, n), generator=gen).to(torch.float32)
    special = torch.rand(rows, n, generator=gen)
    scores[special < 0.1] = -INF
    scores[(special >= 0.1) & (special < 0.15)] = NAN
    for k in (1, 3, 10, 64):
        got = top_k(scores, k).tolist()
        want = [_reference_top_k(r, k) for r in scores.tolist()]
        assert got == want, (n, k)


def test_chunking_gives_same_result():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (37, 50), generator=gen).to(torch.float64)
    whole = top_k(scores, 10)
    assert torch.equal(top_k(scores, 10, chunk=8), whole)
    assert torch.equal(top_k(scores, 10, chunk=1), whole)


# ----------------------------------------------------------------- pad_positives


def test_pad_positives_ragged_csr():
    # interaction 0: [10, 11]; 1: []; 2: [20, 21, 22]; 3: [30]
    offsets = np.array([0, 2, 2, 5, 6], dtype=np.int64)
    values = np.array([10, 11, 20, 21, 22, 30], dtype=np.int64)
    got = pad_positives(offsets, values, torch.tensor([2, 1, 0, 3]))
    assert got.dtype == torch.long
    assert got.tolist() == [[20, 21, 22], [-1, -1, -1], [10, 11, -1], [30, -1, -1]]
    # Tensors work too, and a batch of empty lists still has one column.
    empty = pad_positives(torch.from_numpy(offsets), torch.from_numpy(values), torch.tensor([1, 1]))
    assert empty.tolist() == [[-1], [-1]]


# --------------------------------------------------------------------- relevance


def test_relevance_padding_and_valid_mask():
    ranked = torch.tensor([[3, 0, 1], [4, 2, 5]])
    positives = torch.tensor([[1, -1, -1], [5, 4, 9]])
    assert relevance(ranked, positives).tolist() == [[False, False, True], [True, False, True]]
    valid = torch.tensor([[True, True, True], [True, True, False]])
    assert relevance(ranked, positives, valid=valid).tolist() == [
        [False, False, True],
        [True, False, False],
    ]


# ------------------------------------------------------------- ranking_metrics


def _row(metrics: dict, key: str, i: int = 0) -> float:
    return float(metrics[key][i])


def test_eq1_hand_values_ideal_norm():
    rel = torch.tensor([[False, True, False, True]])
    m = ranking_metrics(rel, torch.tensor([2]), ks=(1, 3, 4, 5))
    l3, l5 = math.log2(3), math.log2(5)
    # k=1: nothing relevant at rank 1.
    assert _row(m, "precision@1") == 0 and _row(m, "recall@1") == 0
    assert _row(m, "ndcg@1") == 0 and _row(m, "hit@1") == 0
    # k=3: one hit (rank 2). P = 1/3, R = 1/2, DCG = 1/log2(3), IDCG = 1 + 1/log2(3).
    assert _row(m, "precision@3") == pytest.approx(1 / 3)
    assert _row(m, "recall@3") == pytest.approx(1 / 2)
    assert _row(m, "ndcg@3") == pytest.approx((1 / l3) / (1 + 1 / l3))
    assert _row(m, "hit@3") == 1
    # k=4: hits at ranks 2 and 4. DCG = 1/log2(3) + 1/log2(5); IDCG over min(4, 2) = 2 ranks.
    assert _row(m, "precision@4") == pytest.approx(2 / 4)
    assert _row(m, "recall@4") == pytest.approx(1.0)
    assert _row(m, "ndcg@4") == pytest.approx((1 / l3 + 1 / l5) / (1 + 1 / l3))
    # k=5 but only 4 ranked columns: the 5th counts as non-relevant, P still over 5.
    assert _row(m, "precision@5") == pytest.approx(2 / 5)
    assert _row(m, "ndcg@5") == pytest.approx((1 / l3 + 1 / l5) / (1 + 1 / l3))
    assert all(v.dtype == torch.float64 for v in m.values())


def test_eq1_literal_k_norm():
    rel = torch.tensor([[False, True, False, True]])
    m = ranking_metrics(rel, torch.tensor([2]), ks=(3, 4), ndcg_norm="k")
    l3, l5 = math.log2(3), math.log2(5)
    # Z_3 = 1 + 1/log2(3) + 1/log2(4) = 1 + 1/log2(3) + 1/2
    assert _row(m, "ndcg@3") == pytest.approx((1 / l3) / (1 + 1 / l3 + 0.5))
    # Z_4 = Z_3 + 1/log2(5)
    assert _row(m, "ndcg@4") == pytest.approx((1 / l3 + 1 / l5) / (1 + 1 / l3 + 0.5 + 1 / l5))
    # Precision / recall do not depend on the normalisation.
    assert _row(m, "precision@3") == pytest.approx(1 / 3)


def test_perfect_list_with_more_positives_than_k():
    # 3 of 3 relevant, 5 positives: ideal NDCG = 1, R = 3/5; literal Z_3 is the same.
    rel = torch.tensor([[True, True, True]])
    for norm in ("ideal", "k"):
        m = ranking_metrics(rel, torch.tensor([5]), ks=(3,), ndcg_norm=norm)
        assert _row(m, "ndcg@3") == pytest.approx(1.0)
        assert _row(m, "recall@3") == pytest.approx(3 / 5)


def test_one_positive_found_first_ideal_vs_literal():
    # One positive at rank 1, k=3: ideal DCG = 1 -> NDCG 1; literal Z_3 = 1 + 1/log2(3) + 1/2.
    rel = torch.tensor([[True, False, False]])
    ideal = ranking_metrics(rel, torch.tensor([1]), ks=(3,))
    literal = ranking_metrics(rel, torch.tensor([1]), ks=(3,), ndcg_norm="k")
    assert _row(ideal, "ndcg@3") == pytest.approx(1.0)
    assert _row(literal, "ndcg@3") == pytest.approx(1 / (1 + 1 / math.log2(3) + 0.5))


def test_rows_without_positives_are_nan():
    rel = torch.tensor([[True, False], [False, False]])
    m = ranking_metrics(rel, torch.tensor([1, 0]), ks=(1, 2))
    for name in metric_names((1, 2)):
        assert not math.isnan(_row(m, name, 0))
        assert math.isnan(_row(m, name, 1))


def test_hit_rate():
    rel = torch.tensor([[False, False, True], [True, False, False], [False, False, False]])
    m = ranking_metrics(rel, torch.tensor([1, 1, 2]), ks=(1, 2, 3))
    assert m["hit@1"].tolist() == [0.0, 1.0, 0.0]
    assert m["hit@2"].tolist() == [0.0, 1.0, 0.0]
    assert m["hit@3"].tolist() == [1.0, 1.0, 0.0]


def test_metric_keys_and_errors():
    m = ranking_metrics(torch.zeros(1, 2, dtype=torch.bool), torch.tensor([1]), ks=(1, 2))
    assert list(m) == metric_names((1, 2)) == [
        "precision@1", "recall@1", "ndcg@1", "hit@1",
        "precision@2", "recall@2", "ndcg@2", "hit@2",
    ]
    with pytest.raises(ValueError):
        ranking_metrics(torch.zeros(1, 2, dtype=torch.bool), torch.tensor([1]), ndcg_norm="foo")
    with pytest.raises(ValueError):
        ranking_metrics(torch.zeros(1, 2, dtype=torch.bool), torch.tensor([1]), ks=(0, 1))


def test_families_registered():
    for family in ("precision@k", "recall@k", "ndcg@k", "hit@k"):
        info = get_metric(family)
        assert info.higher_is_better and info.kind == "per_example"
        assert info.inputs == ("ranking", "positives")


def test_end_to_end_pipeline():
    # Row 0 ranks [2, 0, 1] with positives {0}; row 1 ranks [0, 1, 2] with none.
    scores = torch.tensor([[0.5, 0.1, 0.9], [0.3, 0.3, 0.3]])
    offsets, values = np.array([0, 1, 1]), np.array([0])
    ranked = top_k(scores, 3)
    rel = relevance(ranked, pad_positives(offsets, values, torch.tensor([0, 1])))
    n_pos = torch.from_numpy(np.diff(offsets))
    m = ranking_metrics(rel, n_pos, ks=(1, 3))
    # Positive at rank 2: P@3 = 1/3, NDCG@3 = (1/log2(3)) / 1.
    assert _row(m, "precision@3") == pytest.approx(1 / 3)
    assert _row(m, "ndcg@3") == pytest.approx(1 / math.log2(3))
    assert math.isnan(_row(m, "ndcg@3", 1))


# --------------------------------------------------------------------- summarise


def test_summarise_averages_and_counts():
    rel = torch.tensor([[True, False], [False, True], [True, True]])
    m = ranking_metrics(rel, torch.tensor([1, 2, 0]), ks=(1, 2))
    s = summarise(m)
    # precision@1 rows: [1, 0, NaN] -> 0.5; recall@2: [1/1, 1/2, NaN] -> 0.75.
    assert s["precision@1"] == pytest.approx(0.5)
    assert s["recall@2"] == pytest.approx(0.75)
    assert s["hit@2"] == pytest.approx(1.0)
    assert (s["n_rows"], s["n_scored"], s["n_without_positives"]) == (3, 2, 1)
    assert all(type(v) is float for k, v in s.items() if not k.startswith("n_"))
    assert all(type(s[k]) is int for k in ("n_rows", "n_scored", "n_without_positives"))


def test_summarise_numpy_and_all_nan():
    s = summarise({"ndcg@1": np.array([NAN, NAN])})
    assert math.isnan(s["ndcg@1"])
    assert (s["n_rows"], s["n_scored"], s["n_without_positives"]) == (2, 0, 2)


def test_lowest_tied_searches_wider_windows_when_a_prefix_has_too_few_ties(monkeypatch):
    from rexeval.metrics import ranking

    monkeypatch.setattr(ranking, "TIE_WINDOWS", (4,))
    scores = torch.tensor([[0.0, 0, 0, 0, 0, 1, 0, 1, 0, 1], [1.0, 1, 0, 1, 1, 1, 1, 1, 1, 1]])
    kth = torch.tensor([[1.0], [1.0]])
    lowest = ranking._lowest_tied(scores, kth, 2)
    # Row 0: no tie in columns 0-3, so the full row is searched; row 1 settles in the prefix.
    assert lowest.tolist() == [[5, 7], [0, 1]]
    # Fewer ties than asked: padded with N.
    assert ranking._lowest_tied(scores, kth, 4).tolist() == [[5, 7, 9, 10], [0, 1, 3, 4]]


def test_first_true_in_bounded_chunks(monkeypatch):
    import rexeval.metrics.ranking as ranking

    monkeypatch.setattr(ranking, "NONZERO_CHUNK", 7)  # one row per nonzero call
    eq = torch.tensor([[False, True, True, False, True], [False] * 5, [True] * 5])
    first, count = ranking._first_true(eq, 2, 5)
    assert first.tolist() == [[1, 2], [5, 5], [0, 1]]
    assert count.tolist() == [3, 0, 5]


@pytest.mark.parametrize("windows", [(3, 50), (64,), ()])
def test_top_k_with_narrow_tie_windows_matches_reference(monkeypatch, windows):
    from rexeval.metrics import ranking

    monkeypatch.setattr(ranking, "TIE_WINDOWS", windows)
    gen = torch.Generator().manual_seed(5)
    scores = torch.randint(0, 3, (40, 700), generator=gen).float()
    scores[::7] = 0.0  # rows that are all one value
    scores[1, 600:] = 9.0  # the best candidates sit past every window
    got = top_k(scores, 20)
    for row, out in zip(scores.tolist(), got.tolist()):
        assert out == sorted(range(len(row)), key=lambda j: (-row[j], j))[:20]


# ------------------------------------------ which normaliser reproduces seed 002 Table 1

Z10 = 4.543559338088346  # sum_{j=1..10} 1/log2(j+1), added up by hand below
Z5 = 1 + 1 / math.log2(3) + 1 / 2 + 1 / math.log2(5) + 1 / math.log2(6)


def test_z10_and_the_literal_bound_by_hand():
    from rexeval.metrics.ranking import dcg_normaliser, literal_ndcg_bound

    assert sum(1 / math.log2(j + 1) for j in range(1, 11)) == pytest.approx(Z10)
    assert dcg_normaliser(10) == pytest.approx(Z10)
    assert list(dcg_normaliser(10, np.array([1, 2, 12]))) == pytest.approx([1, 1 + 1 / math.log2(3), Z10])
    assert literal_ndcg_bound(10) == pytest.approx(10 / Z10) == pytest.approx(2.2009177)


def test_literal_normaliser_caps_ndcg_over_precision():
    """Under the "k" normaliser N@10 <= (10 / Z_10) P@10 row by row, so for any mean; the
    "ideal" one has no such cap. Random relevance patterns and every n_pos."""
    from rexeval.metrics.ranking import literal_ndcg_bound

    gen = torch.Generator().manual_seed(0)
    rel = torch.rand(4000, 10, generator=gen) < torch.rand(4000, 1, generator=gen) * 0.5
    n_pos = rel.sum(1) + torch.randint(0, 4, (4000,), generator=gen)
    keep = n_pos > 0
    rel, n_pos = rel[keep], n_pos[keep]
    lit = ranking_metrics(rel, n_pos, ks=(10,), ndcg_norm="k")
    ideal = ranking_metrics(rel, n_pos, ks=(10,))
    p = lit["precision@10"]
    assert bool((lit["ndcg@10"] <= literal_ndcg_bound(10) * p + 1e-12).all())
    assert float(ideal["ndcg@10"].max() / p[ideal["ndcg@10"].argmax()]) > literal_ndcg_bound(10)


def test_seed002_table1_breaks_the_literal_bound():
    """Cells of seed 002 Table 1 (transcribed by hand): N@10 / P@10 above 10 / Z_10 even at
    the rounding's most favourable end, so the literal normaliser cannot have made them."""
    cells = {("Clothes", "ITEMPOP", "global"): (0.04646, 0.12000),
             ("Clothes", "ITEMPOP", "item"): (0.05376, 0.12947),
             ("Toys", "EXPGCN", "global"): (0.04509, 0.10054),
             ("Beauty", "USERPOP", "global"): (0.01885, 0.04358)}
    for p, n in cells.values():
        assert (n - 5e-6) / (p + 5e-6) > 10 / Z10
    from benchmarks.bench_ndcg_norm import bound_check

    above = {(c["dataset"], c["method"], c["level"]) for c in bound_check() if c["above_bound"]}
    assert set(cells) <= above and len(above) == 9


def test_random_ranking_expectation_by_hand():
    from rexeval.metrics.ranking import random_ranking_expectation

    # 2 relevant among 20 candidates: every rank is relevant with probability 0.1.
    e = random_ranking_expectation([2], [20], 10, "k")
    assert (e["precision@10"][0], e["recall@10"][0], e["ndcg@10"][0]) == pytest.approx((0.1, 0.5, 0.1))
    e = random_ranking_expectation([2], [20], 10, "ideal")
    assert e["ndcg@10"][0] == pytest.approx(0.1 * Z10 / (1 + 1 / math.log2(3)))
    assert e["ndcg@10"][0] == pytest.approx(0.278587, abs=1e-6)
    # Fewer candidates than k: 3 relevant among 5, all five ranked.
    e = random_ranking_expectation([3], [5], 10, "k")
    assert (e["precision@10"][0], e["recall@10"][0]) == pytest.approx((0.3, 1.0))
    assert e["ndcg@10"][0] == pytest.approx(0.6 * Z5 / Z10)
    with pytest.raises(ValueError):
        random_ranking_expectation([3], [2], 10)


def test_random_ranking_expectation_matches_enumeration():
    """Independent check: average our per-row metrics over every placement of 2 relevant
    statements among 5 ranked candidates (all C(5, 2) = 10 equally likely)."""
    from itertools import combinations

    from rexeval.metrics.ranking import random_ranking_expectation

    rows = [[j in pos for j in range(5)] for pos in combinations(range(5), 2)]
    rel = torch.tensor(rows)
    for k in (3, 10):
        for norm in ("ideal", "k"):
            got = ranking_metrics(rel, torch.full((10,), 2), ks=(k,), ndcg_norm=norm)
            want = random_ranking_expectation([2], [5], k, norm)
            for name, v in want.items():
                assert float(got[name].mean()) == pytest.approx(float(v[0])), (k, norm, name)


def test_default_normaliser_is_the_one_table1_supports():
    """One statement found first among ten: P@10 = 0.1, NDCG@10 = 1 by default (ideal),
    1 / Z_10 = 0.22 only when asked for the literal equation 1."""
    import inspect

    from rexeval.pipelines.star.config import EvalSettings
    from rexeval.pipelines.star.evaluate import evaluate

    rel = torch.tensor([[True] + [False] * 9])
    m = ranking_metrics(rel, torch.tensor([1]), ks=(10,))
    assert (_row(m, "precision@10"), _row(m, "ndcg@10")) == pytest.approx((0.1, 1.0))
    lit = ranking_metrics(rel, torch.tensor([1]), ks=(10,), ndcg_norm="k")
    assert _row(lit, "ndcg@10") == pytest.approx(1 / Z10)
    assert EvalSettings.model_fields["ndcg_norm"].default == "ideal"
    assert inspect.signature(evaluate).parameters["ndcg_norm"].default == "ideal"
