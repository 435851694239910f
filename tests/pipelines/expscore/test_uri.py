"""ExpScore train and score with inputs, output and the model folder on S3 (moto on
127.0.0.1): the same model files, scores and reports as a local run, the model read
back from the bucket for scoring, and nothing written to the local disk."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import read_parquet
from rexeval.storage import location
from rexeval.pipelines.expscore import pipeline as ep
from tests.doubles.encoder import HashingEncoder
from tests.pipelines.expscore.test_pipeline import data, train_cfg  # noqa: F401  (the module's fixture)

QUIET = dict(encoder=HashingEncoder(), progress=lambda m: None)


def local_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def rows(table, renamed: dict[str, str]) -> list[dict]:
    """A table's rows with the inputs named as on the bucket (rows name the paths given)."""
    def text(v):
        for given, uri in renamed.items():
            v = v.replace(given, uri)
        return v

    return [{k: text(v) if isinstance(v, str) else v for k, v in r.items()} for r in table.to_pylist()]


@pytest.mark.slow
def test_train_and_score_on_s3_match_local(data, tmp_path, s3_root):  # noqa: F811
    local = tmp_path / "train"
    report = ep.run_train(train_cfg(data, local), **QUIET)
    rated, reviews = f"{s3_root}/in/rated.jsonl", f"{s3_root}/in/ingest/reviews/part-00000.parquet"
    location(rated).write_bytes(data["rated"].read_bytes())
    location(reviews).write_bytes(data["reviews"].read_bytes())
    renamed = {str(data["rated"]): rated, str(data["reviews"]): f"{s3_root}/in/ingest"}
    before = local_files(tmp_path)
    out = f"{s3_root}/train"
    cfg = train_cfg(data, out).model_copy(update={"inputs": [rated], "reviews": f"{s3_root}/in/ingest"})
    assert ep.run_train(cfg, **QUIET) == report
    assert local_files(tmp_path) == before  # the heads went to the bucket by way of a temporary folder
    assert location(f"{out}/manifest.json").read_json()["status"] == "complete"
    # The model folder: every file the same bytes (weights included), at the same keys.
    model = location(f"{out}/model")
    theirs = {str(p.relative_to(local / "model")): p.read_bytes() for p in (local / "model").rglob("*") if p.is_file()}
    assert {f.relative_to(model): f.read_bytes() for f in model.walk_files()} == theirs
    for name in ("report.json", "report.md"):
        assert location(f"{out}/{name}").read_bytes() == (local / name).read_bytes(), name
    for name in ("scores.parquet", "errors.parquet"):
        assert read_parquet(f"{out}/{name}").to_pylist() == rows(pq.read_table(local / name), renamed), name

    # Scoring with the bucket's model, into the bucket.
    def score_cfg(inputs, out, model):
        return ep.ExpScoreScoreConfig(inputs=[inputs], out=out, reviews=str(data["reviews"]), model=model,
                                      max_reviews_per_item=5)

    here = ep.run_score(score_cfg(str(data["rated"]), str(tmp_path / "s"), str(local / "model")), **QUIET)
    before = local_files(tmp_path)
    there = ep.run_score(score_cfg(rated, f"{s3_root}/s", f"{out}/model"), **QUIET)
    assert local_files(tmp_path) == before  # nothing written here: the model was read from the bucket
    assert {**there, "model": None} == {**here, "model": None} and there["model"] == f"{out}/model"
    assert read_parquet(f"{s3_root}/s/scores.parquet").to_pylist() == rows(
        pq.read_table(tmp_path / "s" / "scores.parquet"), {str(data["rated"]): rated})
    # One head's folder, by URI, as the model.
    one = ep.run_score(score_cfg(rated, f"{s3_root}/s1", f"{out}/model/linear"), **QUIET)
    assert one["heads"] == {"linear": here["heads"]["linear"]}
