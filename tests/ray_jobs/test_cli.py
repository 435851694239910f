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
    assert res.exit_code == 2 and "different" in res.output


SMALL_DEMO = ["--extract-reviews", "1", "--evaluate-examples", "4", "--judge-examples", "1"]


@pytest.mark.slow
def test_demo_runs_offline(tmp_path, ray_session):
    """`rexeval demo` = the demo study (studies/demo.yaml) and its report. The terminal
    gets a short summary (progress per step, the headline results, where the report
    is); the full report is in the files. Smaller than the default run (fewer LLM calls:
    one review to extract, four examples to evaluate, one to judge), every step runs."""
    out = tmp_path / "demo"
    res = CliRunner().invoke(cli, ["demo", "--out", str(out), *SMALL_DEMO])
    assert res.exit_code == 0, res.output
    screen = res.output
    assert len(screen.splitlines()) < 120, screen
    # Progress per step, the headline table, the judges, where the report is.
    assert "[evaluate@sample] done in" in screen and "[peter@sample] done in" in screen
    assert "| metric | flipped | ground_truth | peter |" in screen and "| BERT-F1 ↑ |" in screen
    assert "Likert judge (seed 001" in screen and "Pairwise judge (seed 004) against ground_truth" in screen
    html = (out / "report" / "index.html").resolve()
    assert f"file://{html}" in screen and html.is_file()
    # One judge deployment for all the judge steps, started and stopped by the study.
    assert screen.count("starting the Serve deployment 'rexeval-judge'") == 1
    assert screen.count("stopped the Serve application 'rexeval-judge'") == 1
    # No Ray internals on the terminal: they are in the steps' logs.
    for noise in ("core_worker.cc", "(raylet)", "graceful_shutdown", "Traceback"):
        assert noise not in screen, noise
    assert (out / "logs" / "evaluate@sample.log").is_file()
    likert_log = (out / "logs" / "likert@sample.log").read_text()
    assert "using the running Serve application 'rexeval-judge'" in likert_log

    text = (out / "report" / "report.md").read_text()
    state = json.loads((out / "study.json").read_text())["steps"]
    assert len(state) == 22
    # Every step completed; only the optional win-rate chart may lack a pair to draw.
    assert {k for k, v in state.items() if v["status"] != "complete"} <= {"seed004_winrate@sample"}
    # Table II per domain; the broken rows became error rows.
    for domain in ("toys", "clothes", "beauty", "sports", "cellphones"):
        assert domain in text
    assert "| Interactions | 282 |" in text and state["ingest@sample"]["summary"]["errors"] == 5
    # The LLM steps ran on part of the sample and ended in rows, not crashes.
    assert state["triplets@sample"]["summary"]["in"] == 1 and state["ground_truth@sample"]["status"] == "complete"
    # Clustering of the verified statements and EXTRA, as Table 3; ranking as Tables 6 and 1.
    assert "| sample | STAR |" in text and "| EXTRA |" in text
    assert "| Total triplets | 853 |" in text
    assert "| USERPOP |" in text and "| EXPGCN |" in text and "| Gain |" in text
    # PETER trained on Ray Tune and decoded; seed 000's metrics on three systems.
    assert "## Generated explanations: peter_test@sample" in text
    assert "| Dataset | Metric | flipped | ground_truth | peter |" in text
    assert "| BERT-F1 |" in text and "| sample | St2Exp-P |" in text
    # What the local profile lacks is skipped, with the reason; nothing stands in for it.
    assert "statement\\_nli" in text and "no PyPI package ships an NLI model" in screen
    assert "| sample | StEnt-P |" not in text
    # Judges through the judge Serve deployment, with the local LLM.
    assert "| judge | system | persuasiveness |" in text
    assert "Win rates against the baseline `ground_truth`" in text and "Position bias" in text
    # Seed 004 in small: two prompted generators, the pairwise judge, the win-rate chart.
    assert "| review_extract | 1 | 1 | 0 | – |" in text
    assert "| preference_logic | 1 |" in text and "| item_based | 1 |" in text
    figure = out / "sample" / "seed004_winrate" / "figure5.svg"
    assert figure.exists() or "seed004_winrate@sample failed (optional)" in screen
    if figure.exists():
        assert "Win rates against the baseline `review_extract`" in text
    assert "not which generator is better" in screen
    # Every complete step's job recorded the hash of its settings (the report's provenance).
    from rexeval.pipelines.study.report_model import instance_provenance, read_study

    _, instances, _ = read_study(out)
    unrecorded = [i.name for i in instances
                  if i.status == "complete" and instance_provenance(i)["settings hash"].startswith("not recorded")]
    assert unrecorded == []
    # Run again: the study is complete, nothing runs.
    again = CliRunner().invoke(cli, ["demo", "--out", str(out), *SMALL_DEMO])
    assert again.exit_code == 0 and "nothing to do" in again.output
