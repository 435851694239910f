"""`rexeval generate llm` from the command line with its split folder and --out as URIs
(S3 on 127.0.0.1): accepted, the same table as a local run, a missing URI refused."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from rexeval.storage import location
from rexeval.ray_jobs.cli import cli
from tests.doubles.planted_split import planted_split

pytestmark = pytest.mark.slow


def test_split_and_out_as_uris(tmp_path, s3_root, ray_session, monkeypatch):
    split, _ = planted_split(tmp_path / "data", n_users=6, n_items=6)
    location(f"{s3_root}/split").upload(split)
    runner = CliRunner()
    args = ["--method", "review_extract", "--no-cache"]
    res = runner.invoke(cli, ["generate", "llm", str(split), *args, "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output

    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    res = runner.invoke(cli, ["generate", "llm", f"{s3_root}/split", *args, "--out", f"{s3_root}/out"])
    assert res.exit_code == 0, res.output
    assert f"{s3_root}/out/explanations.parquet" in res.output
    assert list(here.iterdir()) == []
    got = (location(s3_root) / "out" / "explanations.parquet").read_bytes()
    assert got == (tmp_path / "out" / "explanations.parquet").read_bytes()
    assert (location(s3_root) / "out" / "report.json").read_json()["input"] == f"{s3_root}/split"

    res = runner.invoke(cli, ["generate", "llm", f"{s3_root}/nothing", *args, "--out", f"{s3_root}/x"])
    assert res.exit_code == 2 and "does not exist" in res.output
