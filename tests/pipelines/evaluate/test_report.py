"""Seed 000's Figure 2 as the evaluate job draws it: StEnt-bin P/R/F1 per system with
the bootstrap interval of each mean; nothing drawn when the metric was not computed."""
from __future__ import annotations

import pandas as pd

from rexeval.pipelines.evaluate.report import plot_stent_bin


def _agg(metrics) -> pd.DataFrame:
    rows = []
    for i, system in enumerate(["flipped", "ground_truth"]):
        for j, m in enumerate(metrics):
            mean = 0.1 * (i + 1) + 0.01 * j
            rows.append({"system": system, "metric": m, "mean": mean, "ci_low": mean - 0.02, "ci_high": mean + 0.03})
    return pd.DataFrame(rows)


def test_figure2_is_drawn_from_the_stent_bin_means_and_intervals(tmp_path):
    assert plot_stent_bin(_agg(["stent_bin_p", "stent_bin_r", "stent_bin_f1", "bleu-1"]), tmp_path / "figure2.png",
                          dataset="sample")
    png, svg = tmp_path / "figure2.png", tmp_path / "figure2.svg"
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 5000
    text = svg.read_text()
    for label in ("StEnt-bin-P", "StEnt-bin-R", "StEnt-bin-F1", "flipped", "ground_truth", "StEnt-bin (sample)"):
        assert label in text


def test_no_figure_without_stent_bin(tmp_path):
    assert not plot_stent_bin(_agg(["bleu-1", "stent_p"]), tmp_path / "figure2.png")
    assert not list(tmp_path.iterdir())


def test_review_generation_names_the_similarity_table_table_vii():
    """Seed 000 reports the same text similarity metrics twice: against ground-truth
    explanations (Table VI) and, for generators trained on the reviews, against the
    reviews (Table VII). Only that table's title changes; values and other tables do not."""
    from rexeval.pipelines.evaluate.report import results_csv, results_markdown

    agg = _agg(["bertscore-f1", "sts", "bleu-1"])
    agg["std"], agg["n"], agg["n_missing"], agg["kind"] = 0.0, 10, 0, "mean"
    review = results_markdown(agg, task="review")
    plain = results_markdown(agg)
    assert "### Table VII: text similarity metrics on review generation" in review and "Table VI:" not in review
    assert "### Table VI: text similarity metrics" in plain and "Table VII" not in plain
    assert "### n-gram and feature metrics" in review
    assert review.replace("Table VII: text similarity metrics on review generation",
                          "Table VI: text similarity metrics") == plain
    csv = pd.read_csv(__import__("io").StringIO(results_csv(agg, task="review")))
    assert set(csv.loc[csv.key == "sts", "table"]) == {"Table VII: text similarity metrics on review generation"}
    assert set(csv.loc[csv.key == "bleu-1", "table"]) == {"n-gram and feature metrics"}
