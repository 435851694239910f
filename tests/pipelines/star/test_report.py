"""Table 1 from results folders: gains against the best popularity baseline, stars from
the paired t-test, effect sizes, and the Markdown layout."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from rexeval.pipelines.star.report import (
    effect_details,
    format_table1,
    plot_sensitivity,
    table1,
)


def write(run, method, values_by_level, runs=None):
    """results/<method>/per_interaction.parquet; `runs` (seed -> values at global level)
    writes it as `star train --seeds N` does: every run's rows, with a `run` column."""
    folder = run / "results" / method
    folder.mkdir(parents=True)
    parts = [(level, vals, None) for level, vals in values_by_level.items()]
    parts += [("global", vals, seed) for seed, vals in (runs or {}).items()]
    tables = []
    for level, vals, seed in parts:
        n = len(vals)
        cols = {"method": [method] * n, "level": [level] * n, "interaction": np.arange(n),
                "review_id": [str(i) for i in range(n)], "precision@10": vals, "recall@10": vals, "ndcg@10": vals}
        tables.append(pa.table(cols if seed is None else {**cols, "run": [seed] * n}))
    pq.write_table(pa.concat_tables(tables), folder / "per_interaction.parquet")


@pytest.fixture
def run(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, 200)
    write(tmp_path, "RANDOM", {"global": base * 0.1, "item": base * 0.3})
    write(tmp_path, "USERPOP", {"global": base * 0.2, "item": base * 0.8})
    write(tmp_path, "ITEMPOP", {"global": base * 0.5, "item": base * 0.2})
    write(tmp_path, "GLOBALPOP", {"global": base * 0.4, "item": base * 0.5})
    noise = rng.normal(0, 0.01, 200)
    write(tmp_path, "EXPGCN", {"global": base * 0.5 + 0.05 + noise, "item": base * 0.8 + noise})
    return tmp_path


def test_gain_is_against_the_best_popularity_baseline_per_level(run):
    df = table1({"Toy": run})
    row = df[(df.method == "EXPGCN") & (df.level == "global") & (df.metric == "ndcg@10")].iloc[0]
    assert row["baseline"] == "ITEMPOP"
    g = pq.read_table(run / "results" / "EXPGCN" / "per_interaction.parquet").to_pandas()
    i = pq.read_table(run / "results" / "ITEMPOP" / "per_interaction.parquet").to_pandas()
    a = g[g.level == "global"]["ndcg@10"].to_numpy()
    b = i[i.level == "global"]["ndcg@10"].to_numpy()
    assert row["gain"] == pytest.approx(a.mean() - b.mean())
    assert row["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert row["stars"] == "***"
    item = df[(df.method == "EXPGCN") & (df.level == "item") & (df.metric == "ndcg@10")].iloc[0]
    assert item["baseline"] == "USERPOP"  # at item level the user's habits are the best baseline
    assert abs(item["gain"]) < 0.01
    assert df[(df.method == "ITEMPOP") & (df.level == "global")]["best_popularity"].all()
    assert "gain" not in df.columns or df[df.method == "RANDOM"]["gain"].isna().all()


def test_markdown_layout(run):
    text = format_table1(table1({"Toy": run}))
    lines = text.splitlines()
    assert lines[0] == ("| Method | global P@10 | global R@10 | global N@10 | item P@10 | item R@10 | "
                        "item N@10 |")
    assert lines[2].startswith("| **Toy** |")
    methods = [ln.split("|")[1].strip() for ln in lines[3:] if ln.startswith("| ")]
    assert methods == ["RANDOM", "USERPOP", "ITEMPOP", "GLOBALPOP", "EXPGCN", "Gain"]
    expgcn = next(ln for ln in lines if ln.startswith("| EXPGCN"))
    assert "***" in expgcn and "**" in expgcn  # stars, and bold for the best global values
    itempop = next(ln for ln in lines if ln.startswith("| ITEMPOP"))
    assert "<u>" in itempop  # best popularity baseline at global level
    details = effect_details(table1({"Toy": run}))
    assert set(details["method"]) == {"EXPGCN"}
    assert details["cohens_d"].notna().all() and details["cliffs_delta"].between(-1, 1).all()


def test_missing_results_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="star baselines"):
        table1({"x": tmp_path})


def test_sensitivity_plot_and_csv(tmp_path):
    rows = [{"mu": m, "global_ndcg": 0.1 * m, "item_ndcg": 0.2, "global_precision": 0.1, "item_precision": 0.1,
             "global_recall": 0.1, "item_recall": 0.1} for m in (0.0, 0.5, 1.0)]
    png, csv = plot_sensitivity(rows, "mu", "BPER+", tmp_path / "sens")
    assert png.stat().st_size > 1000
    assert csv.read_text().splitlines()[0].startswith("mu,")


# -- several runs (star train --seeds N) -----------------------------------------------------

USERPOP_G = [0.1, 0.2, 0.0, 0.3]  # mean 0.15: the best popularity baseline
ITEMPOP_G = [0.0, 0.1, 0.0, 0.1]  # mean 0.05
EXPGCN_RUNS = {0: [0.2, 0.3, 0.1, 0.4],  # mean 0.25
               1: [0.1, 0.3, 0.0, 0.4],  # mean 0.20
               2: [0.3, 0.2, 0.1, 0.6]}  # mean 0.30


def write_runs(run, method, runs_values):
    """results/<method>/ as `star train --seeds N` writes it: every run's rows, a `run` column."""
    write(run, method, {}, runs=runs_values)


@pytest.fixture
def runs3(tmp_path):
    folder = tmp_path / "runs3"
    write(folder, "USERPOP", {"global": USERPOP_G})
    write(folder, "ITEMPOP", {"global": ITEMPOP_G})
    write_runs(folder, "EXPGCN", EXPGCN_RUNS)
    return folder


def test_three_runs_mean_spread_and_pooled_ttest(runs3):
    df = table1({"Toy": runs3}, levels=["global"])
    row = df[(df.method == "EXPGCN") & (df.metric == "ndcg@10")].iloc[0]
    # Run means 0.25, 0.20, 0.30: mean 0.25; deviations 0, -0.05, +0.05, so the sample
    # variance is (0.0025 + 0.0025) / 2 = 0.0025 and the std 0.05; min 0.20, max 0.30.
    assert row["value"] == pytest.approx(0.25)
    assert row["std"] == pytest.approx(0.05)
    assert (row["min"], row["max"], row["runs"]) == (pytest.approx(0.20), pytest.approx(0.30), 3)
    assert row["baseline"] == "USERPOP" and row["gain"] == pytest.approx(0.10)
    # Pooled pairs: each run's 4 values against USERPOP's same 4 values (12 pairs). The
    # differences 0.1,0.1,0.1,0.1 | 0,0.1,0,0.1 | 0.2,0,0.1,0.3 have mean 0.1 and sum of
    # squared deviations 0.08, so sd = sqrt(0.08 / 11) = 0.08528, t = 0.1 / (sd / sqrt(12))
    # = 4.062 with 11 df: p ~ 0.0019, "**".
    pooled = np.array([0.2, 0.3, 0.1, 0.4, 0.1, 0.3, 0.0, 0.4, 0.3, 0.2, 0.1, 0.6])
    baseline = np.array(USERPOP_G * 3)
    ref = stats.ttest_rel(pooled, baseline)
    assert ref.statistic == pytest.approx(4.062, abs=1e-3)
    assert row["p"] == pytest.approx(ref.pvalue) and row["stars"] == "**"
    assert row["pairs"] == 12 and row["n"] == 4
    assert list(df.columns[df.columns.get_loc("value"):][:5]) == ["value", "std", "min", "max", "runs"]
    details = effect_details(df)
    assert {"std", "min", "max", "runs"} <= set(details.columns) and set(details["method"]) == {"EXPGCN"}

    text = format_table1(df, levels=["global"])
    expgcn = next(ln for ln in text.splitlines() if ln.startswith("| EXPGCN"))
    assert expgcn == "| EXPGCN | **0.25000**** ± 0.05000 | **0.25000**** ± 0.05000 | **0.25000**** ± 0.05000 |"
    gain = next(ln for ln in text.splitlines() if ln.startswith("| Gain"))
    assert gain == "| Gain | +0.10000 | +0.10000 | +0.10000 |"
    assert "sample standard deviation over 3 runs" in text


def test_one_run_methods_look_as_before(runs3, run):
    df = table1({"Toy": runs3}, levels=["global"])
    userpop = df[(df.method == "USERPOP") & (df.metric == "ndcg@10")].iloc[0]
    assert userpop["value"] == pytest.approx(0.15) and np.isnan(userpop["runs"]) and np.isnan(userpop["std"])
    text = format_table1(df, levels=["global"])
    assert next(ln for ln in text.splitlines() if ln.startswith("| USERPOP")) == (
        "| USERPOP | <u>0.15000</u> | <u>0.15000</u> | <u>0.15000</u> |")
    # A table of one-run methods only keeps exactly the columns and text of before.
    only = table1({"Toy": run})
    assert list(only.columns) == ["dataset", "method", "level", "metric", "value", "n", "best_popularity", "best",
                                  "baseline", "gain", "p", "stars", "cohens_d", "cliffs_delta", "pairs"]
    assert "±" not in format_table1(only) and "runs" not in format_table1(only)


def test_mean_over_runs_and_error_bars(tmp_path):
    from rexeval.pipelines.star.report import mean_over_runs

    rows = [{"mu": mu, "run": seed, "global_ndcg": v}
            for mu, vals in ((0.0, (0.1, 0.2, 0.3)), (1.0, (0.4, 0.4, 0.7))) for seed, v in enumerate(vals)]
    out = mean_over_runs(rows, ["mu"])
    # mu=0: mean 0.2, std sqrt((0.01 + 0 + 0.01) / 2) = 0.1; mu=1: mean 0.5, deviations
    # -0.1, -0.1, 0.2: std sqrt(0.06 / 2) = 0.17321.
    assert [r["mu"] for r in out] == [0.0, 1.0] and [r["runs"] for r in out] == [3, 3]
    assert [r["global_ndcg"] for r in out] == [pytest.approx(0.2), pytest.approx(0.5)]
    assert [r["global_ndcg_std"] for r in out] == [pytest.approx(0.1), pytest.approx(0.17321, abs=1e-5)]
    assert [(r["global_ndcg_min"], r["global_ndcg_max"]) for r in out] == [(0.1, 0.3), (0.4, 0.7)]
    png, csv = plot_sensitivity(out, "mu", "BPER+", tmp_path / "sens")
    assert png.stat().st_size > 1000
    assert csv.read_text().splitlines()[0] == "mu,global_ndcg,global_ndcg_std,global_ndcg_min,global_ndcg_max,runs"
