"""The `likert_pool` study job: two `judge likert` outputs (open and API judges) as one
scores table, the runs' own ensemble rows left out, the judges named kept in order."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from rexeval.pipelines.core.study_registry import STUDY_JOBS
from rexeval.pipelines.judge.study_job import LikertPoolConfig, pool_scores, run_likert_pool


def scores(judges: list[str], value: float) -> pd.DataFrame:
    rows = [{"example_id": f"e{k}", "system": "user", "user_id": "u1", "item_id": f"i{k}", "judge": j,
             "aspect": a, "score": value, "shots": "zero", "shot_example": None, "problem": None, "raw": "x"}
            for j in judges for k in range(2) for a in ("persuasiveness", "accuracy")]
    return pd.DataFrame(rows)


def run_folder(tmp_path, name: str, frame: pd.DataFrame):
    folder = tmp_path / name
    folder.mkdir()
    frame.to_parquet(folder / "likert_scores.parquet", index=False)
    return folder


def test_pool_drops_the_runs_ensembles_and_keeps_the_named_judges_in_order():
    open_run = pd.concat([scores(["llama-7b", "qwen-14b"], 3.0), scores(["ensemble(llama-7b+qwen-14b)"], 3.0)])
    api_run = scores(["gpt-4"], 4.0)
    every = pool_scores([open_run, api_run], [])
    assert list(dict.fromkeys(every["judge"])) == ["llama-7b", "qwen-14b", "gpt-4"]
    assert len(every) == 3 * 2 * 2
    kept = pool_scores([open_run, api_run], ["gpt-4", "qwen-14b"])
    assert list(dict.fromkeys(kept["judge"])) == ["gpt-4", "qwen-14b"] and len(kept) == 8
    assert "ensemble(llama-7b+qwen-14b)" in set(pool_scores([open_run], [], keep_ensembles=True)["judge"])


def test_pool_refuses_an_absent_judge_and_overlapping_runs():
    run = scores(["gpt-4"], 4.0)
    with pytest.raises(ValueError, match=r"\['gpt-5'\] are in none of the runs"):
        pool_scores([run], ["gpt-5"])
    with pytest.raises(ValueError, match="'gpt-4' scored .* in more than one run"):
        pool_scores([run, run], [])


def test_the_job_writes_one_scores_table_that_meta_evaluate_reads(tmp_path):
    a = run_folder(tmp_path, "open", pd.concat([scores(["qwen-14b"], 3.0), scores(["ensemble(q+l)"], 2.0)]))
    b = run_folder(tmp_path, "api", scores(["gpt-4"], 4.0))
    out = tmp_path / "pool"
    manifest = run_likert_pool(LikertPoolConfig(runs=[str(a), str(b / "likert_scores.parquet")], out=str(out)),
                               progress=lambda s: None)
    assert manifest["judges"] == ["qwen-14b", "gpt-4"] and manifest["counts"]["scores"] == 8
    pooled = pd.read_parquet(out / "likert_scores.parquet")
    assert set(pooled["judge"]) == {"qwen-14b", "gpt-4"}
    assert "| gpt-4 | user |" in (out / "likert.md").read_text()
    assert json.loads((out / "manifest.json").read_text())["job"] == "likert_pool"
    assert STUDY_JOBS["likert_pool"].outputs.scores == "likert_scores.parquet"
