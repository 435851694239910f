"""`rexeval judge ...` as a user runs it: help, clear errors, a run with the scripted LLM."""
import json
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli

SCRIPTED = ["--backend", "tests.doubles.llm:ScriptedLLM", "--model", "judge_llm=scripted", "--no-cache",
            "--judge-service", "none"]


def _explanations(tmp_path):
    df = pd.DataFrame({"example_id": ["e1", "e2", "e1", "e2"], "system": ["base", "base", "mine", "mine"],
                       "user_id": ["u1", "u2", "u1", "u2"], "item_id": ["i1", "i2", "i1", "i2"],
                       "explanation": ["Fits your kit.", "Good strings.", "Bright sound you like.", "Lasts long."],
                       "reference": [None] * 4})
    p = tmp_path / "expl.parquet"
    df.to_parquet(p)
    return str(p)


def test_judge_help_lists_the_three_jobs():
    res = CliRunner().invoke(cli, ["judge", "--help"])
    assert res.exit_code == 0
    for sub in ("likert", "pairwise", "detect"):
        assert sub in res.output
        sub_help = CliRunner().invoke(cli, ["judge", sub, "--help"])
        assert sub_help.exit_code == 0 and "Example" in sub_help.output


def test_clear_errors(tmp_path, ray_session):
    expl = _explanations(tmp_path)
    res = CliRunner().invoke(cli, ["judge", "pairwise", expl, "--out", str(tmp_path / "o")] + SCRIPTED)
    assert res.exit_code == 2 and "baseline" in res.output
    res = CliRunner().invoke(cli, ["judge", "pairwise", expl, "--baseline", "nobody", "--out",
                                   str(tmp_path / "o")] + SCRIPTED)
    assert res.exit_code == 2 and "baseline system 'nobody' is not in the explanations" in res.output
    res = CliRunner().invoke(cli, ["judge", "likert", expl, "--shots", "personalised", "--out",
                                   str(tmp_path / "o2")] + SCRIPTED)
    # Settings the job's config refuses are usage errors, before anything runs.
    assert res.exit_code == 2 and "--examples" in res.output, res.output
    res = CliRunner().invoke(cli, ["judge", "detect", "--out", str(tmp_path / "o3")] + SCRIPTED)
    assert res.exit_code == 2 and "--contexts" in res.output, res.output


@pytest.mark.slow
def test_likert_with_a_personalised_example_through_the_cli(tmp_path, ray_session):
    expl = _explanations(tmp_path)
    # u1 rated system "mine" on another item: the personalised example for (u1, i1, mine).
    pd.DataFrame([{"user_id": "u1", "item_id": "i9", "system": "mine", "explanation": "You play a lot.",
                   "item_description": "A capo", "human_persuasiveness": 5, "human_transparency": 4,
                   "human_accuracy": 3, "human_satisfaction": 2}]).to_parquet(tmp_path / "rated.parquet")
    res = CliRunner().invoke(cli, ["judge", "likert", expl, "--shots", "personalised", "--examples",
                                   str(tmp_path / "rated.parquet"), "--aspect", "persuasiveness",
                                   "--backend-option", 'default="persuasiveness: 4"',
                                   "--out", str(tmp_path / "lk")] + SCRIPTED)
    assert res.exit_code == 0, res.output
    scores = pd.read_parquet(tmp_path / "lk" / "likert_scores.parquet")
    assert len(scores) == 4 and (scores["score"] == 4).all()
    used = scores.set_index(["system", "example_id"])["shot_example"]
    assert pd.notna(used.loc[("mine", "e1")]) and used.drop(("mine", "e1")).isna().all()
    report = json.loads((tmp_path / "lk" / "report.json").read_text())
    assert report["one_shot_fallbacks"] == 3  # no example for the other three rows
    assert "| scripted | mine |" in res.output or "scripted" in res.output


def test_winrate_through_the_cli(tmp_path):
    from tests.pipelines.judge.test_winrate import write_run

    a = write_run(tmp_path / "batch1", systems=("sysA",))
    b = write_run(tmp_path / "batch2", systems=("sysB",))
    out = tmp_path / "wr"
    res = CliRunner().invoke(cli, ["judge", "winrate", str(a), str(b), "--out", str(out), "--resamples", "100",
                                   "--seed", "3", "--baseline-label", "PreferenceLogic"])
    assert res.exit_code == 0, res.output
    assert "PreferenceLogic loses" in res.output and "== judge winrate" in res.output
    for name in ("winrate.csv", "winrate.md", "table4.md", "table4.csv", "figure5.png", "figure5.svg", "report.json"):
        assert (out / name).exists(), name
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["folders"] == 2 and report["counts"]["systems"] == 2
    assert report["settings"] == {"confidence": 0.95, "resamples": 100, "seed": 3,
                                  "interval": "percentile bootstrap over pairs"}
    # an empty folder is a one-line error naming it
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(cli, ["judge", "winrate", str(tmp_path / "empty"), "--out", str(out)])
    assert res.exit_code == 2 and re.search(r"empty: holds (neither|none of) verdicts.parquet", res.output)
    res = CliRunner().invoke(cli, ["judge", "winrate", "--out", str(out)])
    assert res.exit_code == 2 and "runs" in res.output


@pytest.mark.slow
def test_pairwise_disc_prints_the_reward_models_time_and_cost(tmp_path, ray_session):
    from tests.doubles.tiny_encoders import build_tiny_bert

    reward = build_tiny_bert(tmp_path / "tiny-reward", 1)
    prices = tmp_path / "prices.yaml"
    prices.write_text('models:\n  "*tiny-reward*": {gpu_hour: 2.50}\n')
    res = CliRunner().invoke(cli, ["judge", "pairwise", _explanations(tmp_path), "--baseline", "base",
                                   "--evaluator", "disc", "--reward-model", str(reward), "--only", "reasoning",
                                   "--price-table", str(prices), "--out", str(tmp_path / "pw")] + SCRIPTED)
    assert res.exit_code == 0, res.output
    u = json.loads((tmp_path / "pw" / "report.json").read_text())["usage_disc"]
    assert u["pairs"] == 2 and u["seconds"] > 0 and u["gpu_hour_price"] == 2.5
    # seconds x GPUs / 3600 x 2.50 (0 GPUs, so 0, when the tiny model runs on the CPU)
    assert u["cost_usd"] == pytest.approx(u["seconds"] * u["gpus"] / 3600 * 2.5, abs=1e-6)
    assert f"reward model {reward}: 2 pair(s)" in res.output
    assert "| judge | kind | calls or pairs | tokens | seconds | GPU-hours | cost |" in res.output
