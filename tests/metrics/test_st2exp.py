"""St2Exp (seed 000, eq. 6-8): hand-computed values, the unparseable and empty-set
policies, and the vectorised path against the per-example one."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rexeval.metrics import st2exp as st
from rexeval.metrics import statement_level as sl
from tests.metrics.test_statement_level import NAN, _close

# ------------------------------------------------------------- St2Exp


def test_st2exp_unparseable_both_policies():
    gen = [1, None, 0, 1]
    # zero: None counts as unsupported -> (1 + 0 + 0 + 1) / 4 = 0.5
    assert st.st2exp_p(gen) == (0.5, 1)
    # skip: None leaves the denominator -> (1 + 0 + 1) / 3 = 2/3
    v, bad = st.st2exp_p(gen, unparseable="skip")
    assert _close(v, 2 / 3) and bad == 1

    ref = [None, NAN]  # two unparseable answers
    assert st.st2exp_r(ref) == (0.0, 2)  # zero: 0 / 2
    v, bad = st.st2exp_r(ref, unparseable="skip")  # nothing left to average
    assert math.isnan(v) and bad == 2
    assert st.st2exp_r(ref, unparseable="skip", empty="zero") == (0.0, 2)

    # F1, zero: p = 0.5, r = 0 -> 0; unparseable 1 + 2 = 3
    assert st.st2exp_f1(gen, ref) == (0.0, 3)
    # F1, skip: p = 2/3, r = NaN -> NaN
    v, bad = st.st2exp_f1(gen, ref, unparseable="skip")
    assert math.isnan(v) and bad == 3


def test_st2exp_clean_votes_and_f1():
    # p = 2/3, r = 1/2 -> 2 * (1/3) / (7/6) = 4/7
    assert _close(st.st2exp_f1([1, 1, 0], [True, False]).value, 4 / 7)
    assert st.st2exp_p(np.array([1, 0, 1, 1])) == (0.75, 0)


def test_st2exp_empty_both_policies():
    v, bad = st.st2exp_p([])
    assert math.isnan(v) and bad == 0
    assert st.st2exp_p([], empty="zero") == (0.0, 0)
    # Recall is defined even with no generated statements (votes are against e' text).
    assert st.st2exp_r([1, 0]).value == 0.5
    assert math.isnan(st.st2exp_f1([], [1, 0]).value)
    assert st.st2exp_f1([], [1, 0], empty="zero").value == 0.0


def test_st2exp_rejects_bad_votes_and_policies():
    with pytest.raises(ValueError):
        st.st2exp_p([1, 2])
    with pytest.raises(TypeError):
        st.st2exp_p(["1"])
    with pytest.raises(ValueError, match="unparseable"):
        st.st2exp_p([1], unparseable="one")


@pytest.mark.parametrize("unparseable", st.UNPARSEABLE_POLICIES)
@pytest.mark.parametrize("empty", sl.EMPTY_POLICIES)
def test_st2exp_batch_equals_per_example(unparseable, empty):
    rng = np.random.default_rng(2)
    choices = [0, 1, None]
    gens = [list(rng.choice(choices, size=int(rng.integers(0, 6)))) for _ in range(50)]
    refs = [list(rng.choice(choices, size=int(rng.integers(0, 6)))) for _ in range(50)]
    refs[0] = [None, None]  # nothing left under "skip"
    flat_g, n = st.flatten_votes(gens)
    flat_r, m = st.flatten_votes(refs)
    # "each": every side on its own, as the single-example functions
    got = st.st2exp_batch(flat_g, n, flat_r, m, unparseable=unparseable, empty=empty, population="each")
    kw = {"unparseable": unparseable, "empty": empty}
    for e in range(50):
        want = {
            "st2exp_p": st.st2exp_p(gens[e], **kw).value,
            "st2exp_r": st.st2exp_r(refs[e], **kw).value,
            "st2exp_f1": st.st2exp_f1(gens[e], refs[e], **kw).value,
        }
        for name, w in want.items():
            assert _close(float(got.values[name][e]), w), (e, name)
    assert got.counts["n_unparseable_gen"] == sum(st.st2exp_p(g).n_unparseable for g in gens)
    assert got.counts["n_unparseable_ref"] == sum(st.st2exp_r(r).n_unparseable for r in refs)
    n_nan_f1 = int(np.isnan(got.values["st2exp_f1"]).sum())
    assert got.counts["n_skipped"] == n_nan_f1
    assert (n_nan_f1 > 0) == (empty == "skip")


def test_st2exp_batch_by_hand_counts():
    # e0: gen [1, NaN], ref [1]; e1: gen [], ref [NaN, 0]
    got = st.st2exp_batch([1, NAN], [2, 0], [1, NAN, 0], [1, 2], unparseable="skip", population="each")
    # e0: p = 1/1, r = 1/1 -> F1 1; e1: p has no statements -> NaN, r = 0/1 = 0
    np.testing.assert_array_equal(got.values["st2exp_p"], [1.0, NAN])
    np.testing.assert_array_equal(got.values["st2exp_r"], [1.0, 0.0])
    np.testing.assert_array_equal(got.values["st2exp_f1"], [1.0, NAN])
    assert got.counts == {
        "n_examples": 2, "n_empty_gen": 1, "n_empty_ref": 0,
        "n_unparseable_gen": 1, "n_unparseable_ref": 1,
        "n_undefined_p": 1, "n_undefined_r": 0, "n_skipped": 1, "n_one_side_empty": 1,
    }


# A planted system of four examples (votes: 1 supported, 0 not):
#   e0: generated [1, 0, 1], reference [1, 0]        P 2/3, R 1/2, F1 4/7
#   e1: generated [1, 1],    reference []            P 1,   R -
#   e2: generated [],        reference [1, 0, 0, 0]  P -,   R 1/4
#   e3: generated [0, 1],    reference [1, 1, 1, 1]  P 1/2, R 1,   F1 2/3
_PLANTED = ([1, 0, 1, 1, 1, 0, 1], [3, 2, 0, 2], [1, 0, 1, 0, 0, 0, 1, 1, 1, 1], [2, 0, 4, 4])


def test_the_seeds_population_keeps_examples_with_statements_on_both_sides():
    got = st.st2exp_batch(*_PLANTED)  # default: seed 000's population, e0 and e3 only
    np.testing.assert_array_equal(np.isnan(got.values["st2exp_p"]), [False, True, True, False])
    np.testing.assert_array_equal(np.isnan(got.values["st2exp_r"]), [False, True, True, False])
    # By hand: P (2/3 + 1/2) / 2 = 7/12; R (1/2 + 1) / 2 = 3/4; F1 (4/7 + 2/3) / 2 = 13/21
    assert _close(np.nanmean(got.values["st2exp_p"]), 7 / 12)
    assert _close(np.nanmean(got.values["st2exp_r"]), 3 / 4)
    assert _close(np.nanmean(got.values["st2exp_f1"]), 13 / 21)
    assert got.counts["n_one_side_empty"] == 2 and got.counts["n_undefined_p"] == 2
    assert got.counts["n_skipped"] == 2


def test_each_sides_own_population_gives_the_old_means():
    got = st.st2exp_batch(*_PLANTED, population="each")
    # By hand: P over e0, e1, e3 = (2/3 + 1 + 1/2) / 3 = 13/18; R over e0, e2, e3 = (1/2 + 1/4 + 1) / 3 = 7/12
    assert _close(np.nanmean(got.values["st2exp_p"]), 13 / 18)
    assert _close(np.nanmean(got.values["st2exp_r"]), 7 / 12)
    assert _close(np.nanmean(got.values["st2exp_f1"]), 13 / 21)  # F1 needs both sides either way


def test_under_zero_the_seeds_population_scores_a_one_sided_example_0():
    got = st.st2exp_batch(*_PLANTED, empty="zero")
    np.testing.assert_array_equal(got.values["st2exp_p"][1:3], [0.0, 0.0])
    np.testing.assert_array_equal(got.values["st2exp_r"][1:3], [0.0, 0.0])
    with pytest.raises(ValueError, match="population"):
        st.st2exp_batch(*_PLANTED, population="all")
