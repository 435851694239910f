"""`rexeval meta-evaluate` as a user runs it (the command object, before cli.py lists it)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from scipy import stats

from rexeval.ray_jobs.meta_evaluate import meta_evaluate_cmd
from tests.pipelines.meta_evaluate.test_pipeline import LONG_SCORES, ONE_TABLE, expected, human_ratings, likert_long


@pytest.fixture
def one_table(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text(ONE_TABLE)
    return path


def test_help_has_an_example_and_says_no_ray():
    res = CliRunner().invoke(meta_evaluate_cmd, ["--help"])
    assert res.exit_code == 0
    for text in ("rexeval meta-evaluate", "No Ray", "--human-null", "--judge-prefix", "--mode", "--config",
                 "runs/likert/likert_scores.parquet", "example_id", "verdicts.parquet"):
        assert text in res.output, text


def test_runs_from_flags(tmp_path, one_table):
    out = tmp_path / "out"
    res = CliRunner().invoke(meta_evaluate_cmd, [str(one_table), "--out", str(out), "--method", "pearson",
                                                 "--level", "dataset", "--level", "pair", "--bootstrap", "50"])
    assert res.exit_code == 0, res.output
    j, h = [4, 2, 5, 1, 3, 3, 4, 2], [5, 2, 4, 1, 3, 2, 5, 1]
    assert f"| judge | {np.corrcoef(j, h)[0, 1] * 100:.2f} / " in res.output
    for text in ("joined", "human_filled", "errors.parquet", "meta_evaluation.md", "Each cell: dataset / pair"):
        assert text in res.output, text
    results = pd.read_parquet(out / "meta_evaluation.parquet")
    assert set(results["level"]) == {"dataset", "pair"} and set(results["method"]) == {"pearson"}
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["joined"] == 8 and report["counts"]["errors"] == 2


def test_runs_from_a_config_with_the_drop_policy(tmp_path, one_table):
    cfg = tmp_path / "meta.yaml"
    cfg.write_text(f"scores: {one_table}\nout: {tmp_path / 'out'}\nhuman_null: drop\njudge_null: drop\n"
                   "aspects: [transparency]\nmethods: [kendall]\nbootstrap: 0\n")
    res = CliRunner().invoke(meta_evaluate_cmd, ["--config", str(cfg), "--judge-null", "-1"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["config"]["human_null"] == "drop" and report["config"]["judge_null"] == -1.0  # the flag wins
    assert (report["counts"]["dropped_null"], report["counts"]["judge_filled"]) == (1, 1)
    assert "Kendall correlation" in res.output


def test_user_errors_are_one_clear_line(tmp_path, one_table):
    runner = CliRunner()
    res = runner.invoke(meta_evaluate_cmd, [str(one_table), "--out", str(tmp_path / "o"), "--key", "nope"])
    assert res.exit_code == 2 and "field 'nope': required key column is missing" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(meta_evaluate_cmd, [str(one_table), "--out", str(tmp_path / "o"), "--human-null", "zero"])
    assert res.exit_code == 2 and "neither a number nor 'drop'" in res.output
    res = runner.invoke(meta_evaluate_cmd, ["--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "scores" in res.output
    res = runner.invoke(meta_evaluate_cmd, [str(one_table), "--out", str(tmp_path / "o"), "--judge-col", "x"])
    assert res.exit_code == 2 and "one human column per judge column" in res.output


def test_runs_on_judge_likert_scores(tmp_path):
    """`judge likert`'s long file and a human ratings file, as in the --help example."""
    scores = tmp_path / "runs" / "likert" / "likert_scores.parquet"
    scores.parent.mkdir(parents=True)
    likert_long().to_parquet(scores)
    human = human_ratings(tmp_path / "ratings.csv")
    out = tmp_path / "meta"
    res = CliRunner().invoke(meta_evaluate_cmd, [str(scores), "--human", str(human), "--out", str(out),
                                                 "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    assert "long layout: 32 scores of 4 (judge, aspect) pair(s) over 8 explanations" in res.output
    assert "| org/model-a | " in res.output and "long_rows" in res.output
    results = pd.read_parquet(out / "meta_evaluation.parquet")
    for judge, aspect in LONG_SCORES:  # NaN judge scores count as 0, the human gap as 3
        j, h = expected(judge, aspect)
        for method, fn in (("pearson", stats.pearsonr), ("spearman", stats.spearmanr),
                           ("kendall", stats.kendalltau)):
            row = results[(results.evaluator == judge) & (results.aspect == aspect) & (results.level == "dataset")
                          & (results.method == method)]
            assert row["value"].item() == pytest.approx(fn(j, h).statistic)
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["judge_filled"] == 4 and report["counts"]["human_filled"] == 2


def test_ensemble_sweep_writes_its_files(tmp_path):
    """Seed 001's Figure 4 from three judge prefixes, the cap and --seed from the flags."""
    from tests.metrics.test_ensemble import PEARSON
    from tests.pipelines.meta_evaluate.test_ensemble import wide

    src = wide(tmp_path / "wide.csv")
    out = tmp_path / "out"
    args = [str(src), "--out", str(out), "--judge-prefix", "a_", "--judge-prefix", "b_", "--judge-prefix", "c_",
            "--method", "pearson", "--level", "dataset", "--bootstrap", "0", "--ensemble-sweep", "--ensemble-cap", "2",
            "--seed", "5"]
    res = CliRunner().invoke(meta_evaluate_cmd, args)
    assert res.exit_code == 0, res.output
    for name in ("ensemble_sweep.parquet", "ensemble_sweep.csv", "ensemble_sweep.md", "ensemble_sweep.png"):
        assert (out / name).is_file() and f"{out}/{name}" in res.output, name
    assert "Ensemble size: Pearson correlation" in res.output and "ensemble_subsets" in res.output
    assert "note: aspect 'transparency' has a single evaluator (a)" in res.output
    sweep = pd.read_parquet(out / "ensemble_sweep.parquet")
    assert list(sweep["n"]) == [1, 2, 3] and list(sweep["n_subsets"]) == [2, 2, 1]  # C(3, 1) = C(3, 2) = 3 > 2
    assert sweep["max"].iloc[2] == pytest.approx(PEARSON[3]["A + B + C"])
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["ensemble_cap"] == 2 and report["ensemble_sweep"]["seed"] == 5
    again = tmp_path / "again"
    assert CliRunner().invoke(meta_evaluate_cmd, args[:2] + [str(again)] + args[3:]).exit_code == 0
    pd.testing.assert_frame_equal(pd.read_parquet(again / "ensemble_sweep.parquet"), sweep)  # seeded sample


def test_ensemble_sweep_with_one_evaluator_is_one_clear_line(tmp_path, one_table):
    res = CliRunner().invoke(meta_evaluate_cmd, [str(one_table), "--out", str(tmp_path / "o"), "--ensemble-sweep"])
    assert res.exit_code == 2 and "needs at least two evaluators scoring one aspect" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()
