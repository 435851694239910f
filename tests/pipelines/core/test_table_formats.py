"""Tables in the formats people keep (pipelines/core/table_formats.py, io.read_table):
Parquet, CSV, TSV and JSON lines, gzipped or not, read to the same rows; their column
names mapped to ours; a mislabelled or unknown file, or a missing column, refused with
the file, the format tried and the columns found."""
from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.table_formats import UnknownTableFormat, parse_columns, table_format

ROWS = [{"example_id": "007", "system": "mine", "user_id": "u1", "item_id": "i1",
         "explanation": "Bright, sturdy, and the battery lasts.", "reference": "It lasts."},
        {"example_id": "008", "system": "mine", "user_id": "u2", "item_id": "i2",
         "explanation": "A warm, \"cosy\" jumper,\nwith a second line.", "reference": None}]
THEIRS = {"example_id": "id", "system": "model", "explanation": "text"}


def _theirs(row: dict) -> dict:
    return {THEIRS.get(k, k): v for k, v in row.items()}


def _write(path, rows, fmt):
    table = pa.Table.from_pylist(rows)
    if fmt == "parquet":
        pq.write_table(table, path)
        return path
    if fmt in ("csv", "tsv"):
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, path, pcsv.WriteOptions(delimiter="," if fmt == "csv" else "\t"))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if path.name.endswith(".gz"):
        raise AssertionError("write plain, then gzip")
    return path


@pytest.mark.parametrize("name,fmt", [("e.parquet", "parquet"), ("e.csv", "csv"), ("e.tsv", "tsv"),
                                      ("e.jsonl", "jsonl"), ("e.csv.gz", "csv"), ("e.jsonl.gz", "jsonl")])
def test_every_format_reads_to_the_same_rows_under_our_names(tmp_path, name, fmt):
    plain = tmp_path / name.removesuffix(".gz")
    _write(plain, [_theirs(r) for r in ROWS], fmt)
    path = plain
    if name.endswith(".gz"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
    assert table_format(path) == fmt
    got = read_table(path, "explanations", rename=THEIRS).to_pylist()
    want = [dict(r) for r in ROWS]  # CSV's empty field in a nullable text column reads as null
    assert got == want  # "007" stays a string id, the quoted newline stays in the text


def test_the_format_is_told_by_the_bytes_when_the_name_does_not_say(tmp_path):
    p = tmp_path / "explanations"
    p.write_text(json.dumps(ROWS[0]) + "\n")
    assert table_format(p) == "jsonl"
    q = tmp_path / "explanations.data"
    pq.write_table(pa.Table.from_pylist(ROWS), q)
    assert table_format(q) == "parquet"


def test_a_mislabelled_or_unknown_file_is_named_with_the_format_tried(tmp_path):
    fake = tmp_path / "e.parquet"
    fake.write_text("example_id,system\n1,a\n")
    with pytest.raises(SchemaError, match=r"e\.parquet: not a readable Parquet file \(named \.parquet"):
        read_table(fake, "explanations")
    odd = tmp_path / "e.xlsx"
    odd.write_bytes(b"PK\x03\x04 not a table we read")
    with pytest.raises(SchemaError, match=r"e\.xlsx.*parquet, csv, tsv, jsonl"):
        read_table(odd, "explanations")
    with pytest.raises(UnknownTableFormat, match="not gzip"):
        bad = tmp_path / "e.csv.gz"
        bad.write_text("a,b\n")
        table_format(bad)
    # JSON lines under a CSV name, and one JSON array of records under a JSON name: each
    # named for what it holds (read as CSV, the first would have a column per JSON field).
    lines = tmp_path / "e.csv"
    lines.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with pytest.raises(SchemaError, match=r"e\.csv: named \.csv but holds JSON lines.*name it \.jsonl"):
        read_table(lines, "explanations")
    for name in ("e.json", "e.jsonl.gz", "e"):
        array = tmp_path / name
        body = ("\n  " + json.dumps(ROWS)).encode()
        array.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
        with pytest.raises(UnknownTableFormat, match=rf"{name}: holds one JSON array, not JSON lines.*jq -c"):
            table_format(array)


def test_a_missing_column_names_the_file_the_field_and_the_columns_found(tmp_path):
    p = _write(tmp_path / "mine.csv", [_theirs(r) for r in ROWS], "csv")
    with pytest.raises(SchemaError) as err:
        read_table(p, "explanations")  # no mapping: their names are not ours
    msg = str(err.value)
    assert "mine.csv" in msg and "columns found: id, model, user_id, item_id, text, reference" in msg
    assert "--columns" in msg
    # A mapping entry that names no column of the file is said as such (here a misspelt
    # "txt"), before the columns found; entries that matched are not repeated.
    with pytest.raises(SchemaError) as err:
        read_table(p, "explanations", rename={**THEIRS, "explanation": "txt"})
    msg = str(err.value)
    assert "--columns explanation=txt: the file has no such column; CSV file, columns found: example_id, system," in msg
    assert "example_id=id" not in msg


def test_columns_mapping_parsing():
    assert parse_columns(["explanation=text,system=model", "example_id=id"]) == {
        "explanation": "text", "system": "model", "example_id": "id"}
    assert parse_columns(None) == {}
    with pytest.raises(ValueError, match="OURS=THEIRS"):
        parse_columns(["explanation"])
