"""`rexeval split` and `rexeval info` given a folder with no review refuse it, naming the
folder and what they expected, instead of writing (or printing) statistics of nothing."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.schema import ERRORS, REVIEWS
from rexeval.ray_jobs.cli import cli
from rexeval.ray_jobs.info import load_dataset


def ingest_with_no_review(root):
    """An ingest folder whose every row was an error (0 rows in reviews/, 2 in errors/)."""
    (root / "reviews").mkdir(parents=True)
    (root / "errors").mkdir()
    pq.write_table(REVIEWS.empty_table(), root / "reviews" / "part-00000.parquet")
    rows = [{"stage": "ingest", "source": "r.jsonl", "line": n, "row_id": None, "field": "rating",
             "error_type": "invalid_field", "message": "rating out of range [5, 1]", "raw": "{}"} for n in (1, 2)]
    pq.write_table(pa.Table.from_pylist(rows, schema=ERRORS), root / "errors" / "part-00000.parquet")
    return root


@pytest.mark.parametrize("command", ["split", "info"])
def test_an_empty_folder_is_refused(tmp_path, command):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [command, str(empty)] + (["--out", str(tmp_path / "s")] if command == "split" else [])
    res = CliRunner().invoke(cli, args)
    assert res.exit_code != 0, res.output
    assert f"{empty} holds no reviews table" in res.output and "rexeval ingest" in res.output
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("command", ["split", "info"])
def test_an_ingest_with_no_review_is_refused_with_its_errors_named(tmp_path, command):
    ing = ingest_with_no_review(tmp_path / "ing")
    args = [command, str(ing)] + (["--out", str(tmp_path / "s")] if command == "split" else [])
    res = CliRunner().invoke(cli, args)
    assert res.exit_code != 0, res.output
    assert "kept no reviews" in res.output and str(ing / "errors") in res.output
    assert not (tmp_path / "s").exists()


def test_info_refuses_a_split_with_no_rows(tmp_path):
    for name in ("train", "valid", "test"):
        (tmp_path / name).mkdir()
        pq.write_table(REVIEWS.empty_table(), tmp_path / name / "part-00000.parquet")
    with pytest.raises(ValueError, match="the split has 0 rows in train/, valid/ and test/"):
        load_dataset(tmp_path)


def test_info_refuses_a_reviews_table_with_no_rows(tmp_path):
    pq.write_table(REVIEWS.empty_table(), tmp_path / "reviews.parquet")
    with pytest.raises(ValueError, match="the reviews table has 0 rows"):
        load_dataset(tmp_path / "reviews.parquet")
