"""`rexeval ground-truth` reads a statements table in any format (issue 50, item 1): a
CSV and a gzipped JSON-lines file under other column names, mapped with `columns`, give
the Parquet file's ground truth (the stage told by the rows: a verified one among them);
a missing column or an unknown format is named with the file, the format and the
columns found, before any work."""
from __future__ import annotations

import gzip
import json

import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.extract.config import GroundTruthConfig
from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth
from tests.pipelines.extract.test_ground_truth import SMALL, statements_table

ROWS = SMALL + [("s6", "r3", "The cable is 007 m long", "negative", "verified"),
                ("s7", "r3", "I like the colour", "positive", "verified")]
THEIRS = {"statement": "text", "review_id": "rid", "sentiment": "polarity"}  # ours -> theirs


def _write(path, columns=None) -> str:
    table = statements_table(ROWS)
    rows = [{(columns or {}).get(k, k): v for k, v in r.items()} for r in table.to_pylist()]
    name = str(path)
    if name.endswith(".parquet"):
        pq.write_table(table, path)
    elif name.endswith(".csv"):
        import csv

        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return name


def _tables(out):
    return {t: pq.read_table(out / t).to_pylist() for t in ("explanations", "sentences", "errors")}


@pytest.mark.parametrize("name", ["statements.csv", "statements.jsonl.gz"])
def test_csv_and_gzipped_json_lines_under_other_names_give_the_parquet_ground_truth(tmp_path, ray_session, name):
    want = run_ground_truth(GroundTruthConfig(input=_write(tmp_path / "s.parquet"), out=str(tmp_path / "a")),
                            progress=lambda s: None)
    got = run_ground_truth(GroundTruthConfig(input=_write(tmp_path / name, THEIRS), out=str(tmp_path / "b"),
                                             columns=THEIRS), progress=lambda s: None)
    assert want["stage"] == got["stage"] == "verified" and got["counts"] == want["counts"]
    assert want["counts"]["out"] == 1  # r3's verified statements
    assert _tables(tmp_path / "b") == _tables(tmp_path / "a")
    assert "columns" not in json.dumps(want["config"])  # no mapping: the settings as before


def test_a_missing_column_or_unknown_format_is_named_before_any_work(tmp_path):
    src = _write(tmp_path / "statements.jsonl.gz", THEIRS)
    with pytest.raises(SchemaError) as err:
        run_ground_truth(GroundTruthConfig(input=src, out=str(tmp_path / "o")), progress=lambda s: None)
    msg = str(err.value)
    assert src in msg and "JSON-lines file" in msg and "columns found:" in msg and "polarity" in msg
    odd = tmp_path / "statements.xlsx"
    odd.write_bytes(b"PK\x03\x04 not a table")
    with pytest.raises(SchemaError) as err:
        run_ground_truth(GroundTruthConfig(input=str(odd), out=str(tmp_path / "p")), progress=lambda s: None)
    assert str(odd) in str(err.value) and "parquet, csv, tsv, jsonl" in str(err.value)
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()
