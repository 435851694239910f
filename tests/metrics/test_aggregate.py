"""Aggregation of per-example scores: population std, NaN counting, bootstrap interval,
and the Table III–VI layout."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rexeval.metrics.aggregate import aggregate_scores, bootstrap_ci, format_results_table


def scores():
    return pd.DataFrame({
        "example_id": ["a", "b", "c", "d", "a", "b", "c", "d"],
        "system": ["gt"] * 4 + ["flip"] * 4,
        "metric": ["StEnt-P"] * 8,
        "value": [1.0, 0.5, 0.0, float("nan"), 0.2, 0.2, 0.2, 0.2],
    })


def test_mean_population_std_and_missing():
    agg = aggregate_scores(scores()).set_index("system")
    # gt: values 1, 0.5, 0 (d is NaN): mean 0.5; population var = (0.25 + 0 + 0.25) / 3.
    assert agg.loc["gt", "mean"] == pytest.approx(0.5)
    assert agg.loc["gt", "std"] == pytest.approx(math.sqrt(0.5 / 3))
    assert (agg.loc["gt", "n"], agg.loc["gt", "n_missing"]) == (3, 1)
    # A constant system: std 0 and a degenerate interval at the value.
    assert agg.loc["flip", "std"] == 0 and agg.loc["flip", "ci_low"] == agg.loc["flip", "ci_high"] == 0.2


def test_bootstrap_interval_brackets_the_mean_and_is_seeded():
    rng = np.random.default_rng(0)
    v = rng.normal(0.3, 0.1, 400)
    low, high = bootstrap_ci(v, seed=1)
    assert low < v.mean() < high
    # Normal approximation: half-width about 1.96 * sd / sqrt(n) = 0.0098.
    assert high - low == pytest.approx(2 * 1.96 * v.std(ddof=1) / 20, rel=0.2)
    assert bootstrap_ci(v, seed=1) == (low, high)
    assert all(math.isnan(x) for x in bootstrap_ci(np.array([0.5])))


def test_table_layout_marks_best_and_worst():
    agg = aggregate_scores(scores())
    text = format_results_table(agg, dataset="Toys", systems=["gt", "flip"])
    lines = text.splitlines()
    assert lines[0] == "| Dataset | Metric | gt | flip |"
    assert lines[2] == "| Toys | StEnt-P | **0.5000±0.4082** | *0.2000±0.0000* |"
    lower = format_results_table(agg, systems=["gt", "flip"], higher_is_better=lambda m: False)
    assert "**0.2000±0.0000**" in lower


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="value"):
        aggregate_scores(pd.DataFrame({"system": [], "metric": []}))


def test_no_resamples_means_no_interval_and_no_bootstrap_run():
    low, high = bootstrap_ci(np.array([0.1, 0.5, 0.9]), n_resamples=0)
    assert math.isnan(low) and math.isnan(high)
