"""The shared input readers (pipelines/core/inputs.py) on a local folder and on an S3
endpoint."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from rexeval.pipelines.core.inputs import (
    check_schemas, file_record, given_text, resolve_stage, resolved_text, reviews_path,
    statement_files, statements_from_annotations)
from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import STATEMENTS, SchemaError
from rexeval.storage import location

SAMPLE = Path(__file__).resolve().parents[3] / "pipelines" / "sample" / "statements.jsonl"


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_root")


def test_paths_as_given_and_as_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "r.json").write_bytes(b"12345")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    assert given_text("./data/r.json") == "data/r.json"  # relative stays relative (rows' source)
    assert given_text("s3://bucket/x/r.json") == "s3://bucket/x/r.json"
    assert given_text("file:///tmp/r.json") == "/tmp/r.json"
    assert resolved_text("link/r.json") == str((tmp_path / "data" / "r.json").resolve())
    assert resolved_text("s3://bucket/x/r.json") == "s3://bucket/x/r.json"
    assert file_record("link/r.json") == {"path": str((tmp_path / "data" / "r.json").resolve()), "size": 5}


def test_file_record_of_a_uri_keeps_it_and_reads_its_size(s3_root):
    (location(s3_root) / "r.json").write_bytes(b"123")
    assert file_record(f"{s3_root}/r.json") == {"path": f"{s3_root}/r.json", "size": 3}


def _statements(stage: str) -> pa.Table:
    return statements_from_annotations(SAMPLE, stage=stage)


def test_statement_shards_are_found_checked_and_staged_the_same_way(root):
    base = location(root)
    write_parquet_atomic(base / "extract" / "statements" / "part-00000.parquet", _statements("triplet"))
    write_parquet_atomic(base / "extract" / "statements" / "part-00001.parquet", _statements("verified"))
    files = statement_files(f"{root}/extract")
    assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet"]
    check_schemas(files)
    assert resolve_stage(files, "auto") == "verified" and resolve_stage(files[:1], "auto") == "triplet"
    write_parquet_atomic(base / "bad.parquet", pa.table({"x": [1]}))
    with pytest.raises(SchemaError):
        check_schemas([base / "bad.parquet"])
    with pytest.raises(FileNotFoundError, match="statements input not found"):
        statement_files(f"{root}/missing")


def test_reviews_path_takes_an_ingest_folder_or_a_table(root):
    base = location(root)
    (base / "ingest" / "reviews" / "part-00000.parquet").write_parquet(pa.table({"x": [1]}))
    assert reviews_path(f"{root}/ingest") == base / "ingest" / "reviews"
    assert reviews_path(f"{root}/ingest/reviews/part-00000.parquet") == base / "ingest" / "reviews" / "part-00000.parquet"
    with pytest.raises(FileNotFoundError, match="no such input"):
        reviews_path(f"{root}/nothing")


def test_annotations_from_a_uri_name_it_in_provenance_and_errors(s3_root):
    uri = f"{s3_root}/statements.jsonl"
    location(uri).upload(SAMPLE)
    local = statements_from_annotations(SAMPLE)
    remote = statements_from_annotations(uri)
    assert remote.schema == STATEMENTS and remote.num_rows == local.num_rows > 0
    assert remote.drop_columns(["provenance"]) == local.drop_columns(["provenance"])
    assert {json.loads(p)["source"] for p in remote.column("provenance").to_pylist()} == {uri}
    assert {json.loads(p)["source"] for p in local.column("provenance").to_pylist()} == {str(SAMPLE)}
    bad = f"{s3_root}/bad.jsonl"
    location(bad).write_text(json.dumps({"user_id": "u", "item_id": "i", "timestamp": 1,
                                         "statements": [{"statement": "ok", "sentiment": "great"}]}) + "\n")
    with pytest.raises(SchemaError) as err:
        statements_from_annotations(bad)
    assert bad in str(err.value) and "statements[0].sentiment" in str(err.value)
