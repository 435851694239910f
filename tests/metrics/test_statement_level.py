"""Statement-level metrics (seed 000, eq. 4-11): hand-computed values, policies, and
the vectorised path against the per-example one."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rexeval.metrics import st2exp as st
from rexeval.metrics import statement_level as sl
from rexeval.metrics.registry import get_metric

NAN = float("nan")

# One example, n = 2 generated statements, m = 3 reference statements.
# Triples are (E, N, C), i.e. columns ENT=0, NEU=1, CON=2.
# P_GEN[k][l] = NLI(premise=s_l, hypothesis=s'_k)
P_GEN = np.array([
    # k=0:  l=0              l=1              l=2 (tie E == N)
    [(0.7, 0.2, 0.1), (0.2, 0.3, 0.5), (0.4, 0.4, 0.2)],
    # k=1:  l=0              l=1 (tie N == C) l=2
    [(0.1, 0.3, 0.6), (0.3, 0.35, 0.35), (0.2, 0.2, 0.6)],
])
# P_REF[l][k] = NLI(premise=s'_k, hypothesis=s_l)
P_REF = np.array([
    # l=0:  k=0              k=1
    [(0.6, 0.3, 0.1), (0.2, 0.2, 0.6)],
    # l=1
    [(0.1, 0.1, 0.8), (0.3, 0.3, 0.4)],
    # l=2:  k=0 (tie E == N)
    [(0.5, 0.5, 0.0), (0.25, 0.5, 0.25)],
])

# Precision, per generated statement k (max over l):
#   ent:     k=0 max(0.7, 0.2, 0.4) = 0.7;  k=1 max(0.1, 0.3, 0.2) = 0.3
#            StEnt-P = (0.7 + 0.3) / 2 = 0.5
#   ent_bin: k=0: l=0 0.7 is top -> 1; l=1 0.2 < 0.5 -> 0; l=2 0.4 == 0.4 >= 0.2 -> 1
#            (tie counts)  => max 1
#            k=1: l=0 0.1 -> 0; l=1 0.3 < 0.35 -> 0; l=2 0.2 < 0.6 -> 0  => max 0
#            StEnt-bin-P = (1 + 0) / 2 = 0.5
#   coh:     k=0: 0.7-0.1 = 0.6, 0.2-0.5 = -0.3, 0.4-0.2 = 0.2  => 0.6
#            k=1: 0.1-0.6 = -0.5, 0.3-0.35 = -0.05, 0.2-0.6 = -0.4  => -0.05
#            StCoh-P = (0.6 - 0.05) / 2 = 0.275
# Recall, per reference statement l (max over k):
#   ent:     l=0 max(0.6, 0.2) = 0.6; l=1 max(0.1, 0.3) = 0.3; l=2 max(0.5, 0.25) = 0.5
#            StEnt-R = 1.4 / 3
#   ent_bin: l=0 k=0 0.6 top -> 1; l=1 k=0 0.1 -> 0, k=1 0.3 < 0.4 -> 0 => 0;
#            l=2 k=0 0.5 == 0.5 >= 0.0 -> 1  => StEnt-bin-R = (1 + 0 + 1) / 3 = 2/3
#   coh:     l=0: 0.5, -0.4 => 0.5; l=1: -0.7, -0.1 => -0.1; l=2: 0.5, 0.0 => 0.5
#            StCoh-R = 0.9 / 3 = 0.3
# F1: StEnt-F1 = 2 * 0.5 * (1.4/3) / (0.5 + 1.4/3) = (1.4/3) / (2.9/3) = 1.4 / 2.9
#     StEnt-bin-F1 = 2 * 0.5 * (2/3) / (0.5 + 2/3) = (2/3) / (7/6) = 4/7
GOLDEN = {
    "stent_p": 0.5,
    "stent_r": 1.4 / 3,
    "stent_f1": 1.4 / 2.9,
    "stent_bin_p": 0.5,
    "stent_bin_r": 2 / 3,
    "stent_bin_f1": 4 / 7,
    "stcoh_p": 0.275,
    "stcoh_r": 0.3,
}


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


# ------------------------------------------------------------ scoring functions


def test_ent_bin_ties_count_for_entailment():
    probs = np.array([
        (0.4, 0.4, 0.2),  # E == N, both top -> 1
        (0.5, 0.0, 0.5),  # E == C, both top -> 1
        (0.5, 0.25, 0.25),  # E top alone -> 1
        (0.3, 0.35, 0.35),  # N == C above E -> 0
        (0.25, 0.5, 0.25),  # N top -> 0
        (NAN, 0.5, 0.5),  # NaN in -> NaN out
    ])
    got = sl.score_ent_bin(probs)
    np.testing.assert_array_equal(got[:5], [1.0, 1.0, 1.0, 0.0, 0.0])
    assert math.isnan(got[5])


def test_coherence_is_e_minus_c_and_can_be_negative():
    np.testing.assert_allclose(sl.score_coh([(0.1, 0.2, 0.7), (0.6, 0.3, 0.1)]), [-0.6, 0.5])
    # n = 1, m = 2, every pair contradicts: coh = 0.1-0.7 = -0.6 and 0.2-0.7 = -0.5,
    # max = -0.5, so StCoh-P = -0.5.
    p = np.array([[(0.1, 0.2, 0.7), (0.2, 0.1, 0.7)]])
    assert _close(sl.stcoh_p(p), -0.5)
    # StEnt-P of the same: max(0.1, 0.2) = 0.2; StEnt-bin-P: neither E is top -> 0.
    assert _close(sl.stent_p(p), 0.2)
    assert sl.stent_bin_p(p) == 0.0


def test_score_functions_by_name_or_callable():
    assert _close(sl.statement_precision(P_GEN, "coh"), 0.275)
    assert _close(sl.statement_precision(P_GEN, lambda q: q[..., sl.NEU]), (0.4 + 0.35) / 2)
    with pytest.raises(ValueError, match="score function"):
        sl.statement_precision(P_GEN, "nope")


# -------------------------------------------------------- NLI, one example


def test_golden_example_each_registered_function():
    assert _close(sl.stent_p(P_GEN), GOLDEN["stent_p"])
    assert _close(sl.stent_r(P_REF), GOLDEN["stent_r"])
    assert _close(sl.stent_f1(P_GEN, P_REF), GOLDEN["stent_f1"])
    assert _close(sl.stent_bin_p(P_GEN), GOLDEN["stent_bin_p"])
    assert _close(sl.stent_bin_r(P_REF), GOLDEN["stent_bin_r"])
    assert _close(sl.stent_bin_f1(P_GEN, P_REF), GOLDEN["stent_bin_f1"])
    assert _close(sl.stcoh_p(P_GEN), GOLDEN["stcoh_p"])
    assert _close(sl.stcoh_r(P_REF), GOLDEN["stcoh_r"])


def test_golden_example_all_at_once_and_no_stcoh_f1():
    got = sl.statement_nli_metrics(P_GEN, P_REF)
    assert tuple(got) == sl.NLI_METRICS
    assert "stcoh_f1" not in got and not hasattr(sl, "stcoh_f1")
    for name, want in GOLDEN.items():
        assert _close(got[name], want), name


def test_precision_and_recall_read_their_own_direction():
    # Swapping the arrays must not give the same answer: recall uses P_REF only.
    assert _close(sl.statement_recall(P_REF, "ent"), 1.4 / 3)
    assert not _close(sl.statement_precision(P_REF, "ent"), sl.statement_precision(P_GEN, "ent"))


def test_f1_zeros_and_nan():
    assert sl.f1(0.0, 0.8) == 0.0  # 2*0*0.8 / 0.8 = 0
    assert sl.f1(0.0, 0.0) == 0.0  # p + r == 0 -> 0, not a division error
    assert _close(sl.f1(0.5, 0.5), 0.5)  # 2*0.25/1
    assert _close(sl.f1(1.0, 0.5), 2 / 3)  # 2*0.5/1.5
    assert math.isnan(sl.f1(NAN, 0.5)) and math.isnan(sl.f1(0.0, NAN))
    got = sl.f1(np.array([0.0, 0.0, 1.0, NAN]), np.array([0.0, 1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(got, [0.0, 0.0, 1.0, NAN])


@pytest.mark.parametrize(("n", "m"), [(0, 3), (2, 0), (0, 0)])
def test_empty_statement_sets_both_policies(n, m):
    pg, pr = np.zeros((n, m, 3)), np.zeros((m, n, 3))
    skipped = sl.statement_nli_metrics(pg, pr)
    assert all(math.isnan(v) for v in skipped.values())
    zeroed = sl.statement_nli_metrics(pg, pr, empty="zero")
    assert all(v == 0.0 for v in zeroed.values())
    assert math.isnan(sl.stent_f1(pg, pr)) and sl.stent_f1(pg, pr, empty="zero") == 0.0
    with pytest.raises(ValueError, match="empty policy"):
        sl.stent_p(pg, empty="drop")


def test_shape_checks():
    with pytest.raises(ValueError, match="3"):
        sl.stent_p(np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match="P_ref_given_gen"):
        sl.stent_f1(P_GEN, P_GEN)  # [2, 3, 3] is not [m, n, 3] = [3, 2, 3]
    with pytest.raises(ValueError):
        sl.max_mean(np.zeros(3))


# ------------------------------------------------- SummaC-ZS and AlignScore


def test_summac_zs_two_by_two_by_hand():
    probs = np.array([
        [(0.8, 0.1, 0.1), (0.3, 0.2, 0.5)],
        [(0.2, 0.2, 0.6), (0.4, 0.5, 0.1)],
    ])
    # e-c, as the summac package computes it: per row max E - max C.
    #      row 0: max(0.8, 0.3) - max(0.1, 0.5) = 0.3; row 1: max(0.2, 0.4) - max(0.6, 0.1) = -0.2
    #      (0.3 - 0.2) / 2 = 0.05  (max of E - C per row would give 0.5 instead)
    assert _close(sl.summac_zs(probs), 0.05)
    # e:   row 0 max(0.8, 0.3) = 0.8; row 1 max(0.2, 0.4) = 0.4 -> 0.6
    assert _close(sl.summac_zs(probs, zs_score="e"), 0.6)
    # At statement granularity with X = E, SummaC-ZS is StEnt-P (seed, after eq. 9).
    assert sl.summac_zs(P_GEN, zs_score="e") == sl.stent_p(P_GEN)
    with pytest.raises(ValueError, match="zs_score"):
        sl.summac_zs(probs, zs_score="c")


def test_alignscore_and_max_mean_by_hand():
    x = np.array([[0.9, 0.2], [0.1, 0.6]])
    # rows: max 0.9 and 0.6 -> (0.9 + 0.6) / 2 = 0.75
    assert _close(sl.alignscore(x), 0.75)
    assert _close(sl.max_mean(x), 0.75)
    assert math.isnan(sl.alignscore(np.zeros((0, 2))))
    assert sl.alignscore(np.zeros((2, 0)), empty="zero") == 0.0


# ------------------------------------------------------------- vectorised


def _random_examples(rng, count):
    gens, refs = [], []
    for _ in range(count):
        n, m = int(rng.integers(0, 6)), int(rng.integers(0, 6))
        gens.append(rng.dirichlet(np.ones(3), size=(n, m)).reshape(n, m, 3))
        refs.append(rng.dirichlet(np.ones(3), size=(m, n)).reshape(m, n, 3))
    return gens, refs


@pytest.mark.parametrize("empty", sl.EMPTY_POLICIES)
def test_batch_equals_per_example_on_random_ragged(empty):
    rng = np.random.default_rng(0)
    gens, refs = _random_examples(rng, 60)
    # Exact ties for ent_bin in a few pairs.
    gens[0] = np.array([[(0.4, 0.4, 0.2), (0.3, 0.35, 0.35)]])
    refs[0] = np.array([[(0.5, 0.0, 0.5)], [(0.2, 0.6, 0.2)]])
    flat_g, flat_r, n, m = sl.flatten_nli_pairs(gens, refs)
    got = sl.statement_nli_batch(flat_g, flat_r, n, m, empty=empty)
    assert tuple(got.values) == sl.NLI_METRICS
    for e, (g, r) in enumerate(zip(gens, refs, strict=True)):
        want = sl.statement_nli_metrics(g, r, empty=empty)
        for name in sl.NLI_METRICS:
            assert _close(float(got.values[name][e]), want[name]), (e, name)
    n_empty = int(((n == 0) | (m == 0)).sum())
    assert 0 < n_empty < len(n)
    assert got.counts == {
        "n_examples": 60,
        "n_empty_gen": int((n == 0).sum()),
        "n_empty_ref": int((m == 0).sum()),
        "n_empty": n_empty,
        "n_skipped": n_empty if empty == "skip" else 0,
    }
    assert int(np.isnan(got.values["stent_p"]).sum()) == got.counts["n_skipped"]


def test_pair_index_maps_flat_rows_to_statements():
    rng = np.random.default_rng(1)
    gens, refs = _random_examples(rng, 20)
    flat_g, flat_r, n, m = sl.flatten_nli_pairs(gens, refs)
    off = sl.pair_offsets(n, m)
    assert off[-1] == len(flat_g) == len(flat_r)
    ex, k, ell = sl.pair_index(n, m, "gen_given_ref")
    for i in range(len(flat_g)):
        np.testing.assert_array_equal(flat_g[i], gens[ex[i]][k[i], ell[i]])
    ex, k, ell = sl.pair_index(n, m, "ref_given_gen")
    for i in range(len(flat_r)):
        np.testing.assert_array_equal(flat_r[i], refs[ex[i]][ell[i], k[i]])
    # Layout by hand: example 0 with n=2, m=3 -> rows (k, l) = (0,0) (0,1) (0,2) (1,0) ...
    ex, k, ell = sl.pair_index([2, 0, 1], [3, 4, 1])
    np.testing.assert_array_equal(ex, [0, 0, 0, 0, 0, 0, 2])
    np.testing.assert_array_equal(k, [0, 0, 0, 1, 1, 1, 0])
    np.testing.assert_array_equal(ell, [0, 1, 2, 0, 1, 2, 0])
    ex, k, ell = sl.pair_index([2, 0, 1], [3, 4, 1], "ref_given_gen")  # (l, k) order
    np.testing.assert_array_equal(k, [0, 1, 0, 1, 0, 1, 0])
    np.testing.assert_array_equal(ell, [0, 0, 1, 1, 2, 2, 0])


def test_batch_golden_and_all_empty_and_bad_length():
    flat_g, flat_r, n, m = sl.flatten_nli_pairs(
        [np.zeros((0, 2, 3)), P_GEN], [np.zeros((2, 0, 3)), P_REF]
    )
    got = sl.statement_nli_batch(flat_g, flat_r, n, m)
    for name, want in GOLDEN.items():
        assert math.isnan(got.values[name][0])
        assert _close(float(got.values[name][1]), want), name
    only_empty = sl.statement_nli_batch(np.zeros((0, 3)), np.zeros((0, 3)), [0, 3], [2, 0])
    assert np.isnan(only_empty.values["stent_f1"]).all() and only_empty.counts["n_skipped"] == 2
    with pytest.raises(ValueError, match="sum"):
        sl.statement_nli_batch(flat_g[:-1], flat_r, n, m)


# ------------------------------------------------------------- registry


def test_registered_with_direction_kind_and_inputs():
    want_inputs = {
        "stent_p": ("nli_gen_given_ref",),
        "stent_bin_p": ("nli_gen_given_ref",),
        "stcoh_p": ("nli_gen_given_ref",),
        "stent_r": ("nli_ref_given_gen",),
        "stent_bin_r": ("nli_ref_given_gen",),
        "stcoh_r": ("nli_ref_given_gen",),
        "stent_f1": ("nli_gen_given_ref", "nli_ref_given_gen"),
        "stent_bin_f1": ("nli_gen_given_ref", "nli_ref_given_gen"),
        "st2exp_p": ("verifier_votes_gen",),
        "st2exp_r": ("verifier_votes_ref",),
        "st2exp_f1": ("verifier_votes_gen", "verifier_votes_ref"),
        "summac_zs": ("nli_sentence_pairs",),
        "alignscore": ("alignment_chunk_pairs",),
    }
    for name, inputs in want_inputs.items():
        info = get_metric(name)
        assert info.higher_is_better and info.kind == "per_example", name
        assert info.inputs == inputs and info.description, name
        assert getattr(sl if hasattr(sl, name) else st, name).metric_info == info
    with pytest.raises(KeyError):
        get_metric("stcoh_f1")
