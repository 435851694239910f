"""`meta-evaluate --ensemble-sweep` (seed 001, Figure 4) from files: wide and long
layouts, the null policies member by member, unreadable values, the outputs, the
refusal with one evaluator, and the settings from a study file. Golden numbers are the
hand-worked ones of tests/metrics/test_ensemble.py."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from pydantic import ValidationError
from scipy import stats

from rexeval.pipelines.core.io import config_hash
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate
from tests.metrics.test_ensemble import A, B, C, HUMAN, ITEMS, PEARSON, USERS
from tests.pipelines.meta_evaluate.test_pipeline import ONE_TABLE

SYSTEMS = ["s1", "s2", "s1", "s1", "s2"]
SWEEP_FILES = ("ensemble_sweep.parquet", "ensemble_sweep.csv", "ensemble_sweep.md", "ensemble_sweep.png")


def wide(path, a=A, b=B, c=C, human=HUMAN):
    """Judges a_, b_ and c_ for persuasiveness; only a_ for transparency."""
    pd.DataFrame({"user_id": USERS, "item_id": ITEMS, "system": SYSTEMS, "a_persuasiveness": a,
                  "b_persuasiveness": b, "c_persuasiveness": c, "human_persuasiveness": human,
                  "a_transparency": [2, 1, 3, 5, 4], "human_transparency": [1, 2, 3, 4, 5]}).to_csv(path, index=False)
    return path


def run(tmp_path, src, overwrite=False, **settings):
    cfg = MetaEvaluateConfig(scores=str(src), out=str(tmp_path / "out"), bootstrap=0, methods=["pearson"],
                             ensemble_sweep=True, **settings)
    report = run_meta_evaluate(cfg, overwrite=overwrite)
    return report, pd.read_parquet(tmp_path / "out" / "ensemble_sweep.parquet")


def row(sweep, n, level="dataset", aspect="persuasiveness"):
    r = sweep[(sweep.aspect == aspect) & (sweep.n == n) & (sweep.level == level) & (sweep.method == "pearson")]
    assert len(r) == 1
    return r.iloc[0]


def test_wide_layout_sweep_files_and_numbers(tmp_path):
    src = wide(tmp_path / "wide.csv")
    report, sweep = run(tmp_path, src, judge_prefixes=["a_", "b_", "c_"])
    out = tmp_path / "out"
    for n, by_subset in PEARSON.items():
        r = row(sweep, n)
        values = list(by_subset.values())
        assert r["n_subsets"] == len(values) and r["n_judges"] == 3
        assert (r["mean"], r["min"], r["max"]) == (pytest.approx(sum(values) / len(values)),
                                                   pytest.approx(min(values)), pytest.approx(max(values)))
    assert (row(sweep, 2)["best"], row(sweep, 2)["worst"]) == ("a + b", "a + c")
    assert row(sweep, 3)["best"] == "a + b + c" and row(sweep, 3)["n_subsets"] == 1
    assert set(sweep["aspect"]) == {"persuasiveness"} and set(sweep["level"]) == {"dataset", "user", "pair"}
    # N = 1 is the single evaluators of meta_evaluation.parquet.
    single = pd.read_parquet(out / "meta_evaluation.parquet")
    single = single[(single.aspect == "persuasiveness") & (single.level == "dataset")]["value"]
    assert (row(sweep, 1)["min"], row(sweep, 1)["max"]) == (single.min(), single.max())
    pd.testing.assert_frame_equal(pd.read_csv(out / "ensemble_sweep.csv"), sweep, check_dtype=False)
    assert (out / "ensemble_sweep.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    md = (out / "ensemble_sweep.md").read_text()
    two = row(sweep, 2)
    assert (f"| persuasiveness | 2 | 3 | {two['mean'] * 100:.2f} [{two['min'] * 100:.2f}, {two['max'] * 100:.2f}] |"
            in md)
    assert "single evaluator (a): left out" in md and "| a + b | a + c |" in md
    entry = report["ensemble_sweep"]
    assert entry["aspects"] == {"persuasiveness": ["a", "b", "c"]} and entry["subsets"] == 7
    assert entry["cap"] == 200 and len(entry["notes"]) == 1
    assert report["counts"]["ensemble_subsets"] == 7
    assert set(SWEEP_FILES) <= set(report["outputs"])
    assert json.loads((out / "report.json").read_text())["config"]["ensemble_sweep"] is True


def test_missing_scores_member_by_member(tmp_path):
    """b has no score for the last explanation: 0 in the mean (seed 001), or left out of it."""
    src = wide(tmp_path / "wide.csv", b=B[:4] + [None])
    _, sweep = run(tmp_path, src, judge_prefixes=["a_", "b_", "c_"])
    everything = [(1 + 1 + 3) / 3, (3 + 2 + 3) / 3, (2 + 5 + 1) / 3, (5 + 3 + 5) / 3, (4 + 0 + 3) / 3]
    assert row(sweep, 3)["mean"] == pytest.approx(stats.pearsonr(everything, HUMAN).statistic)
    _, sweep = run(tmp_path, src, judge_prefixes=["a_", "b_", "c_"], judge_null="drop", overwrite=True)
    everything[4] = (4 + 3) / 2
    assert row(sweep, 3)["mean"] == pytest.approx(stats.pearsonr(everything, HUMAN).statistic)


def test_an_unreadable_score_leaves_its_row_out_of_the_subsets_with_its_judge(tmp_path):
    src = wide(tmp_path / "wide.csv", a=["x"] + A[1:])
    report, sweep = run(tmp_path, src, judge_prefixes=["a_", "b_", "c_"])
    # Rows 2-5 only for every subset with a; b + c keeps all five rows.
    both = [(3 + 2 + 3) / 3, (2 + 5 + 1) / 3, (5 + 3 + 5) / 3, (4 + 4 + 3) / 3]
    assert row(sweep, 3)["mean"] == pytest.approx(stats.pearsonr(both, HUMAN[1:]).statistic)
    pairs = [stats.pearsonr([(x + y) / 2 for x, y in zip(A[1:], B[1:])], HUMAN[1:]).statistic,
             stats.pearsonr([(x + y) / 2 for x, y in zip(A[1:], C[1:])], HUMAN[1:]).statistic,
             PEARSON[2]["B + C"]]
    assert (row(sweep, 2)["min"], row(sweep, 2)["max"]) == (pytest.approx(min(pairs)), pytest.approx(max(pairs)))
    errors = pd.read_parquet(tmp_path / "out" / "errors.parquet")
    assert len(errors) == 1 and errors["field"].item() == "a_persuasiveness"  # read once, reported once


def test_long_layout_one_evaluator_per_judge(tmp_path):
    rows = []
    for judge, scores in (("org/model-a", A), ("model_b", B), ("model_c", C)):
        for u, i, s, score in zip(USERS, ITEMS, SYSTEMS, scores):
            rows.append({"user_id": u, "item_id": i, "system": s, "judge": judge, "aspect": "persuasiveness",
                         "score": float(score)})
    pd.DataFrame(rows).to_parquet(tmp_path / "likert_scores.parquet")
    pd.DataFrame({"user_id": USERS, "item_id": ITEMS, "system": SYSTEMS,
                  "human_persuasiveness": HUMAN}).to_csv(tmp_path / "human.csv", index=False)
    report, sweep = run(tmp_path, tmp_path / "likert_scores.parquet", human=str(tmp_path / "human.csv"),
                        ensemble_cap=2)
    assert report["layout"] == "long"
    assert report["ensemble_sweep"]["aspects"] == {"persuasiveness": ["org/model-a", "model_b", "model_c"]}
    assert row(sweep, 3)["mean"] == pytest.approx(17 / math.sqrt(380))
    one = row(sweep, 1)  # the cap of 2 leaves a seeded sample of two of the three judges
    assert (one["n_subsets"], one["n_possible"], one["sampled"]) == (2, 3, True)
    assert one["best"] in ("org/model-a", "model_b", "model_c")


def test_fewer_than_two_evaluators_is_a_clear_error_before_any_output(tmp_path):
    (tmp_path / "one.csv").write_text(ONE_TABLE)
    cfg = MetaEvaluateConfig(scores=str(tmp_path / "one.csv"), out=str(tmp_path / "out"), ensemble_sweep=True)
    with pytest.raises(ValueError, match=r"needs at least two evaluators scoring one aspect, found only one per "
                                         r"aspect \(persuasiveness: judge; transparency: judge\)"):
        run_meta_evaluate(cfg)
    assert not (tmp_path / "out").exists()


def test_pairwise_mode_refuses_the_sweep():
    with pytest.raises(ValidationError, match="ensemble_sweep averages ratings"):
        MetaEvaluateConfig(scores="v.parquet", out="o", mode="pairwise", ensemble_sweep=True)
    with pytest.raises(ValidationError):
        MetaEvaluateConfig(scores="v.parquet", out="o", ensemble_cap=0)


def test_without_the_sweep_the_config_and_its_hash_are_unchanged(tmp_path):
    """A run without the sweep records and hashes the settings it did before the sweep
    existed, and a re-run without it removes a previous run's sweep files."""
    src = wide(tmp_path / "wide.csv")
    run(tmp_path, src, judge_prefixes=["a_", "b_", "c_"])
    cfg = MetaEvaluateConfig(scores=str(src), out=str(tmp_path / "out"), bootstrap=0, methods=["pearson"],
                             judge_prefixes=["a_", "b_", "c_"])
    report = run_meta_evaluate(cfg, overwrite=True)
    before = cfg.model_dump(exclude={"out", "ensemble_sweep", "ensemble_cap"})
    assert report["config"] == before and report["config_hash"] == config_hash(before)
    assert "ensemble_sweep" not in report and "ensemble_subsets" not in report["counts"]
    assert not any((tmp_path / "out" / f).exists() for f in SWEEP_FILES)


def test_a_study_step_reaches_the_settings():
    from rexeval.pipelines.core.study_registry import STUDY_JOBS, build_config

    STUDY_JOBS.names()  # imports the built-in jobs, as the study plan does: alone, this file imports none
    cfg = build_config(STUDY_JOBS["meta_evaluate"], {"scores": "s.parquet", "out": "o", "ensemble_sweep": True,
                                                      "ensemble_cap": 50, "seed": 3})
    assert (cfg.ensemble_sweep, cfg.ensemble_cap, cfg.seed) == (True, 50, 3)


def test_every_subset_value_is_kept(tmp_path):
    """ensemble_subsets.parquet: one row per (subset, method, level), the dataset-level
    Pearson of each of the seven subsets of a, b, c being the hand-worked value."""
    report, _ = run(tmp_path, wide(tmp_path / "wide.csv"), judge_prefixes=["a_", "b_", "c_"])
    every = pd.read_parquet(tmp_path / "out" / "ensemble_subsets.parquet")
    assert len(every) == 7 * 3 and set(every["level"]) == {"dataset", "user", "pair"}
    ds = every[every.level == "dataset"].set_index("subset")
    for n, by_subset in PEARSON.items():
        for subset, value in by_subset.items():
            got = ds.loc[subset.lower()]  # the prefixes a_, b_, c_ name the evaluators a, b, c
            assert got["n"] == n and got["value"] == pytest.approx(value)
    assert "ensemble_subsets.parquet" in report["outputs"]
