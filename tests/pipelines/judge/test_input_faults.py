"""What a careless or hostile input does to the judges' readers: a damaged Parquet file
or a broken JSON line is named (file, and line), a context text that is a number is
refused with its file and column, and so is a Parquet column of numbers given as the
explanations."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import EXPLANATIONS, SchemaError
from rexeval.pipelines.judge.inputs import explanations_frame, read_contexts, read_frame


def test_a_damaged_parquet_file_is_named(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"user_id": [f"u{i}" for i in range(2000)], "item_id": ["x" * 20] * 2000}), good)
    data = bytearray(good.read_bytes())
    data[8:3000] = b"\xff" * (3000 - 8)  # pages gone, footer intact
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:  # an input mistake: exit 2, one line
        read_frame(str(bad))
    assert str(bad) in str(err.value) and "not a readable Parquet file" in str(err.value)


def test_a_broken_json_line_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "contexts.jsonl"
    path.write_text('{"user_id": "u", "item_id": "i", "user_profile": "", "item_description": "a tuner"}\n{oops\n')
    with pytest.raises(SchemaError) as err:
        read_contexts(str(path))
    assert (err.value.source, err.value.row) == (str(path), 2)


def test_a_context_text_that_is_a_number_is_refused(tmp_path):
    path = tmp_path / "contexts.parquet"
    pd.DataFrame({"user_id": [1, 2], "item_id": ["a", "b"], "user_profile": ["bought strings", ""],
                  "item_description": [3.5, 4.0]}).to_parquet(path)
    with pytest.raises(SchemaError) as err:
        read_contexts(str(path))
    assert (err.value.source, err.value.field) == (str(path), "item_description")
    assert "expected text" in str(err.value)
    mixed = tmp_path / "contexts.jsonl"
    mixed.write_text('{"user_id": "u1", "item_id": "a", "user_profile": "", "item_description": "a tuner"}\n'
                     '{"user_id": "u2", "item_id": "a", "user_profile": 7, "item_description": "a tuner"}\n')
    with pytest.raises(SchemaError) as err:
        read_contexts(str(mixed))
    assert (err.value.field, err.value.row) == ("user_profile", 2)
    # Numeric ids are ids: written as text.
    pd.DataFrame({"user_id": [1], "item_id": [2], "user_profile": ["x"], "item_description": ["y"]}).to_parquet(
        tmp_path / "ids.parquet")
    assert read_contexts(str(tmp_path / "ids.parquet"))["user_id"].tolist() == ["1"]


def test_explanations_of_numbers_are_refused(tmp_path):
    t = pa.table({"example_id": ["e1"], "system": ["s"], "user_id": ["u"], "item_id": ["i"],
                  "explanation": pa.array([5.0]), "reference": pa.array([None], pa.string())})
    pq.write_table(t, tmp_path / "ex.parquet")
    with pytest.raises(SchemaError, match=r"ex\.parquet, field 'explanation': holds double values, expected text"):
        explanations_frame([str(tmp_path / "ex.parquet")])
    pq.write_table(t.set_column(4, EXPLANATIONS.field("explanation"), pa.array(["fine"])), tmp_path / "ok.parquet")
    assert explanations_frame([str(tmp_path / "ok.parquet")])["explanation"].tolist() == ["fine"]
