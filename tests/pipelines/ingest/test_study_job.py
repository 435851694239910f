"""The study job `statement_stats` (pipelines/ingest/study_job.py) counts on Ray workers
(issue 47): run with the driver forbidden any table's rows, its Table II equals the one
pandas works out from the rows (only verified statements count when any is verified)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from rexeval.pipelines.ingest.study_job import StatementStatsConfig, run_statement_stats
from tests.doubles.whole_tables import (assert_table2, expected_table2, forbid_whole_tables, write_split,
                                        write_statements)


@pytest.mark.slow
@pytest.mark.parametrize("given", ["split", "reviews"])
def test_statement_stats_counts_on_workers(given, tmp_path, ray_session, monkeypatch):
    frames = write_split(str(tmp_path / "split"))
    ids = list(pd.concat(list(frames.values()))["review_id"])
    statements = write_statements(str(tmp_path / "statements.parquet"), ids)
    if given == "reviews":  # one reviews table: its train part stands for it
        frames = {"all": frames["train"]}
    source = tmp_path / "split" / ("train" if given == "reviews" else "")
    monkeypatch.setattr("rexeval.pipelines.core.runtime.ROWS_PER_GROUP", 16)
    with monkeypatch.context() as driver:
        forbid_whole_tables(driver)
        m = run_statement_stats(StatementStatsConfig(input=str(source), statements=str(tmp_path / "statements.parquet"),
                                                     out=str(tmp_path / "t2"), name="toys"), progress=lambda _: None)
    want = expected_table2(frames, statements[statements["stage"] == "verified"])
    assert m["stage"] == "verified" and want["statements_total"] < len(statements)
    assert_table2(m["stats"]["toys"], want)
    assert json.loads((tmp_path / "t2" / "manifest.json").read_text())["stats"] == m["stats"]
