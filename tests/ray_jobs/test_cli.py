"""The `rexeval` commands as a user runs them: help, configs, errors, demo."""
import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli

SAMPLE_ARGS = ["pipelines/sample/reviews.jsonl", "pipelines/sample/reviews_noisy.jsonl",
               "--meta", "pipelines/sample/items.jsonl"]


def test_every_command_has_help():
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0
    for cmd in ("ingest", "split", "info", "demo", "models", "extract", "extract-quality",
                "ground-truth", "cluster", "cluster-report", "star", "evaluate", "judge", "meta-evaluate",
                "expscore", "generate", "serve"):
        assert cmd in top.output
        res = runner.invoke(cli, [cmd, "--help"])
        assert res.exit_code == 0 and "Usage" in res.output


def test_ingest_without_out_is_a_clear_usage_error():
    res = CliRunner().invoke(cli, ["ingest", "pipelines/sample/reviews.jsonl"])
    assert res.exit_code == 2 and "out" in res.output


def test_bad_columns_mapping_is_reported(tmp_path):
    res = CliRunner().invoke(cli, ["ingest", "pipelines/sample/reviews.jsonl", "--out", str(tmp_path / "o"),
                                   "--columns", "rating"])
    assert res.exit_code != 0 and "FIELD=COLUMN" in res.output


@pytest.mark.slow
def test_ingest_split_info_from_a_yaml_config(tmp_path, ray_session, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    runner = CliRunner()
    cfg = tmp_path / "ingest.yaml"
    cfg.write_text(f"out: {tmp_path / 'ing'}\nchunk_mb: 0.01\n")
    res = runner.invoke(cli, ["ingest", *SAMPLE_ARGS, "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "ing" / "manifest.json").read_text())
    c = manifest["counts"]
    assert c == {"in": 316, "out": 311, "errors": 5} and manifest["config"]["chunk_mb"] == 0.01
    assert "error rows" in res.output and "reviews out" in res.output

    res = runner.invoke(cli, ["split", str(tmp_path / "ing"), "--out", str(tmp_path / "spl"),
                              "--method", "leave-last-two"])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "spl" / "manifest.json").read_text())["counts"]
    users = pq.read_table(tmp_path / "spl" / "test").column("user_id")
    assert s["test"] == s["valid"] == len(users.unique())  # one test and one valid row per user

    res = runner.invoke(cli, ["info", str(tmp_path / "spl"), "--name", "sample", "--json"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)["sample"]
    assert stats["interactions"] == s["train"] + s["valid"] + s["test"]

    # Same folder, other settings: refused with a message, not mixed.
    res = runner.invoke(cli, ["split", str(tmp_path / "ing"), "--out", str(tmp_path / "spl")])
    assert res.exit_code == 1 and "different" in res.output


@pytest.mark.slow
def test_demo_runs_offline(tmp_path, ray_session):
    res = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "demo")])
    assert res.exit_code == 0, res.output
    for domain in ("toys", "clothes", "beauty", "sports", "cellphones"):
        assert domain in res.output
    assert "error rows" in res.output and "Interactions" in res.output
    # The LLM stages ran on part of the sample and ended in rows, not crashes.
    assert "[6/12] ground-truth" in res.output
    assert "triplet statements" in res.output and "verified statements" in res.output
    # Clustering: the verified statements (bi-encoder only, said plainly) and EXTRA, as Table 3.
    assert "[7/12] cluster" in res.output and "bi-encoder only" in res.output
    assert "| sample | EXTRA |" in res.output and "| STAR |" in res.output
    assert "statement clusters" in res.output and "extra clusters" in res.output
    # Ranking: STAR built from the hand-written statements, baselines and a short ExpGCN, as Table 1.
    assert "[8/12] star" in res.output and "| Total triplets | 853 |" in res.output
    assert "| USERPOP |" in res.output and "| EXPGCN |" in res.output and "| Gain |" in res.output
    # Generation: a small PETER trained on Ray Tune and decoded on the test reviews.
    assert "[9/12] generate" in res.output and "PETER explanations" in res.output
    assert "| Dataset | Metric | flipped | ground_truth | peter |" in res.output
    # Evaluation: ground truth vs a sentiment-flipped copy; what the local profile lacks is
    # skipped, with the reason, and nothing else is reported under the NLI names.
    assert "[10/12] evaluate" in res.output and "| BERT-F1 |" in res.output and "| St2Exp-P |" in res.output
    assert "skipped statement_nli:" in res.output and "no PyPI package ships an NLI model" in res.output
    assert "| StEnt-P |" not in res.output
    # Judges: Likert and pairwise through the judge Serve deployment, with the local LLM.
    assert "[11/12] judge" in res.output and "| judge | system | persuasiveness |" in res.output
    assert "Win rates against the baseline `ground_truth`" in res.output and "Position bias" in res.output
    assert "starting the Serve deployment 'rexeval-judge'" in res.output
    # Seed 004 in small: two prompted generators, the pairwise judge, the win-rate chart.
    # (SmolLM2 may write no usable explanation at all: then the step says so instead of drawing.)
    assert "[12/12] seed 004" in res.output and "| review_extract | 2 | 2 | 0 | – |" in res.output
    assert "| preference_logic | 2 |" in res.output and "| item_based | 2 |" in res.output
    figure = tmp_path / "demo" / "seed004" / "winrate" / "figure5.svg"
    assert figure.exists() or "no pair to judge" in res.output
    if figure.exists():
        assert "Win rates against the baseline `review_extract`" in res.output
    assert "not which generator is better" in res.output
