"""Meta-evaluation metrics against scipy, sklearn, the krippendorff package and
hand-worked cases."""
from __future__ import annotations

import math
import warnings

import krippendorff
import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import cohen_kappa_score

from rexeval.metrics import agreement
from rexeval.metrics.agreement import (
    RESULT_COLUMNS,
    Target,
    apply_null_policy,
    cohen_kappa,
    correlation,
    group_correlations,
    krippendorff_alpha,
    level_bootstrap_ci,
    level_correlation,
    meta_evaluate,
    pairwise_agreement,
)

SCIPY = {"pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}


def likert(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two related 1-5 rating vectors with many ties."""
    rng = np.random.default_rng(seed)
    human = rng.integers(1, 6, n).astype(float)
    judge = np.clip(np.round(human + rng.normal(0, 1.5, n)), 1, 5)
    return judge, human


# ------------------------------------------------------------------ correlation


@pytest.mark.parametrize("method", ["pearson", "spearman", "kendall"])
def test_correlation_equals_scipy_with_tied_ratings(method):
    judge, human = likert(1, 60)
    assert correlation(judge, human, method) == pytest.approx(SCIPY[method](judge, human).statistic, abs=1e-12)


def test_kendall_is_tau_b_worked_by_hand():
    # x = 1 2 2 3, y = 1 1 2 3. Of the 6 pairs: 4 concordant, 0 discordant, one tied in
    # x only (2, 3), one tied in y only (1, 2). tau-b = (4 - 0) / sqrt((6 - 1) * (6 - 1)).
    assert correlation([1, 2, 2, 3], [1, 1, 2, 3], "kendall") == pytest.approx(0.8, abs=1e-12)
    # Spearman of average ranks x = 1 2.5 2.5 4, y = 1.5 1.5 3 4.
    expected = np.corrcoef([1, 2.5, 2.5, 4], [1.5, 1.5, 3, 4])[0, 1]
    assert correlation([1, 2, 2, 3], [1, 1, 2, 3], "spearman") == pytest.approx(expected, abs=1e-12)


def test_nan_and_none_pairs_are_dropped():
    x = [1.0, 2.0, None, 4.0, 5.0, float("nan")]
    y = [2.0, 1.0, 3.0, float("nan"), 5.0, 1.0]
    # Usable pairs: (1, 2), (2, 1), (5, 5).
    for method, fn in SCIPY.items():
        assert correlation(x, y, method) == pytest.approx(fn([1, 2, 5], [2, 1, 5]).statistic, abs=1e-12)


@pytest.mark.parametrize("x, y", [([], []), ([1.0], [2.0]), ([1.0, float("nan")], [2.0, 3.0]),
                                  ([3, 3, 3], [1, 2, 3]), ([1, 2, 3], [4, 4, 4])])
def test_undefined_correlation_is_nan_without_warnings(x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for method in SCIPY:
            assert math.isnan(correlation(x, y, method))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown correlation method"):
        correlation([1, 2], [1, 2], "cosine")
    with pytest.raises(ValueError, match="equal length"):
        correlation([1, 2, 3], [1, 2], "pearson")


# ------------------------------------------------------------------ levels


def three_users() -> pd.DataFrame:
    """u1: two items with two explanations each; u2: one item, three explanations;
    u3: human ratings constant (no correlation); plus a row with a NaN judge score."""
    return pd.DataFrame({
        "user_id": ["u1"] * 4 + ["u2"] * 3 + ["u3"] * 2 + ["u2"],
        "item_id": ["a", "a", "b", "b", "a", "a", "a", "a", "b", "a"],
        "judge": [1, 2, 3, 4, 5, 3, 1, 2, 4, float("nan")],
        "human": [2, 4, 5, 4, 1, 2, 3, 3, 3, 5],
    })


def test_user_and_pair_levels_worked_by_hand():
    df = three_users()
    # u1: x = 1 2 3 4, y = 2 4 5 4: sum dx*dy = 3.5, sum dx^2 = 5, sum dy^2 = 4.75.
    r_u1 = 3.5 / math.sqrt(5 * 4.75)
    r_u2 = -1.0  # x = 5 3 1 and y = 1 2 3 lie on a falling line (the NaN row is dropped)
    user = level_correlation(df, "judge", "human", "user", "pearson")
    assert user.value == pytest.approx((r_u1 + r_u2) / 2, abs=1e-12)
    assert (user.n_groups_used, user.n_groups_total, user.n_rows) == (2, 3, 9)
    # Pairs: (u1, a): +1, (u1, b): -1, (u2, a): -1; (u3, a) and (u3, b) have one row each.
    pair = level_correlation(df, "judge", "human", "pair", "pearson")
    assert pair.value == pytest.approx(-1 / 3, abs=1e-12)
    assert (pair.n_groups_used, pair.n_groups_total) == (3, 5)


def test_user_level_equals_numpy_per_group_mean():
    df = three_users()
    ok = df.dropna()
    per_user = [np.corrcoef(g["judge"], g["human"])[0, 1] for u, g in ok.groupby("user_id") if u != "u3"]
    assert level_correlation(df, "judge", "human", "user").value == pytest.approx(np.mean(per_user), abs=1e-12)


def test_spearman_and_kendall_user_level_by_hand():
    df = three_users()
    # u1 ranks: x = 1 2 3 4, y = 1 2.5 4 2.5. Kendall: 4 concordant, 1 discordant, one pair
    # tied in y only: tau-b = 3 / sqrt(6 * 5). u2 is -1 for both.
    rho_u1 = np.corrcoef([1, 2, 3, 4], [1, 2.5, 4, 2.5])[0, 1]
    tau_u1 = 3 / math.sqrt(30)
    assert level_correlation(df, "judge", "human", "user", "spearman").value == pytest.approx((rho_u1 - 1) / 2)
    assert level_correlation(df, "judge", "human", "user", "kendall").value == pytest.approx((tau_u1 - 1) / 2)


def test_dataset_level_is_one_correlation_over_all_rows():
    df = three_users()
    ok = df.dropna()
    for method, fn in SCIPY.items():
        res = level_correlation(df, "judge", "human", "dataset", method)
        assert res.value == pytest.approx(fn(ok["judge"], ok["human"]).statistic, abs=1e-12)
        assert (res.n_groups_used, res.n_groups_total, res.n_rows) == (1, 1, 9)


def test_all_groups_undefined_gives_nan_and_counts():
    df = pd.DataFrame({"user_id": ["u1", "u1", "u2"], "item_id": ["a", "b", "a"],
                       "judge": [1, 2, 3], "human": [4, 4, 4]})
    for level in ("dataset", "user", "pair"):
        res = level_correlation(df, "judge", "human", level)
        assert math.isnan(res.value) and res.n_groups_used == 0
    assert level_correlation(df, "judge", "human", "pair").n_groups_total == 3
    with pytest.raises(ValueError, match="unknown level"):
        level_correlation(df, "judge", "human", "item")


@pytest.mark.parametrize("method", ["pearson", "spearman", "kendall"])
@pytest.mark.parametrize("table_limit", [64, 2])  # Kendall: contingency tables, then scipy per group
def test_group_correlations_equal_scipy_per_group(method, table_limit, monkeypatch):
    monkeypatch.setattr(agreement, "MAX_TABLE_VALUES", table_limit)
    rng = np.random.default_rng(8)
    n = 150
    df = pd.DataFrame({"user_id": rng.integers(0, 9, n).astype(str), "item_id": rng.integers(0, 6, n).astype(str),
                       "judge": rng.integers(1, 4, n).astype(float), "human": rng.integers(1, 4, n).astype(float)})
    df.loc[rng.random(n) < 0.1, "judge"] = np.nan
    df.loc[df["user_id"] == "0", "human"] = 2.0  # a constant user
    for by in (["user_id"], ["user_id", "item_id"]):
        got = group_correlations(df, "judge", "human", by, method)
        expected = {}
        for key, g in df.groupby(by[0] if len(by) == 1 else by):
            g = g.dropna()
            ok = len(g) >= 2 and g["judge"].nunique() > 1 and g["human"].nunique() > 1
            expected[key] = SCIPY[method](g["judge"], g["human"]).statistic if ok else np.nan
        assert list(got.index) == list(expected)
        np.testing.assert_allclose(got.to_numpy(), list(expected.values()), atol=1e-12, rtol=0)
        assert got.isna().sum() > 0 and got.notna().sum() > 0


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_grouped_and_resampled_pearson_hold_at_extreme_magnitudes(scale):
    """Near 1e200 the centred products overflow and near 1e-200 they underflow (the user
    level gave 0.0 or NaN where scipy gives about 0.4); r does not depend on the scale,
    so every group must still equal scipy.stats.pearsonr of that group."""
    rng = np.random.default_rng(21)
    n = 120
    judge = rng.normal(3.0, 1.0, n)
    human = 0.4 * judge + rng.normal(0.0, 1.0, n) + 3.0
    df = pd.DataFrame({"user_id": rng.integers(0, 6, n).astype(str), "item_id": rng.integers(0, 3, n).astype(str),
                       "judge": judge * scale, "human": human * scale})
    for by in (["user_id"], ["user_id", "item_id"]):
        got = group_correlations(df, "judge", "human", by, "pearson")
        expected = [stats.pearsonr(g["judge"], g["human"]).statistic
                    for _, g in df.groupby(by[0] if len(by) == 1 else by)]
        assert np.isfinite(got.to_numpy()).all()
        np.testing.assert_allclose(got.to_numpy(), expected, atol=1e-12, rtol=0)
    user = level_correlation(df, "judge", "human", "user").value
    assert user == pytest.approx(np.mean([stats.pearsonr(g["judge"], g["human"]).statistic
                                          for _, g in df.groupby("user_id")]), abs=1e-12)
    # The dataset level's bootstrap computes every resample's r at once in the same way.
    x, y = df["judge"].to_numpy(), df["human"].to_numpy()
    idx = np.random.default_rng(4).integers(0, n, size=(50, n))
    expected_ci = percentile_ci([stats.pearsonr(x[i], y[i]).statistic for i in idx])
    got_ci = level_bootstrap_ci(df, "judge", "human", "dataset", "pearson", n_resamples=50, seed=4)
    assert got_ci == pytest.approx(expected_ci, abs=1e-9)


# ------------------------------------------------------------------ bootstrap


def big_frame(seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed + 100)  # not likert's stream, or users would follow ratings
    n = 240
    judge, human = likert(seed, n)
    return pd.DataFrame({"user_id": rng.integers(0, 12, n).astype(str),
                         "item_id": rng.integers(0, 4, n).astype(str), "judge": judge, "human": human})


def percentile_ci(values, confidence=0.95):
    values = np.asarray([v for v in values if np.isfinite(v)])
    return tuple(np.percentile(values, [100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2]))


@pytest.mark.parametrize("method", ["pearson", "spearman", "kendall"])
@pytest.mark.parametrize("continuous", [False, True])  # Kendall: contingency tables, then the scipy loop
def test_dataset_bootstrap_equals_a_plain_scipy_loop(method, continuous):
    df = big_frame()
    if continuous:
        df["judge"] = df["judge"] + np.random.default_rng(9).random(len(df))
    x, y = df["judge"].to_numpy(), df["human"].to_numpy()
    idx = np.random.default_rng(7).integers(0, len(x), size=(200, len(x)))
    expected = percentile_ci([SCIPY[method](x[i], y[i]).statistic for i in idx])
    got = level_bootstrap_ci(df, "judge", "human", "dataset", method, n_resamples=200, seed=7)
    assert got == pytest.approx(expected, abs=1e-9)


def test_user_and_pair_bootstrap_resample_users():
    df = big_frame()
    users = sorted(df["user_id"].unique())
    per_user = {u: np.corrcoef(g["judge"], g["human"])[0, 1] for u, g in df.groupby("user_id")}
    per_pair = {}
    for (u, _), g in df.groupby(["user_id", "item_id"]):
        if len(g) >= 2 and g["judge"].nunique() > 1 and g["human"].nunique() > 1:
            per_pair.setdefault(u, []).append(np.corrcoef(g["judge"], g["human"])[0, 1])
    idx = np.random.default_rng(5).integers(0, len(users), size=(300, len(users)))
    user_draws = [np.mean([per_user[users[k]] for k in row]) for row in idx]
    pair_draws = [np.mean([r for k in row for r in per_pair.get(users[k], [])]) for row in idx]
    got_user = level_bootstrap_ci(df, "judge", "human", "user", n_resamples=300, seed=5)
    got_pair = level_bootstrap_ci(df, "judge", "human", "pair", n_resamples=300, seed=5)
    assert got_user == pytest.approx(percentile_ci(user_draws), abs=1e-9)
    assert got_pair == pytest.approx(percentile_ci(pair_draws), abs=1e-9)
    point = level_correlation(df, "judge", "human", "user").value
    assert got_user[0] < point < got_user[1]


def test_bootstrap_is_seeded_and_nan_when_too_small():
    df = big_frame()
    a = level_bootstrap_ci(df, "judge", "human", "user", seed=1, n_resamples=100)
    assert a == level_bootstrap_ci(df, "judge", "human", "user", seed=1, n_resamples=100)
    assert a != level_bootstrap_ci(df, "judge", "human", "user", seed=2, n_resamples=100)
    one_user = df.assign(user_id="u")
    assert all(math.isnan(v) for v in level_bootstrap_ci(one_user, "judge", "human", "user"))
    assert all(math.isnan(v) for v in level_bootstrap_ci(df, "judge", "human", "user", n_resamples=0))


def test_meta_evaluate_is_tidy_and_matches_the_levels():
    df = three_users().assign(judge2=lambda d: -d["judge"])
    targets = [Target("gpt", "persuasiveness", "judge", "human"), Target("neg", "persuasiveness", "judge2", "human")]
    out = meta_evaluate(df, targets, n_resamples=50)
    assert list(out.columns) == list(RESULT_COLUMNS) and len(out) == 2 * 3 * 3
    row = out[(out.evaluator == "gpt") & (out.level == "pair") & (out.method == "pearson")].iloc[0]
    assert row["value"] == pytest.approx(-1 / 3) and (row["n_groups_used"], row["n_groups_total"]) == (3, 5)
    neg = out[(out.evaluator == "neg") & (out.level == "user") & (out.method == "kendall")].iloc[0]
    pos = out[(out.evaluator == "gpt") & (out.level == "user") & (out.method == "kendall")].iloc[0]
    assert neg["value"] == pytest.approx(-pos["value"])


# ------------------------------------------------------------------ null policy


def test_null_policy_fills_by_default_as_seed_001_does():
    res = apply_null_policy([None, 4, float("nan"), 2], [1, None, float("nan"), 3])
    assert res.human.tolist() == [3, 4, 3, 2] and res.judge.tolist() == [1, 0, 0, 3]
    assert (res.human_filled, res.judge_filled, res.dropped) == (2, 2, 0)
    assert res.keep.tolist() == [True] * 4


def test_null_policy_none_drops_and_values_are_configurable():
    res = apply_null_policy([None, 4, float("nan"), 2], [1, None, float("nan"), 3], human_null=None)
    assert res.keep.tolist() == [False, True, False, True]
    assert res.human.tolist() == [4, 2] and res.judge.tolist() == [0, 3]
    assert (res.human_filled, res.judge_filled, res.dropped) == (0, 1, 2)
    res = apply_null_policy([None, 4, float("nan"), 2], [1, None, float("nan"), 3], None, None)
    assert res.human.tolist() == [2] and res.dropped == 3
    res = apply_null_policy([None, 4], [1, None], human_null=2.5, judge_null=-1)
    assert res.human.tolist() == [2.5, 4] and res.judge.tolist() == [1, -1]


# ------------------------------------------------------------------ pairwise


HUMAN = ["A", "A", "B", "B", "C", "C", "A", "B"]
JUDGE = ["A", "B", "B", "B", "C", "A", "A", "A"]
CODE = {"A": 0, "B": 1, "C": 2}


def package_alpha(judge, human):
    data = np.array([[CODE[v] for v in judge], [CODE[v] for v in human]], dtype=float)
    return krippendorff.alpha(reliability_data=data, level_of_measurement="nominal")


def test_pairwise_with_ties_by_hand_and_against_the_packages():
    res = pairwise_agreement(JUDGE, HUMAN, ties=True, n_resamples=0)
    assert (res.n_used, res.n_total, res.n_missing, res.n_tie_dropped) == (8, 8, 0, 0)
    assert res.accuracy == 5 / 8
    # Human marginals A 3, B 3, C 2; judge A 4, B 3, C 1: p_e = 23/64, p_o = 40/64.
    assert res.kappa == pytest.approx(17 / 41, abs=1e-12)
    assert res.kappa == pytest.approx(cohen_kappa_score(HUMAN, JUDGE), abs=1e-12)
    assert res.alpha == pytest.approx(package_alpha(JUDGE, HUMAN), abs=1e-12)
    assert math.isnan(res.accuracy_ci[0])  # no resamples asked for


def test_pairwise_without_ties_drops_items_where_either_side_is_a_tie():
    res = pairwise_agreement(JUDGE, HUMAN, ties=False, n_resamples=0)
    # Items 5 (C, C) and 6 (human C) go; 6 left: human A A B B A B, judge A B B B A A.
    assert (res.n_used, res.n_tie_dropped) == (6, 2)
    assert res.accuracy == pytest.approx(4 / 6)
    assert res.kappa == pytest.approx(1 / 3, abs=1e-12)  # p_o = 2/3, p_e = 1/2
    # Coincidences: o_AA = 4, o_BB = 4, o_AB = o_BA = 2; n_A = n_B = 6, n = 12:
    # alpha = 1 - (n - 1) * (o_AB + o_BA) / (n_A * n_B + n_B * n_A) = 1 - 44 / 72.
    assert res.alpha == pytest.approx(28 / 72, abs=1e-12)
    kept = [(j, h) for j, h in zip(JUDGE, HUMAN) if "C" not in (j, h)]
    assert res.alpha == pytest.approx(package_alpha(*zip(*kept)), abs=1e-12)
    # A judge tie on a human preference is dropped too (not only human ties).
    res = pairwise_agreement(["C", "A", "B"], ["A", "A", "B"], ties=False, n_resamples=0)
    assert (res.n_used, res.n_tie_dropped, res.accuracy) == (2, 1, 1.0)


def test_pairwise_degenerate_cases_are_nan_not_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = pairwise_agreement(["A"] * 4, ["A"] * 4, n_resamples=50)
        assert same.accuracy == 1.0 and math.isnan(same.kappa) and math.isnan(same.alpha)
        assert math.isnan(cohen_kappa(["B"], ["B"])) and math.isnan(krippendorff_alpha([], []))
        opposite = pairwise_agreement(["A"] * 3, ["B"] * 3, n_resamples=0)
        assert opposite.kappa == cohen_kappa_score(["B"] * 3, ["A"] * 3) == 0.0
        assert opposite.alpha == pytest.approx(package_alpha(["A"] * 3, ["B"] * 3), abs=1e-12)
        ties = pairwise_agreement(["C", "C"], ["C", "A"], ties=False)
        assert ties.n_used == 0 and math.isnan(ties.accuracy) and math.isnan(ties.kappa)


def test_pairwise_missing_labels_are_counted_and_bad_labels_raise():
    res = pairwise_agreement(["A", None, "B", "A"], ["A", "B", float("nan"), "B"], n_resamples=0)
    assert (res.n_used, res.n_missing, res.n_total, res.accuracy) == (2, 2, 4, 0.5)
    with pytest.raises(ValueError, match="judge label at position 1"):
        pairwise_agreement(["A", "tie"], ["A", "B"])
    with pytest.raises(ValueError, match="equal length"):
        pairwise_agreement(["A"], ["A", "B"])


@pytest.mark.parametrize("ties", [True, False])
def test_pairwise_bootstrap_equals_a_loop_over_sklearn_and_krippendorff(ties):
    rng = np.random.default_rng(11)
    human = list(rng.choice(["A", "B", "C"], 40))
    judge = [h if rng.random() < 0.6 else rng.choice(["A", "B", "C"]) for h in human]
    res = pairwise_agreement(judge, human, ties=ties, n_resamples=150, seed=4)
    kept = [(j, h) for j, h in zip(judge, human) if ties or "C" not in (j, h)]
    j = np.array([a for a, _ in kept])
    h = np.array([b for _, b in kept])
    idx = np.random.default_rng(4).integers(0, len(kept), size=(150, len(kept)))
    acc = [np.mean(j[i] == h[i]) for i in idx]
    kap = [cohen_kappa_score(h[i], j[i]) if len(set(j[i]) | set(h[i])) > 1 else np.nan for i in idx]
    alp = [package_alpha(j[i], h[i]) if len(set(j[i]) | set(h[i])) > 1 else np.nan for i in idx]
    assert res.accuracy_ci == pytest.approx(percentile_ci(acc), abs=1e-12)
    assert res.kappa_ci == pytest.approx(percentile_ci(kap), abs=1e-9)
    assert res.alpha_ci == pytest.approx(percentile_ci(alp), abs=1e-9)
    assert res.accuracy_ci[0] <= res.accuracy <= res.accuracy_ci[1]
