"""`rexeval info` counts on Ray workers (issue 47): with every whole-table reader of this
process (the command's driver) raising, it prints the Table II that pandas works out from
the rows, for a split folder with statements and for a single reviews table."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli
from tests.doubles.whole_tables import (assert_table2, expected_table2, forbid_whole_tables, write_reviews, write_split,
                                        write_statements)


@pytest.mark.slow
def test_info_counts_on_workers(tmp_path, ray_session, monkeypatch):
    frames = write_split(str(tmp_path / "toys" / "split"))
    ids = list(pd.concat(list(frames.values()))["review_id"])
    statements = write_statements(str(tmp_path / "statements.parquet"), ids)
    table = write_reviews(str(tmp_path / "sports" / "reviews"))
    monkeypatch.setattr("rexeval.pipelines.core.runtime.ROWS_PER_GROUP", 16)
    with monkeypatch.context() as driver:
        forbid_whole_tables(driver)
        res = CliRunner().invoke(cli, ["info", str(tmp_path / "toys" / "split"), str(tmp_path / "sports" / "reviews"),
                                       "--statements", str(tmp_path / "statements.parquet"), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert list(got) == ["toys", "sports"]
    assert_table2(got["toys"], expected_table2(frames, statements))
    assert_table2(got["sports"], expected_table2({"all": table}, statements))
