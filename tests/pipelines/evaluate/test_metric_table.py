"""The `metric_table` study job: an evaluate run's per-example scores as the wide table
meta-evaluate reads, so seed 001's reference-based rows (BLEU, ROUGE against the user's
own explanation) meet the users' ratings."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rexeval.pipelines.evaluate.study_job import MetricTableConfig, metric_table, run_metric_table
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate


def planted(n_users: int = 3, n_items: int = 2, systems=("user", "item", "pop")):
    rng = np.random.default_rng(3)
    ex, sc, hu = [], [], []
    for u in range(n_users):
        for i in range(n_items):
            for s in systems:
                eid = f"u{u}-m{i}"
                ex.append({"example_id": eid, "system": s, "user_id": f"u{u}", "item_id": f"m{i}",
                           "explanation": "x", "reference": "y"})
                for m in ("sentence-bleu-1", "rouge-l-f"):
                    sc.append({"example_id": eid, "system": s, "metric": m, "value": float(rng.random())})
                hu.append({"user_id": f"u{u}", "item_id": f"m{i}", "system": s,
                           "human_accuracy": int(rng.integers(1, 6)), "human_satisfaction": int(rng.integers(1, 6))})
    return pd.DataFrame(ex), pd.DataFrame(sc), pd.DataFrame(hu)


def test_each_metric_is_repeated_under_every_aspect_with_the_ids():
    examples, scores, _ = planted()
    table = metric_table(examples, scores, ["accuracy", "satisfaction"], ["rouge-l-f"])
    assert list(table.columns) == ["example_id", "system", "user_id", "item_id", "rouge-l-f_accuracy",
                                   "rouge-l-f_satisfaction"]
    assert len(table) == len(examples)
    expected = scores[scores["metric"] == "rouge-l-f"].set_index(["example_id", "system"])["value"]
    got = table.set_index(["example_id", "system"])
    np.testing.assert_array_equal(got["rouge-l-f_accuracy"], expected.loc[got.index])
    np.testing.assert_array_equal(got["rouge-l-f_satisfaction"], expected.loc[got.index])
    with pytest.raises(ValueError, match=r"\['bleu-9'\] are not in the evaluate run"):
        metric_table(examples, scores, ["accuracy"], ["bleu-9"])


def test_the_table_meta_evaluates_against_ratings_as_scipy_per_user(tmp_path):
    examples, scores, human = planted()
    run = tmp_path / "evaluate"
    run.mkdir()
    examples.to_parquet(run / "examples.parquet", index=False)
    scores.to_parquet(run / "scores.parquet", index=False)
    human.to_csv(tmp_path / "ratings.csv", index=False)
    run_metric_table(MetricTableConfig(run=str(run), out=str(tmp_path / "table"), aspects=["accuracy"]),
                     progress=lambda s: None)
    run_meta_evaluate(MetaEvaluateConfig(scores=str(tmp_path / "table" / "metric_scores.parquet"),
                                         human=str(tmp_path / "ratings.csv"), judge_prefixes=["sentence-bleu-1_"],
                                         methods=["pearson"], bootstrap=0, out=str(tmp_path / "meta")))
    res = pd.read_parquet(tmp_path / "meta" / "meta_evaluation.parquet")
    user = res[(res["level"] == "user") & (res["aspect"] == "accuracy")]
    bleu = scores[scores["metric"] == "sentence-bleu-1"].merge(examples, on=["example_id", "system"])
    joined = bleu.merge(human, on=["user_id", "item_id", "system"])
    per_user = [stats.pearsonr(g["value"], g["human_accuracy"]).statistic for _, g in joined.groupby("user_id")]
    assert list(user["evaluator"]) == ["sentence-bleu-1"]
    assert user["value"].iloc[0] == pytest.approx(np.mean(per_user), abs=1e-12)
