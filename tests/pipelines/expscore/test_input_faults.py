"""What a careless or hostile input does to ExpScore's reader: a damaged Parquet file is
named, a Parquet column of numbers where the texts belong is refused with its file and
column, and a number in a JSON line's text is that line's error row (1-based)."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.expscore import inputs as ei
from rexeval.pipelines.expscore.config import ExpScoreInputs


def _cfg(path) -> ExpScoreInputs:
    return ExpScoreInputs(inputs=[str(path)], out="unused", reviews_column="reviews")


def test_a_damaged_parquet_file_is_named(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"explanation": ["x" * 20] * 2000, "item_id": [str(i) for i in range(2000)]}), good)
    data = bytearray(good.read_bytes())
    data[8:3000] = b"\xff" * (3000 - 8)  # pages gone, footer intact
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:  # an input mistake: exit 2, one line
        ei.read_rows(str(bad))
    assert str(bad) in str(err.value) and "not a readable Parquet file" in str(err.value)


def test_a_parquet_column_of_numbers_for_the_texts_is_refused(tmp_path):
    path = tmp_path / "rated.parquet"
    pq.write_table(pa.table({"explanation": pa.array([4, 5], pa.int64()), "item_id": ["a", "b"],
                             "rating": [4.0, 5.0], "reviews": ["good", "fine"]}), path)
    with pytest.raises(SchemaError) as err:
        ei.load_examples(_cfg(path), "required")
    assert (err.value.source, err.value.field) == (str(path), "explanation")
    assert "holds int64 values, expected text" in str(err.value)


def test_a_number_in_a_json_line_is_that_lines_error_row(tmp_path):
    path = tmp_path / "rated.jsonl"
    rows = [{"explanation": "Warm and clear tone", "item_id": "a", "rating": 4, "reviews": "good"},
            {"explanation": 12, "item_id": "a", "rating": 3, "reviews": "good"},
            {"explanation": "Sturdy case", "item_id": "a", "rating": True, "reviews": "good"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, errors, _ = ei.load_examples(_cfg(path), "required")
    assert len(kept) == 1
    got = [(e["line"], e["field"], e["error_type"]) for e in errors]
    assert got == [(2, "explanation", "bad_type"), (3, "rating", "bad_rating")]
    assert "12 (int), not text" in errors[0]["message"]
