"""Extract under transport faults: flaky calls heal, an outage leaves its shard for a
plain re-run, and no transport failure is ever written as a finished error row."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from rexeval.failures import AwaitingRerun
from rexeval.pipelines.extract.pipeline import run_extract
from tests.pipelines.extract.test_pipeline import config, files, write_reviews

QUIET = {"progress": lambda s: None}


def error_types(root) -> list[str]:
    return [e["error_type"] for e in pq.read_table(root / "errors").to_pylist()]


@pytest.mark.slow
def test_flaky_calls_are_retried_and_give_the_same_tables(tmp_path, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 12)
    ref = run_extract(config(tmp_path, "ref", "ref.sqlite", "ref.log"), **QUIET)
    # A fifth of the requests fail once with a connection error (transient).
    got = run_extract(config(tmp_path, "out", "c.sqlite", "c.log", options={"flaky": 0.2}), **QUIET)
    assert files(tmp_path / "ref") == files(tmp_path / "out")
    assert got["counts"]["in"] == got["counts"]["out"] + got["counts"]["errors"] == 12
    assert ref["counts"]["out"] == got["counts"]["out"]
    assert "backend_error" not in error_types(tmp_path / "out")


@pytest.mark.slow
def test_an_outage_leaves_its_shard_for_a_plain_rerun(tmp_path, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 12)  # 3 shards of 4
    run_extract(config(tmp_path, "ref", "ref.sqlite", "ref.log"), **QUIET)
    flag = tmp_path / "outage"
    flag.write_text("on")
    cfg = config(tmp_path, "out", "c.sqlite", "c.log", options={
        "down_while": str(flag), "down_for": "Review number 6:", "backoff_s": 0.05})
    with pytest.raises(AwaitingRerun) as err:
        run_extract(cfg, **QUIET)
    assert err.value.awaiting == 1 and "run the same command again" in str(err.value)
    done = sorted(p.name for p in (tmp_path / "out" / "_done").iterdir())
    assert done == ["part-00000.json", "part-00002.json"]  # review 6 is in shard 1
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["status"] == "running" and manifest["awaiting_rerun"] == 1
    assert "backend_error" not in error_types(tmp_path / "out")

    flag.unlink()  # the endpoint is back: the same command finishes the job
    m = run_extract(cfg, **QUIET)
    assert m["status"] == "complete" and m["counts"]["in"] == 12
    assert files(tmp_path / "ref") == files(tmp_path / "out")
