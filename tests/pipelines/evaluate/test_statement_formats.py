"""`evaluate --statements` maps its column names too (issue 50, item 1): a statements
table as CSV or gzipped JSON lines under other names, with the same `columns` mapping
as the explanations (each table takes its own columns' entries), builds the Parquet
file's examples; a missing column names the file, the format and the columns found."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.inputs import read_explanations
from rexeval.pipelines.evaluate.inputs import build_examples
from tests.pipelines.evaluate.test_inputs import bench  # noqa: F401  (the module's fixture)

THEIRS = {"statement": "text", "sentiment": "polarity", "explanation": "output"}  # explanation=: not this table's


def _write(rows: list[dict], path) -> str:
    rows = [{THEIRS.get(k, k): v for k, v in r.items()} for r in rows]
    if str(path).endswith(".csv"):
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return str(path)


@pytest.mark.parametrize("name", ["st.csv", "st.jsonl.gz"])
def test_statements_in_other_formats_and_names_build_the_parquet_examples(bench, tmp_path, name):  # noqa: F811
    paths, _ = bench
    expl = read_explanations([paths["explanations"]])
    want_ex, want_err, want_counts = build_examples(expl, paths["references"], [paths["statements"]])
    rows = pq.read_table(paths["statements"]).to_pylist()
    got_ex, got_err, got_counts = build_examples(expl, paths["references"], [_write(rows, tmp_path / name)],
                                                 columns=THEIRS)
    assert got_counts == want_counts and got_err.num_rows == want_err.num_rows == 0
    keep = ["system", "example_id", "gen_sentences", "ref_sentences"]
    assert got_ex.select(keep).to_pylist() == want_ex.select(keep).to_pylist()
    assert any(r["gen_sentences"] for r in got_ex.to_pylist())


def test_a_missing_statement_column_names_the_file_the_format_and_the_columns_found(bench, tmp_path):  # noqa: F811
    paths, _ = bench
    expl = read_explanations([paths["explanations"]])
    src = _write(pq.read_table(paths["statements"]).to_pylist(), tmp_path / "st.csv")
    with pytest.raises(SchemaError) as err:
        build_examples(expl, paths["references"], [src])  # no mapping
    msg = str(err.value)
    assert src in msg and "CSV file" in msg and "columns found:" in msg and "polarity" in msg


def test_a_gzipped_json_lines_column_under_another_name_names_the_columns_found(bench, tmp_path):  # noqa: F811
    """As the CSV path does (io.validated): the line, the format read, the fields found
    there and how to map them, for a field of theirs and for one of ours that is absent."""
    paths, _ = bench
    expl = read_explanations([paths["explanations"]])
    rows = pq.read_table(paths["statements"]).to_pylist()
    src = _write(rows, tmp_path / "st.jsonl.gz")
    with pytest.raises(SchemaError) as err:
        build_examples(expl, paths["references"], [src])  # no mapping
    msg = str(err.value)
    found = ", ".join(THEIRS.get(k, k) for k in rows[0])
    assert src in msg and "row 1" in msg and "unexpected field" in msg
    assert f"JSON-lines file, columns found: {found}" in msg and "--columns OURS=YOURS" in msg
    # Only the statement's column under another name, mapped: the rest map to ours, and
    # a required field absent from a line names the fields found too.
    src = _write([{k: v for k, v in r.items() if k != "statement"} for r in rows], tmp_path / "nost.jsonl.gz")
    with pytest.raises(SchemaError) as err:
        build_examples(expl, paths["references"], [src], columns=THEIRS)
    msg = str(err.value)
    assert src in msg and "statement" in msg and "required field is missing" in msg
    assert "JSON-lines file, columns found: " in msg and "polarity" in msg
