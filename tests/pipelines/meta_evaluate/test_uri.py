"""Meta-evaluation with its inputs and output folder on S3 (moto on 127.0.0.1): the same
files as a local run, byte for byte (the ensemble sweep's CSV, Markdown and figure
included), the output guards read from the bucket, and nothing written to local disk."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import read_parquet
from rexeval.storage import location
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate
from tests.metrics.test_ensemble import C
from tests.pipelines.meta_evaluate.test_ensemble import wide

ERRORS = "errors.parquet"


def files(root) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in location(root).iterdir() if p.name != "report.json"}


def local_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_inputs_and_out_on_s3_give_the_local_files(tmp_path, s3_root):
    src = wide(tmp_path / "wide.csv", c=[*list(C)[:-1], "four"])  # an unreadable score: an error row
    settings = dict(bootstrap=0, methods=["pearson"], ensemble_sweep=True, judge_prefixes=["a_", "b_", "c_"])
    local = run_meta_evaluate(MetaEvaluateConfig(scores=str(src), out=str(tmp_path / "out"), **settings))
    uri = f"{s3_root}/in/wide.csv"
    location(uri).write_bytes(src.read_bytes())
    before = local_files(tmp_path)
    out = f"{s3_root}/meta"
    remote = run_meta_evaluate(MetaEvaluateConfig(scores=uri, out=out, **settings))
    assert local_files(tmp_path) == before  # nothing written here
    assert remote["counts"] == local["counts"] and remote["outputs"] == local["outputs"]
    mine, theirs = files(out), files(tmp_path / "out")
    assert set(mine) == set(theirs) == set(local["outputs"]) - {"report.json"} and ERRORS in mine
    for name in set(theirs) - {ERRORS}:
        assert mine[name] == theirs[name], name
    # Error rows name the input as given: the URI there, the local path here.
    errors, here = read_parquet(f"{out}/{ERRORS}").to_pylist(), pq.read_table(tmp_path / "out" / ERRORS).to_pylist()
    assert {e["source"] for e in errors} == {uri} and {e["source"] for e in here} == {str(src)}
    assert errors == [{k: v.replace(str(src), uri) if isinstance(v, str) else v for k, v in e.items()}
                      for e in here]
    report = location(out).joinpath("report.json").read_json()
    assert report["config"]["scores"] == uri and report["config_hash"] == remote["config_hash"]
    # The guard reads the bucket's report: another config is refused, the same one reruns.
    with pytest.raises(FileExistsError, match="another config"):
        run_meta_evaluate(MetaEvaluateConfig(scores=uri, out=out, **{**settings, "methods": ["spearman"]}))
    assert run_meta_evaluate(MetaEvaluateConfig(scores=uri, out=out, **settings))["counts"] == local["counts"]
