"""`rexeval star build` reads its statements and reviews in any format `runtime.read_dataset`
reads (Parquet, CSV, TSV, gzipped JSON lines) under the user's own column names
(--columns): a statements CSV and a gzipped JSON-lines reviews file give the benchmark
the Parquet files give; a missing column is refused naming the file, the format and the
columns found, before any work."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.star.config import BuildConfig
from rexeval.pipelines.star.pipeline import run_build
from rexeval.ray_jobs.star import build_cmd
from tests.doubles.table_files import write_arrow_as
from tests.pipelines.star.test_build import CLUSTERS_T, REVIEWS_T, STATEMENTS_T

THEIRS = {"review_id": "rid", "statement": "text", "user_id": "reviewer", "timestamp": "time"}
TABLES = ("interactions", "triplets", "candidates")


def _build(tmp_path, out: str, statements, reviews, **cfg) -> dict[str, list[dict]]:
    clusters = tmp_path / "clusters"
    if not clusters.exists():
        (clusters / "clusters").mkdir(parents=True)
        pq.write_table(CLUSTERS_T, clusters / "clusters" / "part-00000.parquet")
    run_build(BuildConfig(statements=str(statements), reviews=str(reviews), clusters=str(clusters),
                          out=str(tmp_path / out), name="toy", **cfg), progress=lambda _: None)
    got = {n: pq.read_table(tmp_path / out / n).to_pylist() for n in TABLES}
    got["errors"] = sorted((r["row_id"], r["error_type"]) for r in pq.read_table(tmp_path / out / "errors").to_pylist())
    return got


@pytest.mark.parametrize("statements,reviews", [("statements.csv", "reviews.jsonl.gz"),
                                                ("statements.jsonl.gz", "reviews.csv")])
def test_statements_and_reviews_in_other_formats_and_names_build_the_parquet_benchmark(tmp_path, ray_session,
                                                                                       statements, reviews):
    want = _build(tmp_path, "ours", write_arrow_as(STATEMENTS_T, tmp_path / "statements.parquet"),
                  write_arrow_as(REVIEWS_T, tmp_path / "reviews.parquet"))
    assert want["interactions"] and want["errors"] == [("s10", "unknown_review"), ("s11", "no_cluster")]
    # `statement=text` renames the statements' text only: the reviews' own `text` stays theirs
    got = _build(tmp_path, "theirs", write_arrow_as(STATEMENTS_T, tmp_path / statements, THEIRS),
                 write_arrow_as(REVIEWS_T, tmp_path / reviews, THEIRS), columns=THEIRS)
    assert got == want


def test_a_missing_column_is_refused_naming_the_file_the_format_and_the_columns(tmp_path, ray_session):
    st = write_arrow_as(STATEMENTS_T, tmp_path / "statements.csv", THEIRS)
    rv = write_arrow_as(REVIEWS_T, tmp_path / "reviews.parquet")
    with pytest.raises(SchemaError) as err:
        _build(tmp_path, "o", st, rv, columns={"review_id": "rid"})  # statement left unmapped
    text = str(err.value)
    assert str(st) in text and "CSV file, columns found: statement_id, review_id, reviewer, item_id, text" in text
    assert not (tmp_path / "o").exists()
    res = CliRunner().invoke(build_cmd, [str(st), "--reviews", str(rv), "--out", str(tmp_path / "o2"),
                                         "--columns", "review_id=rid,statement=text,user_id=reviewer"])
    assert res.exit_code == 0, res.output
