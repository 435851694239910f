"""`rexeval ground-truth` as a user runs it (the command object, before cli.py lists it)."""
from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
from click.testing import CliRunner

from rexeval.ray_jobs.ground_truth import ground_truth_cmd
from tests.pipelines.extract.test_ground_truth import make_extract


def test_help_has_an_example():
    res = CliRunner().invoke(ground_truth_cmd, ["--help"])
    assert res.exit_code == 0 and re.search(r"Examples?:\s+rexeval ground-truth \S", res.output), res.output
    assert "--stage" in res.output and "--workers" in res.output and "--config" in res.output


def test_bad_stage_and_missing_out_are_usage_errors(tmp_path):
    res = CliRunner().invoke(ground_truth_cmd, [str(tmp_path), "--out", "o", "--stage", "final"])
    assert res.exit_code == 2 and "final" in res.output
    res = CliRunner().invoke(ground_truth_cmd, [str(tmp_path)])
    assert res.exit_code == 2 and "out" in res.output


def test_missing_input_is_one_clear_line(tmp_path, ray_session):
    res = CliRunner().invoke(ground_truth_cmd, [str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2  # an input mistake
    assert "statements input not found" in res.output and "Traceback" not in res.output


def test_runs_from_flags_and_from_a_config(tmp_path, ray_session):
    src = make_extract(tmp_path / "extract")
    runner = CliRunner()
    res = runner.invoke(ground_truth_cmd, [str(src), "--out", str(tmp_path / "gt"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "shard 0 done" in res.output and "shard 1 done" in res.output
    for line in ("explanations out", "sentences out", "error rows", "triplet",
                 f"{tmp_path / 'gt'}/explanations", f"{tmp_path / 'gt'}/sentences"):
        assert line in res.output, line
    assert pq.read_table(tmp_path / "gt" / "explanations").num_rows == 4

    # The same job from YAML; the flag given on the command line wins over the file.
    cfg = tmp_path / "gt.yaml"
    cfg.write_text(f"input: {src}\nout: {tmp_path / 'gt2'}\nstage: verified\n")
    res = runner.invoke(ground_truth_cmd, ["--config", str(cfg), "--stage", "triplet"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "gt2" / "manifest.json").read_text())
    assert manifest["stage"] == "triplet" and manifest["counts"]["out"] == 4

    # Re-running is a no-op; other settings into the same folder are refused.
    res = runner.invoke(ground_truth_cmd, [str(src), "--out", str(tmp_path / "gt")])
    assert res.exit_code == 0 and "already complete" in res.output
    res = runner.invoke(ground_truth_cmd, [str(src), "--out", str(tmp_path / "gt"), "--stage", "candidate"])
    assert res.exit_code == 2 and "different" in res.output
