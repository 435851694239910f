"""`rexeval ingest`, `split` and `info` given URIs for their inputs and outputs, as a user
on a cluster runs them (credentials and endpoint from the AWS variables, no flags)."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rexeval.storage import location
from rexeval.ray_jobs.cli import cli

SAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "sample"


@pytest.mark.slow
def test_ingest_split_info_from_and_to_s3(s3_root, ray_session, tmp_path):
    for name in ("reviews.jsonl", "reviews_noisy.jsonl", "items.jsonl"):
        (location(s3_root) / "in" / name).upload(SAMPLE / name)
    runner = CliRunner()
    res = runner.invoke(cli, ["ingest", f"{s3_root}/in/reviews.jsonl", f"{s3_root}/in/reviews_noisy.jsonl",
                              "--meta", f"{s3_root}/in/items.jsonl", "--out", f"{s3_root}/ing"])
    assert res.exit_code == 0, res.output
    manifest = location(f"{s3_root}/ing/manifest.json").read_json()
    c = manifest["counts"]
    assert c["in"] == c["out"] + c["errors"] and c["errors"] > 0 and manifest["status"] == "complete"
    assert manifest["config"]["inputs"][1]["path"] == f"{s3_root}/in/reviews_noisy.jsonl"
    assert f"{s3_root}/ing/reviews" in res.output

    res = runner.invoke(cli, ["split", f"{s3_root}/ing", "--out", f"{s3_root}/split", "--method", "leave-last-two",
                              "--min-interactions", "3"])
    assert res.exit_code == 0, res.output
    s = location(f"{s3_root}/split/manifest.json").read_json()["counts"]

    res = runner.invoke(cli, ["info", f"{s3_root}/split", "--json"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert list(stats) == [location(s3_root).name]  # the folder above split/... is the dataset's name
    assert stats[location(s3_root).name]["interactions"] == s["train"] + s["valid"] + s["test"]
    assert list(tmp_path.iterdir()) == []  # nothing landed on this disk


def test_a_missing_uri_is_a_usage_error_before_any_work(s3_root):
    runner = CliRunner()
    res = runner.invoke(cli, ["ingest", f"{s3_root}/nothing.jsonl", "--out", f"{s3_root}/ing"])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(cli, ["split", f"{s3_root}/nothing", "--out", f"{s3_root}/split"])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(cli, ["info", f"{s3_root}/nothing"])
    assert res.exit_code == 2 and "does not exist" in res.output
    assert not location(s3_root).exists()
