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


def write(run, method, values_by_level):
    folder = run / "results" / method
    folder.mkdir(parents=True)
    parts = []
    for level, vals in values_by_level.items():
        n = len(vals)
        parts.append(pa.table({"method": [method] * n, "level": [level] * n, "interaction": np.arange(n),
                               "review_id": [str(i) for i in range(n)], "precision@10": vals,
                               "recall@10": vals, "ndcg@10": vals}))
    pq.write_table(pa.concat_tables(parts), folder / "per_interaction.parquet")


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
