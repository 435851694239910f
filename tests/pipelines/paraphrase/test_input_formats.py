"""`rexeval cluster` reads its statements (and, for --method extra, its reviews) in any
table format (issue 50, item 1): a CSV and a gzipped JSON-lines file under other column
names, mapped with `columns`, give the Parquet file's input description (stage, rows) and
rows; a missing column or an unknown format names the file, the format and the columns
found. No model is loaded: the steps before the encoders."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.pipelines.paraphrase.pipeline import describe_input
from rexeval.pipelines.paraphrase.steps import read_statements
from rexeval.pipelines.core.schema import REVIEWS, SchemaError, validate_table
from rexeval.storage import location
from tests.pipelines.extract.test_ground_truth import SMALL, statements_table

ROWS = SMALL + [("s6", "r3", "The cable is long", "negative", "verified"),
                ("s7", "r3", "I like the colour", "positive", "verified")]
THEIRS = {"statement": "text", "review_id": "rid", "sentiment": "polarity"}  # ours -> theirs


def _write(table: pa.Table, path, columns=None) -> str:
    rows = [{(columns or {}).get(k, k): v for k, v in r.items()} for r in table.to_pylist()]
    name = str(path)
    if name.endswith(".parquet"):
        pq.write_table(table, path)
    elif name.endswith(".csv"):
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return name


@pytest.mark.parametrize("name", ["statements.csv", "statements.jsonl.gz"])
def test_statements_in_other_formats_and_names_read_as_the_parquet_ones(tmp_path, name):
    table = statements_table(ROWS)
    want_cfg = ClusterConfig(input=_write(table, tmp_path / "s.parquet"), out=str(tmp_path / "a"))
    cfg = ClusterConfig(input=_write(table, tmp_path / name, THEIRS), out=str(tmp_path / "b"), columns=THEIRS)
    (want_src, want_stage), (src, stage) = describe_input(want_cfg), describe_input(cfg)
    assert stage == want_stage == "verified" and src["rows_in_files"] == want_src["rows_in_files"] == len(ROWS)
    got = read_statements(cfg, stage, location(tmp_path / "w"))[0]
    want = read_statements(want_cfg, stage, location(tmp_path / "w"))[0]
    assert got.to_pylist() == want.to_pylist() and got.num_rows == 2


def test_extra_reads_a_reviews_table_in_another_format(tmp_path):
    texts = ["Great strings. They sound warm.", "Great strings. Cheap too.", "Great strings. Nice box."]
    reviews = validate_table(pa.table({
        "review_id": ["r1", "r2", "r3"], "user_id": ["u1", "u2", "u3"], "item_id": ["i1", "i1", "i2"],
        "rating": pa.array([5.0, 4.0, 5.0], pa.float32()), "timestamp": [1, 2, 3], "text": texts,
        "source": ["x"] * 3, "line": [1, 2, 3]}), REVIEWS)
    theirs = {"text": "body", "item_id": "asin"}
    want_cfg = ClusterConfig(input=_write(reviews, tmp_path / "r.parquet"), out=str(tmp_path / "a"),
                             method="extra", extra_min_count=2)
    cfg = ClusterConfig(input=_write(reviews, tmp_path / "r.jsonl.gz", theirs), out=str(tmp_path / "b"),
                        method="extra", extra_min_count=2, columns=theirs)
    (want_src, want_stage), (src, stage) = describe_input(want_cfg), describe_input(cfg)
    assert stage == want_stage == "extra" and src["reviews"] == want_src["reviews"] == 3
    (tmp_path / "w1").mkdir(), (tmp_path / "w2").mkdir()
    got = read_statements(cfg, "extra", location(tmp_path / "w1"), say=lambda m: None)[0]
    want = read_statements(want_cfg, "extra", location(tmp_path / "w2"), say=lambda m: None)[0]
    assert got.to_pylist() == want.to_pylist() and got.num_rows


def test_a_missing_column_or_unknown_format_is_named(tmp_path):
    src = _write(statements_table(ROWS), tmp_path / "statements.csv", THEIRS)
    with pytest.raises(SchemaError) as err:
        describe_input(ClusterConfig(input=src, out=str(tmp_path / "o")))
    msg = str(err.value)
    assert src in msg and "CSV file" in msg and "columns found:" in msg and "polarity" in msg
    odd = tmp_path / "statements.xlsx"
    odd.write_bytes(b"PK\x03\x04 not a table")
    with pytest.raises(SchemaError) as err:
        describe_input(ClusterConfig(input=str(odd), out=str(tmp_path / "p")))
    assert str(odd) in str(err.value) and "parquet, csv, tsv, jsonl" in str(err.value)
