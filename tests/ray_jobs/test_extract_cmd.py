"""`rexeval extract` and `rexeval ground-truth` given URIs on the command line (the test
S3 endpoint): the paths are checked through storage, not the local disk."""
from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from rexeval.storage import location
from rexeval.ray_jobs.extract import extract_cmd
from rexeval.ray_jobs.ground_truth import ground_truth_cmd
from tests.pipelines.extract.test_ground_truth import make_extract
from tests.pipelines.extract.test_pipeline import BACKEND, TRIPLETS, write_reviews


def test_help_says_paths_may_be_uris():
    res = CliRunner().invoke(extract_cmd, ["--help"])
    assert res.exit_code == 0 and "s3://" in res.output and "_llm_cache" in res.output


def test_a_missing_uri_is_a_usage_error(s3_root):
    res = CliRunner().invoke(extract_cmd, [f"{s3_root}/nothing-here", "--out", f"{s3_root}/o"])
    assert res.exit_code == 2 and "does not exist" in res.output


@pytest.mark.slow
def test_extract_then_ground_truth_from_uris(tmp_path, s3_root, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 6)
    location(f"{s3_root}/ingest/reviews/part-00000.parquet").write_bytes((tmp_path / "reviews.parquet").read_bytes())
    cfg = tmp_path / "extract.yaml"
    cfg.write_text(yaml.safe_dump({"backend": BACKEND, "models": {"embedder": "none"}, "shard_size": 3,
                                   "backend_options": {"default": TRIPLETS}}))
    runner = CliRunner()
    res = runner.invoke(extract_cmd, [f"{s3_root}/ingest", "--out", f"{s3_root}/ex", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert f"{s3_root}/ex/statements" in res.output
    manifest = location(f"{s3_root}/ex/manifest.json").read_json()
    assert manifest["status"] == "complete" and manifest["counts"]["in"] == 6
    assert location(f"{s3_root}/ex/_llm_cache").walk_files()  # cached beside the output

    res = runner.invoke(ground_truth_cmd, [f"{s3_root}/ex", "--out", f"{s3_root}/gt"])
    assert res.exit_code == 0, res.output
    assert location(f"{s3_root}/gt/manifest.json").read_json()["counts"]["out"] == 4  # two reviews are empty

    src = make_extract(tmp_path / "extract")
    location(f"{s3_root}/ex2").upload(src)
    res = runner.invoke(ground_truth_cmd, [f"{s3_root}/ex2", "--out", f"{s3_root}/gt2", "--stage", "triplet"])
    assert res.exit_code == 0, res.output
    assert json.loads(location(f"{s3_root}/gt2/manifest.json").read_text())["counts"]["out"] == 4
