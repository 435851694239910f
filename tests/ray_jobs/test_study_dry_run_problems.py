"""`rexeval study run FILE --dry-run` on a study file with six mistakes names all six
in one run (one line each, naming the step and the setting), before anything runs."""
from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli

SAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "sample"


def test_a_dry_run_reports_every_problem_at_once(tmp_path):
    study = {
        "name": "six",
        "datasets": {"a": {"inputs": [str(SAMPLE / "reviews.jsonl")]},
                     "b": {"inputs": [str(tmp_path / "missing.jsonl")]}},               # 1: missing input
        "steps": {
            "ingest": {"job": "ingest", "with": {"inputs": "{dataset.inputs}", "min_rating": 5,
                                                 "max_rating": 1}},                      # 2: reversed scale
            "split": {"job": "split", "datasets": ["a"], "wth": {},                      # 3: unknown key
                      "with": {"input": "{ingest}", "train": 1.5}},                      # 4: out of range
            "stats": {"job": "stats", "datasets": ["a"], "with": {"input": "{splt}"}},   # 5: no such step
            "x": {"job": "stats", "datasets": ["a"], "with": {"input": "{y}"}},          # 6: a cycle
            "y": {"job": "stats", "datasets": ["a"], "with": {"input": "{x}"}},
        },
    }
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(study, sort_keys=False))
    res = CliRunner().invoke(cli, ["study", "run", str(f), "--out", str(tmp_path / "out"), "--dry-run"])
    assert res.exit_code != 0 and "problems:" in res.output, res.output
    for expected in (f"datasets.b.inputs: {tmp_path / 'missing.jsonl'} does not exist",
                     "steps.ingest.with (dataset a): min_rating (5) is above max_rating (1)",
                     "steps.split.wth: unknown key",
                     "steps.split.with (dataset a).train: Input should be less than 1",
                     "steps.stats (dataset a).with.input: {splt} names no step",
                     "steps: a cycle: x@a -> y@a -> x@a"):
        assert expected in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_the_old_name_of_the_steps_as_flag_still_works(tmp_path, monkeypatch):
    """`--stages-as` (the flag's name when a step was a "stage") reaches the runner as
    `--steps-as` does, stays out of --help, and beside a different --steps-as is refused."""
    from rexeval.ray_jobs import study as study_cmd

    got = []
    monkeypatch.setattr(study_cmd, "run_study", lambda plan, **kw: got.append(kw["steps_as"]) or {})
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump({"name": "one", "datasets": {"a": {"inputs": [str(SAMPLE / "reviews.jsonl")]}},
                                 "steps": {"ingest": {"job": "ingest", "with": {"inputs": "{dataset.inputs}"}}}}))
    run = ["study", "run", str(f), "--out", str(tmp_path / "out"), "--dry-run"]
    for flags, want in ((["--stages-as", "process"], "process"), (["--steps-as", "job"], "job"),
                        (["--stages-as", "job", "--steps-as", "job"], "job"), ([], None)):
        res = CliRunner().invoke(cli, run + flags)
        assert res.exit_code == 0, res.output
        assert got.pop() == want
    res = CliRunner().invoke(cli, run + ["--stages-as", "job", "--steps-as", "process"])
    assert res.exit_code == 2 and "--stages-as is the old name of --steps-as" in res.output
    assert not got
    help_text = CliRunner().invoke(cli, ["study", "run", "--help"]).output
    assert "--steps-as" in help_text and "--stages-as" not in help_text
