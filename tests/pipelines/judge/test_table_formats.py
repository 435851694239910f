"""The judges' own tables (contexts, detect's interactions, reviews) in any table format
(issue 50, item 1): a CSV and a gzipped JSON-lines file under other column names, mapped
with `columns`, give what the Parquet file gives; an unknown format or a missing column
names the file, the format read and the columns found."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.judge.config import DetectJobConfig
from rexeval.pipelines.judge.inputs import load_contexts, read_contexts
from rexeval.pipelines.judge.jobs import detect_contexts

CTX = pd.DataFrame({"user_id": ["u1", "u2", "007"], "item_id": ["i1", "i2", "i3"],
                    "user_profile": ["bought strings", "", "a capo, picks"],
                    "item_description": ["a tuner", "a cable, 3 m", "a \"quiet\" amp"]})
THEIRS = {"user_id": "uid", "item_id": "asin", "item_description": "title"}  # ours -> theirs
INTER = pd.DataFrame({"user_id": ["007", "u1"], "item_id": ["i3", "i1"]})


def _write(df: pd.DataFrame, path, columns=None):
    df = df.rename(columns={ours: theirs for ours, theirs in (columns or {}).items()})
    name = str(path)
    if name.endswith(".parquet"):
        df.to_parquet(path)
    elif name.endswith(".csv"):
        df.to_csv(path, index=False)
    elif name.endswith(".tsv"):
        df.to_csv(path, index=False, sep="\t")
    else:
        lines = "".join(json.dumps(r) + "\n" for r in df.to_dict("records"))
        path.write_bytes(gzip.compress(lines.encode()) if name.endswith(".gz") else lines.encode())
    return str(path)


@pytest.mark.parametrize("name", ["ctx.csv", "ctx.jsonl.gz", "ctx.tsv"])
def test_contexts_in_other_formats_and_names_read_as_the_parquet_ones(tmp_path, name):
    want = read_contexts(_write(CTX, tmp_path / "ctx.parquet"))
    got = read_contexts(_write(CTX, tmp_path / name, THEIRS), THEIRS)
    pd.testing.assert_frame_equal(got, want)
    assert got["user_id"].tolist()[2] == "007"  # an id stays as written
    inter = CTX[["user_id", "item_id"]]
    pd.testing.assert_frame_equal(load_contexts(str(tmp_path / name), [], inter, columns=THEIRS), want)


@pytest.mark.parametrize("name", ["inter.csv", "inter.jsonl.gz"])
def test_detect_interactions_and_contexts_in_other_formats(tmp_path, name):
    want = detect_contexts(DetectJobConfig(contexts=_write(CTX, tmp_path / "ctx.parquet"),
                                           interactions=_write(INTER, tmp_path / "inter.parquet"),
                                           out=str(tmp_path / "out")))
    assert want["user_id"].tolist() == ["007", "u1"]
    ctx = "ctx.jsonl.gz" if name.endswith(".csv") else "ctx.csv"
    got = detect_contexts(DetectJobConfig(contexts=_write(CTX, tmp_path / ctx, THEIRS),
                                          interactions=_write(INTER, tmp_path / name, THEIRS),
                                          columns=THEIRS, out=str(tmp_path / "out")))
    pd.testing.assert_frame_equal(got, want)


def test_a_mapping_renames_only_the_tables_own_columns(tmp_path):
    """One mapping serves the explanations and the contexts: explanation=title never
    turns the contexts' title into an explanation column."""
    columns = {**THEIRS, "explanation": "item_description"}
    path = _write(CTX, tmp_path / "ctx.csv", THEIRS)
    assert read_contexts(path, columns)["item_description"].tolist() == CTX["item_description"].tolist()


def test_a_missing_column_names_the_file_the_format_and_the_columns_found(tmp_path):
    path = _write(CTX, tmp_path / "ctx.jsonl.gz", THEIRS)
    with pytest.raises(SchemaError) as err:
        read_contexts(path)  # no mapping given
    msg = str(err.value)
    assert path in msg and "JSON-lines file" in msg and "columns found: uid, asin, user_profile, title" in msg
    assert "--columns" in msg
    inter = _write(INTER.rename(columns={"item_id": "asin"}), tmp_path / "inter.csv")
    with pytest.raises(SchemaError) as err:
        detect_contexts(DetectJobConfig(contexts=_write(CTX, tmp_path / "ctx.parquet"), interactions=inter,
                                        out=str(tmp_path / "out")))
    msg = str(err.value)
    assert inter in msg and "CSV file" in msg and "item_id" in msg and "columns found: user_id, asin" in msg


def test_an_unknown_or_mislabelled_format_is_named(tmp_path):
    odd = tmp_path / "ctx.xlsx"
    odd.write_bytes(b"PK\x03\x04 not a table")
    with pytest.raises(SchemaError) as err:
        read_contexts(str(odd))
    assert str(odd) in str(err.value) and "parquet, csv, tsv, jsonl" in str(err.value)
    fake = tmp_path / "ctx.jsonl"
    fake.write_text("user_id,item_id\nu1,i1\n")
    with pytest.raises(SchemaError) as err:
        read_contexts(str(fake))
    assert str(fake) in str(err.value) and "JSON lines" in str(err.value)
    notgz = tmp_path / "ctx.csv.gz"
    notgz.write_text("user_id,item_id\nu1,i1\n")
    with pytest.raises(SchemaError) as err:
        read_contexts(str(notgz))
    assert str(notgz) in str(err.value) and "gzip" in str(err.value)
