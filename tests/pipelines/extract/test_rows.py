"""Rows of a table read by position or by review from its parts (local and on S3)."""
from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.schema import REVIEWS, SchemaError
from rexeval.storage import location
from rexeval.pipelines.extract.rows import TableParts


def reviews(lo: int, hi: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"review_id": f"r{i:03d}", "user_id": "u", "item_id": f"i{i % 3}", "rating": 4.0, "timestamp": i,
         "text": f"text {i}", "source": "t.jsonl", "line": i + 1} for i in range(lo, hi)], schema=REVIEWS)


@pytest.fixture(params=["local", "s3"])
def table(request, tmp_path):
    root = str(tmp_path / "reviews") if request.param == "local" else request.getfixturevalue("s3_root") + "/reviews"
    # Three parts of 7, 0 and 13 rows, the last in row groups of 4.
    for k, (lo, hi, group) in enumerate([(0, 7, 100), (7, 7, 100), (7, 20, 4)]):
        sink = pa.BufferOutputStream()
        pq.write_table(reviews(lo, hi), sink, row_group_size=group)
        (location(root) / f"part-{k:05d}.parquet").write_bytes(sink.getvalue().to_pybytes())
    return root


def test_any_row_range_reads_what_the_whole_table_holds(table):
    parts = TableParts.of(table, "reviews")
    assert parts.rows == (7, 0, 13) and parts.num_rows == 20
    whole = read_table(table, "reviews")
    for start, stop in [(0, 20), (0, 4), (4, 8), (6, 7), (7, 9), (9, 18), (18, 25), (20, 24), (3, 3)]:
        got = parts.read(start, stop)
        assert got.equals(whole.slice(start, max(0, min(stop, 20) - start))), (start, stop)
    assert parts.read(0, 5, ["review_id", "text"]).column_names == ["review_id", "text"]
    # What a worker is sent: paths and counts, not rows.
    assert b"text 1" not in pickle.dumps(parts)


def test_rows_by_review_keep_the_table_order(table):
    parts = TableParts.of(table, "reviews")
    got = parts.read_where("review_id", ["r015", "r002", "r009", "nope"], ["review_id"])
    assert got.column("review_id").to_pylist() == ["r002", "r009", "r015"]


def test_a_bad_row_is_named_by_its_part_and_row(tmp_path):
    rows = reviews(0, 6).to_pylist()
    rows[4]["user_id"] = None
    loose = pa.schema([f.with_nullable(True) for f in REVIEWS])
    pq.write_table(pa.Table.from_pylist(rows, schema=loose), tmp_path / "bad.parquet", row_group_size=2)
    parts = TableParts.of(tmp_path / "bad.parquet", "reviews")  # the footer fits
    assert parts.read(0, 4).num_rows == 4
    with pytest.raises(SchemaError) as err:
        parts.read(3, 6)
    assert err.value.row == 5 and err.value.field == "user_id" and err.value.source.endswith("bad.parquet")  # 1-based


def test_a_part_with_other_columns_is_refused_from_its_footer(tmp_path):
    pq.write_table(pa.table({"review_id": ["a"], "stars": [5]}), tmp_path / "x.parquet")
    with pytest.raises(SchemaError, match="stars"):
        TableParts.of(tmp_path / "x.parquet", "reviews")
