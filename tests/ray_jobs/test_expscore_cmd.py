"""`rexeval expscore train|score` through click, on the project's sample reviews: each
review's summary line is an explanation of its item, rated with the review's stars."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.expscore import expscore_group
from tests.doubles.encoder import HashingEncoder

SAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "sample" / "reviews.jsonl"


@pytest.fixture(autouse=True)
def fake_encoder(monkeypatch):
    """The factor stage builds its encoder through build_embedder: hand it the fake."""
    from rexeval.models.encoders import embedder

    monkeypatch.setattr(embedder, "build_embedder", lambda ref, device="auto", **kw: HashingEncoder())


@pytest.fixture(scope="module")
def rated(tmp_path_factory) -> Path:
    reviews = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    by_item = defaultdict(list)
    for r in reviews:
        by_item[r["asin"]].append(r["reviewText"])
    path = tmp_path_factory.mktemp("cli") / "rated.jsonl"
    rows = [{"explanation": r["summary"], "item_id": r["asin"], "rating": r["overall"],
             "reviews": by_item[r["asin"]][:4]} for r in reviews[:80]]
    rows.append({"explanation": "", "item_id": reviews[0]["asin"], "rating": 3, "reviews": ["x"]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_help_lists_commands_and_examples():
    res = CliRunner().invoke(expscore_group, ["--help"])
    assert res.exit_code == 0 and "train" in res.output and "score" in res.output
    res = CliRunner().invoke(expscore_group, ["train", "--help"])
    assert res.exit_code == 0
    assert "rexeval expscore train rated.jsonl" in res.output and "[linear|logistic|nn|all]" in res.output
    assert "--languagetool" in res.output


def test_train_then_score(rated, tmp_path):
    runner = CliRunner()
    out = tmp_path / "es"
    res = runner.invoke(expscore_group, ["train", str(rated), "--reviews-column", "reviews", "--head", "all",
                                         "--max-epochs", "150", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "ExpScore (nn)" in res.output and "== expscore train" in res.output
    assert "note: GC (grammar correctness) unavailable, so trained and scored without it" in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["counts"] == {"rows_in": 81, "scored": 80, "errors": 1, "train": 64, "test": 16}
    res = runner.invoke(expscore_group, ["score", str(rated), "--model", str(out / "model"), "--head", "linear",
                                         "--reviews-column", "reviews", "--out", str(tmp_path / "sc")])
    assert res.exit_code == 0, res.output
    scores = pq.read_table(tmp_path / "sc" / "scores.parquet").to_pandas()
    assert len(scores) == 80 and scores["expscore_linear"].notna().all() and scores["expscore_nn"].isna().all()


def test_config_file_and_flag_override(rated, tmp_path):
    cfg = tmp_path / "es.yaml"
    cfg.write_text(f"inputs: [{rated}]\nreviews_column: reviews\nhead: nn\nmax_epochs: 20\nout: {tmp_path / 'a'}\n")
    res = CliRunner().invoke(expscore_group, ["train", "--config", str(cfg), "--head", "linear"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "a" / "model").iterdir()) == ["factors.json", "linear"]


def test_user_errors_are_one_line(rated, tmp_path):
    runner = CliRunner()
    res = runner.invoke(expscore_group, ["train", str(rated), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "give the item reviews" in res.output
    res = runner.invoke(expscore_group, ["train", str(rated), "--reviews-column", "reviews", "--head", "svm",
                                         "--out", str(tmp_path / "y")])
    assert res.exit_code == 2 and "svm" in res.output
    (tmp_path / "not-a-model").mkdir()
    res = runner.invoke(expscore_group, ["score", str(rated), "--model", str(tmp_path / "not-a-model"),
                                         "--reviews-column", "reviews", "--out", str(tmp_path / "z")])
    assert res.exit_code == 2 and "not an ExpScore model folder" in res.output
    res = runner.invoke(expscore_group, ["train", "--out", str(tmp_path / "w")])
    assert res.exit_code == 2 and "inputs" in res.output
