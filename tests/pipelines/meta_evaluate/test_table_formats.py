"""meta-evaluate reads its tables in any format `pipelines/core/table_formats.py` tells
(Parquet, CSV, TSV, JSON lines, gzipped or not) under the user's own column names
(`columns`, --columns): seed 001's human ratings as a CSV or a gzipped JSON-lines file
under other names give the same results as the Parquet one; an unknown format or a
missing column is refused naming the file, the format tried and the columns found."""
from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.inputs import read_input
from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate
from rexeval.ray_jobs.meta_evaluate import meta_evaluate_cmd
from tests.doubles.table_files import write_frame_as
from tests.pipelines.meta_evaluate.test_pipeline import EXPLANATIONS, HUMAN, likert_long

THEIRS = {"user_id": "uid", "item_id": "iid", "system": "model", "human_persuasiveness": "persuasive",
          "human_transparency": "transparent"}


def _ratings() -> pd.DataFrame:
    df = pd.DataFrame(EXPLANATIONS, columns=["user_id", "item_id", "system"])
    for aspect, values in HUMAN.items():
        df[f"human_{aspect}"] = values
    return df


def _results(tmp_path, name: str, human, **settings) -> pd.DataFrame:
    scores = tmp_path / "likert_scores.parquet"
    likert_long().to_parquet(scores)
    out = tmp_path / name
    run_meta_evaluate(MetaEvaluateConfig(scores=str(scores), human=str(human), out=str(out), bootstrap=20,
                                         **settings))
    return pd.read_parquet(out / "meta_evaluation.parquet")


@pytest.mark.parametrize("name", ["ratings.csv", "ratings.jsonl.gz", "ratings.csv.gz", "ratings.jsonl"])
def test_human_ratings_in_other_formats_and_names_give_the_parquet_results(tmp_path, name):
    want = _results(tmp_path, "ours", write_frame_as(_ratings(), tmp_path / "ratings.parquet"))
    theirs = write_frame_as(_ratings().rename(columns=THEIRS), tmp_path / name)
    got = _results(tmp_path, "theirs", theirs, columns=THEIRS)
    pd.testing.assert_frame_equal(got, want)
    assert len(got) and set(got["evaluator"]) == {"org/model-a", "model_b"}


def test_one_gzipped_json_lines_table_with_both_sides_under_its_own_names(tmp_path):
    df = _ratings()
    df["judge_persuasiveness"] = [4, 2, 5, 1, 3, 3, 4, 2]
    want_out, got_out = tmp_path / "ours", tmp_path / "theirs"
    run_meta_evaluate(MetaEvaluateConfig(scores=str(write_frame_as(df, tmp_path / "one.parquet")), out=str(want_out),
                                         bootstrap=0))
    theirs = write_frame_as(df.rename(columns=THEIRS | {"judge_persuasiveness": "gpt_says"}), tmp_path / "one.jsonl.gz")
    res = CliRunner().invoke(meta_evaluate_cmd, [str(theirs), "--out", str(got_out), "--bootstrap", "0",
                                                 "--columns", "user_id=uid,item_id=iid,system=model",
                                                 "--columns", "human_persuasiveness=persuasive,"
                                                              "judge_persuasiveness=gpt_says"])
    assert res.exit_code == 0, res.output
    pd.testing.assert_frame_equal(pd.read_parquet(got_out / "meta_evaluation.parquet"),
                                  pd.read_parquet(want_out / "meta_evaluation.parquet"))


def test_a_missing_column_names_the_file_the_format_and_the_columns_found(tmp_path):
    theirs = write_frame_as(_ratings().rename(columns=THEIRS), tmp_path / "ratings.csv")
    with pytest.raises(SchemaError) as err:
        _results(tmp_path, "out", theirs, columns={"user_id": "uid", "item_id": "iid"})  # system unmapped
    text = str(err.value)
    assert str(theirs) in text and "CSV file, columns found: user_id, item_id, model, persuasive" in text
    assert "--columns" in text
    gz = write_frame_as(_ratings().rename(columns=THEIRS), tmp_path / "ratings.jsonl.gz")
    res = CliRunner().invoke(meta_evaluate_cmd, [str(tmp_path / "likert_scores.parquet"), "--human", str(gz),
                                                 "--out", str(tmp_path / "o2"), "--columns", "system=model,user_id=uid"])
    assert res.exit_code == 2 and "Traceback" not in res.output  # item_id unmapped
    assert f"{gz}, field 'item_id': required key column is missing (JSON-lines file, columns found: user_id, iid, system" \
        in res.output


def test_an_unknown_or_mislabelled_file_is_refused_with_the_format_tried(tmp_path):
    odd = tmp_path / "ratings.xlsx"
    odd.write_bytes(b"PK\x03\x04 a spreadsheet")
    with pytest.raises(SchemaError, match=r"ratings\.xlsx: not a table in a format rexeval reads \(parquet, csv, "
                                          r"tsv, jsonl, optionally \.gz\)"):
        read_input(odd)
    fake = tmp_path / "ratings.parquet"
    fake.write_text("user_id,item_id\nu1,i1\n")
    with pytest.raises(SchemaError, match=r"ratings\.parquet: not a readable Parquet file \(named \.parquet"):
        read_input(fake)
    notgz = tmp_path / "ratings.jsonl.gz"
    notgz.write_text('{"user_id": "u1"}\n')
    with pytest.raises(SchemaError, match=r"ratings\.jsonl\.gz: named \.gz but not gzip"):
        read_input(notgz)
    res = CliRunner().invoke(meta_evaluate_cmd, [str(odd), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "ratings.xlsx" in res.output and "parquet, csv, tsv, jsonl" in res.output


def test_columns_flag_is_checked(tmp_path):
    one = write_frame_as(_ratings(), tmp_path / "r.csv")
    res = CliRunner().invoke(meta_evaluate_cmd, [str(one), "--out", str(tmp_path / "o"), "--columns", "user_id"])
    assert res.exit_code == 2 and "OURS=THEIRS" in res.output
