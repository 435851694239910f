"""`rexeval split` reads a reviews file in any format `runtime.read_dataset` reads (Parquet,
CSV, TSV, JSON lines, gzipped or not) under the user's own column names (--columns):
a CSV and a gzipped JSON-lines file give the splits the Parquet file gives; a file in no
format we read, or one lacking a column, is refused before Ray runs anything, naming the
file, the format and the columns found."""
from __future__ import annotations

import pyarrow as pa
import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.schema import REVIEWS, SPLIT_NAMES, SchemaError
from rexeval.pipelines.ingest.config import SplitConfig
from rexeval.pipelines.ingest.split_pipeline import run_split
from rexeval.ray_jobs.split import split_cmd
from tests.doubles.table_files import write_arrow_as
from tests.doubles.whole_tables import reviews_rows

THEIRS = {"user_id": "reviewer", "item_id": "asin", "timestamp": "time", "text": "body"}


def _rows() -> list[dict]:
    """One part of the split's planted reviews, with no null text (CSV has none)."""
    rows = reviews_rows(parts=1, per_part=40)[0]
    for r in rows:
        r.update(summary="s", user_name="n", item_title="t", category=r["category"] or "none")
    return rows


def _table() -> pa.Table:
    return pa.Table.from_pylist(_rows(), schema=REVIEWS)


def _split(source, out, **settings) -> dict[str, pa.Table]:
    run_split(SplitConfig(input=str(source), out=str(out), method="leave-last-two", **settings),
              progress=lambda _: None)
    return {n: read_table(out / n, "reviews") for n in SPLIT_NAMES}


@pytest.mark.parametrize("name", ["reviews.csv", "reviews.jsonl.gz"])
def test_a_csv_or_gzipped_json_lines_file_under_other_names_splits_as_the_parquet_one(tmp_path, ray_session,
                                                                                      name):
    want = _split(write_arrow_as(_table(), tmp_path / "reviews.parquet"), tmp_path / "ours")
    assert all(t.num_rows for t in want.values())
    theirs = write_arrow_as(_table(), tmp_path / name, THEIRS)
    got = _split(theirs, tmp_path / "theirs", columns=THEIRS)
    for n in SPLIT_NAMES:
        assert got[n].equals(want[n]), n


def test_a_missing_column_or_an_unknown_format_is_refused_before_any_work(tmp_path, ray_session):
    theirs = write_arrow_as(_table(), tmp_path / "reviews.jsonl.gz", THEIRS)
    with pytest.raises(SchemaError) as err:
        _split(theirs, tmp_path / "o", columns={k: v for k, v in THEIRS.items() if k != "timestamp"})
    text = str(err.value)
    assert str(theirs) in text and "field 'time': unexpected column" in text
    assert "JSON-lines file, columns found: review_id, user_id, item_id, rating, time, text" in text and "--columns" in text
    assert not (tmp_path / "o").exists()
    odd = tmp_path / "reviews.xlsx"
    odd.write_bytes(b"PK\x03\x04 a spreadsheet")
    res = CliRunner().invoke(split_cmd, [str(odd), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "reviews.xlsx" in res.output and "parquet, csv, tsv, jsonl" in res.output
    fake = tmp_path / "reviews.parquet"
    fake.write_text("user_id,item_id\nu1,i1\n")
    res = CliRunner().invoke(split_cmd, [str(fake), "--out", str(tmp_path / "o3")])
    assert res.exit_code == 2 and "reviews.parquet: not a readable Parquet file (" in res.output


def test_the_columns_flag_reaches_the_split(tmp_path, ray_session):
    theirs = write_arrow_as(_table(), tmp_path / "reviews.csv", THEIRS)
    flags = ",".join(f"{k}={v}" for k, v in THEIRS.items())
    res = CliRunner().invoke(split_cmd, [str(theirs), "--out", str(tmp_path / "o"), "--method", "leave-last-two",
                                         "--columns", flags])
    assert res.exit_code == 0, res.output
    want = _split(write_arrow_as(_table(), tmp_path / "reviews.parquet"), tmp_path / "ours")
    assert read_table(tmp_path / "o" / "test", "reviews").equals(want["test"])
