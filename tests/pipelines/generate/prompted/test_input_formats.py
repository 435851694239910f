"""`rexeval generate llm` reads a reviews table of yours in any format (issue 50, item 1):
a CSV and a gzipped JSON-lines file under other column names, mapped with `columns`
(--columns), give what the Parquet file gives; a missing column names the file, the
format read and the columns found."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.schema import REVIEWS, SchemaError
from rexeval.pipelines.generate.prompted.inputs import load_inputs
from tests.doubles.planted_shop import planted_reviews
from tests.doubles.table_files import write_arrow_as

THEIRS = {"user_id": "reviewer", "item_id": "asin", "text": "body", "timestamp": "time"}  # ours -> theirs
GOOD = "This fits the way you play, so you will enjoy every practice session and every gig with it."


def _write(path, columns=None) -> str:
    return str(write_arrow_as(pa.Table.from_pylist(planted_reviews(), schema=REVIEWS), path, columns))


@pytest.mark.parametrize("name", ["reviews.csv", "reviews.jsonl.gz"])
def test_a_reviews_table_in_other_formats_and_names_gives_the_parquet_inputs(tmp_path, name):
    want = load_inputs(_write(tmp_path / "reviews.parquet"))
    got = load_inputs(_write(tmp_path / name, THEIRS), columns={**THEIRS, "explanation": "text"})
    assert len(want.targets) == 9 and got.kind == want.kind == "ingest"
    pd.testing.assert_frame_equal(got.targets, want.targets)
    pd.testing.assert_frame_equal(got.known, want.known)


def test_a_missing_column_names_the_file_the_format_and_the_columns_found(tmp_path):
    path = _write(tmp_path / "reviews.jsonl.gz", THEIRS)
    with pytest.raises(SchemaError) as err:
        load_inputs(path)  # no mapping given
    msg = str(err.value)
    assert path in msg and "JSON-lines file" in msg and "--columns" in msg
    assert "columns found: review_id, reviewer, asin, rating, time, body, summary" in msg
    path = _write(tmp_path / "reviews.csv", {"text": "body"})
    with pytest.raises(SchemaError) as err:
        load_inputs(path)
    msg = str(err.value)
    assert path in msg and "CSV file" in msg and "text" in msg and "columns found: review_id, user_id" in msg


@pytest.mark.slow
def test_generate_llm_explains_a_csv_under_other_names_as_the_parquet_file(tmp_path, ray_session):
    from rexeval.ray_jobs.cli import cli

    def run(data: str, out: str, *extra: str) -> pd.DataFrame:
        res = CliRunner().invoke(cli, ["generate", "llm", data, "--method", "user_based", "--method",
                                       "review_extract", "--out", out, "--backend", "tests.doubles.llm:ScriptedLLM",
                                       "--model", "llm=scripted-writer", "--backend-option", f"default={GOOD!r}",
                                       "--judge-service", "none", "--no-cache", *extra])
        assert res.exit_code == 0, res.output
        return pd.read_parquet(f"{out}/explanations.parquet")

    want = run(_write(tmp_path / "reviews.parquet"), str(tmp_path / "want"))
    assert len(want) > 0
    got = run(_write(tmp_path / "reviews.csv", THEIRS), str(tmp_path / "got"),
              "--columns", ",".join(f"{k}={v}" for k, v in THEIRS.items()))
    pd.testing.assert_frame_equal(got, want)
    res = CliRunner().invoke(cli, ["generate", "llm", str(tmp_path / "reviews.csv"), "--method", "user_based",
                                   "--out", str(tmp_path / "bad"), "--backend", "tests.doubles.llm:ScriptedLLM",
                                   "--model", "llm=scripted-writer", "--judge-service", "none"])
    assert res.exit_code != 0 and "reviews.csv" in res.output and "columns found: review_id, reviewer" in res.output
