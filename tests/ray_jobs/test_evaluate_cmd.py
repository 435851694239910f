"""`rexeval evaluate` given URIs on the command line (the test S3 endpoint): inputs are
checked through storage, not the local disk, and every output lands under the URI."""
from __future__ import annotations

from click.testing import CliRunner

from rexeval.pipelines.core.inputs import statements_from_annotations
from rexeval.storage import location
from rexeval.pipelines.evaluate.inputs import write_flip_benchmark
from rexeval.ray_jobs.evaluate import evaluate_cmd


def test_help_says_paths_may_be_uris():
    res = CliRunner().invoke(evaluate_cmd, ["--help"])
    assert res.exit_code == 0 and "s3://" in res.output


def test_a_missing_uri_is_a_usage_error(s3_root):
    res = CliRunner().invoke(evaluate_cmd, [f"{s3_root}/nothing.parquet", "--out", f"{s3_root}/o"])
    assert res.exit_code == 2 and "does not exist" in res.output
    bench = write_flip_benchmark(statements_from_annotations("pipelines/sample/statements.jsonl", stage="triplet"),
                                 f"{s3_root}/bench")
    res = CliRunner().invoke(evaluate_cmd, [bench["explanations"], "--references", bench["explanations"],
                                            "--out", f"{s3_root}/o"])
    assert res.exit_code == 2 and "a folder is expected" in res.output


def test_evaluate_from_uris(s3_root, ray_session):
    bench = write_flip_benchmark(statements_from_annotations("pipelines/sample/statements.jsonl", stage="triplet"),
                                 f"{s3_root}/bench")
    out = f"{s3_root}/eval"
    res = CliRunner().invoke(evaluate_cmd, [bench["explanations"], "--references", bench["references"],
                                            "--statements", bench["statements"], "--out", out,
                                            "--metrics", "overlap", "--limit", "3", "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    names = {f.relative_to(location(out)) for f in location(out).walk_files()}
    assert {"scores.parquet", "aggregates.parquet", "tables.md", "tables.csv", "report.json",
            "metric_correlations.csv", "manifest.json"} <= names
    assert (location(out) / "manifest.json").read_json()["counts"]["scores"] > 0
