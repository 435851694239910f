"""`rexeval star` end to end through the CLI on the sample's hand-written statements."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.inputs import statements_from_annotations
from rexeval.ray_jobs.cli import cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("starcli")
    runner = CliRunner()
    res = runner.invoke(cli, ["ingest", "pipelines/sample/reviews.jsonl", "--meta", "pipelines/sample/items.jsonl",
                              "--out", str(root / "ingest")])
    assert res.exit_code == 0, res.output
    write_parquet_atomic(root / "ann" / "statements" / "part-00000.parquet",
                         statements_from_annotations("pipelines/sample/statements.jsonl"))
    return root


def test_build_baselines_train_report(bench):
    runner = CliRunner()
    res = runner.invoke(cli, ["star", "build", "pipelines/sample/statements.jsonl", "--reviews",
                              str(bench / "ingest"), "--out", str(bench / "bench"), "--name", "sample"])
    assert res.exit_code == 0, res.output
    assert "| Interactions | 303 |" in res.output and "Before clustering" in res.output
    assert "After clustering" not in res.output  # no --clusters: the unclustered benchmark
    res = runner.invoke(cli, ["star", "baselines", str(bench / "bench"), "--out", str(bench / "rank"),
                              "--level", "global", "--level", "item", "--level", "user"])
    assert res.exit_code == 0, res.output
    assert "USERPOP" in res.output and "user: interactions scored" in res.output
    res = runner.invoke(cli, ["star", "train", str(bench / "bench"), "--model", "expgcn", "--set", "epochs=3",
                              "--set", "dim=16", "--out", str(bench / "rank")])
    assert res.exit_code == 0, res.output
    assert "best epoch" in res.output
    report = json.loads((bench / "rank" / "train-expgcn.json").read_text())
    ck = report["best"]["checkpoint"]
    res = runner.invoke(cli, ["star", "evaluate", str(bench / "bench"), "--checkpoint", ck, "--method", "EXPGCN-again",
                              "--out", str(bench / "rank")])
    assert res.exit_code == 0, res.output
    again = json.loads((bench / "rank" / "results" / "EXPGCN-again" / "summary.json").read_text())
    first = json.loads((bench / "rank" / "results" / "EXPGCN" / "summary.json").read_text())
    assert again["levels"]["global"] == first["levels"]["global"]
    res = runner.invoke(cli, ["star", "report", str(bench / "rank"), "--name", "sample",
                              "--csv", str(bench / "t1.csv")])
    assert res.exit_code == 0, res.output
    assert "| **sample** |" in res.output and "| EXPGCN |" in res.output and "Cliff's delta" in res.output
    assert (bench / "t1.csv").read_text().startswith("dataset,method,level,metric,value")


def test_train_seeds_then_report_means(bench):
    runner = CliRunner()
    data, out = bench / "bench-seeds", bench / "rank-seeds"
    res = runner.invoke(cli, ["star", "build", "pipelines/sample/statements.jsonl", "--reviews",
                              str(bench / "ingest"), "--out", str(data)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["star", "baselines", str(data), "--out", str(out), "--method", "userpop",
                              "--method", "itempop"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["star", "train", str(data), "--set", "epochs=2", "--set", "dim=8", "--seeds", "2",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "runs (seeds)" in res.output and "mean of 2 runs" in res.output
    assert json.loads((out / "train-expgcn.json").read_text())["seeds"] == [0, 1]
    res = runner.invoke(cli, ["star", "report", str(out), "--csv", str(bench / "t1-seeds.csv")])
    assert res.exit_code == 0, res.output
    expgcn = next(ln for ln in res.output.splitlines() if ln.startswith("| EXPGCN"))
    assert expgcn.count(" ± ") == 6 and "2 runs pooled" in res.output
    userpop = next(ln for ln in res.output.splitlines() if ln.startswith("| USERPOP"))
    assert "±" not in userpop
    assert (bench / "t1-seeds.csv").read_text().startswith("dataset,method,level,metric,value,std,min,max,runs,")


def test_clear_errors(bench, tmp_path):
    runner = CliRunner()
    (tmp_path / "not-a-bench").mkdir()
    res = runner.invoke(cli, ["star", "baselines", str(tmp_path / "not-a-bench"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "star build" in res.output
    res = runner.invoke(cli, ["star", "train", str(tmp_path), "--grid", "nonsense", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "SETTING=V1,V2" in res.output
    res = runner.invoke(cli, ["star", "build", str(bench / "ann"), "--out", str(tmp_path / "b")])
    assert res.exit_code != 0 and "--reviews" in res.output
