"""`rexeval generate` as a user runs it: help, settings, train and run on planted data,
and clear errors."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli
from tests.doubles.planted_split import planted_split


def test_help_lists_the_commands_and_show_settings_prints_the_papers_defaults():
    runner = CliRunner()
    res = runner.invoke(cli, ["generate", "--help"])
    assert res.exit_code == 0 and "train" in res.output and "run" in res.output
    res = runner.invoke(cli, ["generate", "train", "--help"])
    assert res.exit_code == 0 and "--target" in res.output and "--gpus-per-trial" in res.output
    res = runner.invoke(cli, ["generate", "train", "--model", "peter", "--show-settings", "--set", "emsize=64"])
    assert res.exit_code == 0, res.output
    assert "emsize = 64    # --set" in res.output and "nhead = 2    # PETER" in res.output, res.output
    res = runner.invoke(cli, ["generate", "train", "--model", "cer", "--preset", "seed000", "--show-settings"])
    assert res.exit_code == 0, res.output
    assert "batch_size = 32    # seed 000 baselines/CER/main.sh:17" in res.output
    assert "preset = 'seed000'" in res.output
    res = runner.invoke(cli, ["generate", "train", "--model", "nrt", "--show-settings", "--set", "emsize=64"])
    assert res.exit_code != 0 and "unknown nrt setting" in res.output


@pytest.mark.slow
def test_train_then_run_through_the_cli(tmp_path, ray_session):
    split, truth = planted_split(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["generate", "train", str(split), "--truth", str(truth), "--model", "nrt",
                              "--set", "epochs=2", "--set", "dim=16", "--set", "hidden=32", "--out",
                              str(tmp_path / "nrt")])
    assert res.exit_code == 0, res.output
    assert "best epoch" in res.output and "valid perplexity" in res.output
    res = runner.invoke(cli, ["generate", "run", str(tmp_path / "nrt"), "--out", str(tmp_path / "gen")])
    assert res.exit_code == 0, res.output
    assert "RMSE" in res.output and "reviews without a target" in res.output
    # Without ground truth, an explanation target is refused with what to do.
    res = runner.invoke(cli, ["generate", "train", str(split), "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "--truth" in res.output


def test_model_takes_the_generator_and_profile_overrides():
    """--model names the generator (pepler, xrec, ...) and, as ROLE=REF, overrides a model
    of the profile (the backbone); mistakes are refused with the choices."""
    runner = CliRunner()
    res = runner.invoke(cli, ["generate", "train", "--model", "pepler", "--show-settings"])
    assert res.exit_code == 0, res.output
    assert "sequential = True" in res.output and "optimizer = 'adamw'" in res.output and "PEPLER" in res.output
    res = runner.invoke(cli, ["generate", "train", "--model", "xrec", "--show-settings"])
    assert res.exit_code == 0 and "epochs = 1" in res.output and "n_experts = 8" in res.output, res.output
    res = runner.invoke(cli, ["generate", "train", "--model", "pepler", "--model", "xrec", "--show-settings"])
    assert res.exit_code != 0 and "one generator at a time" in res.output
    res = runner.invoke(cli, ["generate", "train", "--model", "gpt5", "--show-settings"])
    assert res.exit_code != 0 and "unknown generator" in res.output and "xrec" in res.output


@pytest.mark.slow
def test_pepler_backbone_comes_from_the_model_override(tmp_path, ray_session):
    from tests.doubles.tiny_llm import build_tiny_chat_model

    split, truth = planted_split(tmp_path)
    lm = build_tiny_chat_model(tmp_path / "tiny")
    runner = CliRunner()
    res = runner.invoke(cli, ["generate", "train", str(split), "--truth", str(truth), "--model", "pepler",
                              "--model", f"generator_lm={lm}", "--set", "epochs=1", "--set", "batch_size=32",
                              "--out", str(tmp_path / "pepler")])
    assert res.exit_code == 0, res.output
    assert f"backbone (generator_lm): {lm}" in res.output and "LM tokens" in res.output
    res = runner.invoke(cli, ["generate", "run", str(tmp_path / "pepler"), "--out", str(tmp_path / "gen")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["generate", "train", str(split), "--truth", str(truth), "--model", "pepler",
                              "--model", "generator_lm=/no/such/model", "--out", str(tmp_path / "bad")])
    assert res.exit_code != 0 and "/no/such/model" in res.output


@pytest.mark.slow
def test_generate_llm_through_the_cli(tmp_path, ray_session):
    """`rexeval generate llm` on an ingest folder: one method without an LLM, one with the
    scripted LLM in-process; the summary counts every interaction; bad input is refused
    with a message."""
    from tests.doubles.planted_shop import planted_ingest

    runner = CliRunner()
    res = runner.invoke(cli, ["generate", "llm", "--help"])
    assert res.exit_code == 0
    for name in ("user_based", "item_based", "review_extract", "review_summary", "preference_logic", "--limit"):
        assert name in res.output
    ingest = planted_ingest(tmp_path)
    answer = "This suits the way you play and will make every practice session feel easier and more fun."
    res = runner.invoke(cli, ["generate", "llm", str(ingest), "--method", "review_extract", "--method",
                              "preference_logic", "--backend", "tests.doubles.llm:ScriptedLLM",
                              "--backend-option", f"default={answer}", "--judge-service", "none", "--no-cache",
                              "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "| review_extract | 9 | 8 | 1 | no_reviews 1 |" in res.output
    assert "| preference_logic | 9 | 9 | 0 | – |" in res.output
    assert "explanations.parquet" in res.output and "judge pairwise" in res.output
    res = runner.invoke(cli, ["generate", "llm", str(ingest), "--method", "telepathy", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "telepathy" in res.output
    res = runner.invoke(cli, ["generate", "llm", str(ingest), "--method", "review_extract", "--split", "valid",
                              "--out", str(tmp_path / "y")])
    assert res.exit_code == 2 and "ingest folder" in res.output


def test_train_and_run_take_uris(tmp_path, s3_root, ray_session):
    """Inputs and outputs may be URIs: they are checked in the bucket, not refused as
    missing local paths, and the job's own messages name them."""
    from rexeval.storage import location

    _, truth = planted_split(tmp_path)
    location(f"{s3_root}/truth").upload(truth)
    location(f"{s3_root}/nothing/readme.txt").write_text("not a checkpoint")
    runner = CliRunner()
    res = runner.invoke(cli, ["generate", "train", f"{s3_root}/split", "--truth", f"{s3_root}/truth", "--model",
                              "nrt", "--out", f"{s3_root}/nrt"])
    assert res.exit_code == 2 and "not a `rexeval split` output" in res.output, res.output
    res = runner.invoke(cli, ["generate", "run", f"{s3_root}/nothing", "--out", f"{s3_root}/gen"])
    assert res.exit_code == 2 and f"{s3_root}/nothing holds no generator checkpoint" in res.output, res.output
    res = runner.invoke(cli, ["generate", "run", f"{s3_root}/absent", "--out", f"{s3_root}/gen"])
    assert res.exit_code == 2 and "does not exist" in res.output
