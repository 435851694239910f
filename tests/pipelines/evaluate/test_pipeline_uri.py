"""`rexeval evaluate` with its inputs and output on S3 (moto on 127.0.0.1): the same
tables, figures and reports as a local run, resumed from the markers on the bucket,
and nothing written to the local disk."""
from __future__ import annotations

from pathlib import Path

import pytest

from rexeval.pipelines.core.inputs import statements_from_annotations
from rexeval.storage import location
from rexeval.pipelines.evaluate.config import EvaluateConfig
from rexeval.pipelines.evaluate.inputs import write_flip_benchmark
from rexeval.pipelines.evaluate.pipeline import run_evaluate

SCRIPTED_NLI = "tests.doubles.nli:ScriptedNLI"
# What differs between two runs on purpose: the manifests and the report record the
# inputs' paths and the time taken, an SVG its creation date.
VARIES = ("manifest.json", "report.json", "figure2.svg")


@pytest.fixture(scope="module")
def statements():
    return statements_from_annotations("pipelines/sample/statements.jsonl", stage="triplet")


def config(bench: dict[str, str], out: str) -> EvaluateConfig:
    """Three cheap families (one with statement sets, scored in process by the scripted
    NLI: no Serve), in 2 chunks of 16 per family, plus the corpus metrics."""
    return EvaluateConfig(explanations=[bench["explanations"]], references=bench["references"],
                          statements=[bench["statements"]], out=out, limit=12, bootstrap=50, chunk_size=16,
                          metrics=["statement_nli", "overlap", "corpus"], models={"nli": "scripted"},
                          nli_scorer=SCRIPTED_NLI, nli_service="none")


def files(root: str) -> dict[str, bytes]:
    base = location(root)
    return {f.relative_to(base): f.read_bytes() for f in base.walk_files() if f.name not in VARIES}


def mtime(loc):
    return loc.fs.get_file_info(loc.path).mtime


def local_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_evaluate_on_s3_matches_local_and_resumes_from_its_markers(tmp_path, s3_root, statements, ray_session):
    local_bench = write_flip_benchmark(statements, tmp_path / "bench")
    local = run_evaluate(config(local_bench, str(tmp_path / "local")), progress=lambda s: None)

    bench = write_flip_benchmark(statements, f"{s3_root}/bench")
    assert bench["references"] == f"{s3_root}/bench/ground_truth"
    before = local_files(tmp_path)
    cfg = config(bench, f"{s3_root}/out")
    rep = run_evaluate(cfg, progress=lambda s: None)
    assert local_files(tmp_path) == before  # nothing on the local disk

    got, want = files(f"{s3_root}/out"), files(str(tmp_path / "local"))
    assert got == want
    for name in ("scores.parquet", "aggregates.parquet", "tables.md", "tables.csv", "figure2.png",
                 "metric_correlations.parquet", "metric_correlations.md", "families/statement_nli/_done/part-00001.json"):
        assert name in got, name
    assert location(f"{s3_root}/out/figure2.svg").is_file()
    assert rep["counts"] == local["counts"] and rep["tables_md"] == local["tables_md"]
    assert rep["correlations_md"] == local["correlations_md"]
    top = location(f"{s3_root}/out/manifest.json").read_json()
    assert top["status"] == "complete"
    assert top["config"]["explanations"][0]["path"] == f"{s3_root}/bench/explanations.parquet"  # the URI as given

    # A chunk lost on the bucket (its shard and marker): only it is scored again.
    fam = location(f"{s3_root}/out/families/statement_nli")
    (fam / "_done" / "part-00001.json").unlink()
    (fam / "scores" / "part-00001.parquet").unlink()
    kept = mtime(fam / "scores" / "part-00000.parquet")
    assert kept is not None
    lines: list[str] = []
    run_evaluate(cfg, progress=lines.append)
    assert any("statement_nli: 24 examples in 2 chunk(s), 1 already done" in ln for ln in lines), lines
    assert any("overlap: already done" in ln for ln in lines), lines
    assert mtime(fam / "scores" / "part-00000.parquet") == kept
    assert files(f"{s3_root}/out") == want
    assert local_files(tmp_path) == before
