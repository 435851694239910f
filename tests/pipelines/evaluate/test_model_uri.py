"""A model given to `rexeval evaluate` as a URI reaches the family actors as the URI: the
driver copies nothing, each actor loads its own node's copy, and the scores equal those
of the same model read from a local folder."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.inputs import statements_from_annotations
from rexeval.storage import location
from rexeval.pipelines.evaluate.config import EvaluateConfig
from rexeval.pipelines.evaluate.inputs import write_flip_benchmark
from rexeval.pipelines.evaluate.pipeline import run_evaluate


@pytest.mark.slow
def test_a_family_model_at_a_uri_is_copied_by_the_actors_not_the_driver(tmp_path, s3_root, ray_session,
                                                                        monkeypatch):
    from rexeval.models import fetch
    from tests.doubles.tiny_encoders import build_tiny_bert

    src = build_tiny_bert(tmp_path / "tiny-sts", 1)
    uri = f"{s3_root}/models/tiny-sts"
    location(uri).upload(src)
    statements = statements_from_annotations("pipelines/sample/statements.jsonl", stage="triplet")
    bench = write_flip_benchmark(statements, tmp_path / "bench")

    def scores(model: str, out: str) -> list:
        run_evaluate(EvaluateConfig(explanations=[bench["explanations"]], references=bench["references"],
                                    statements=[bench["statements"]], out=out, limit=8, bootstrap=20,
                                    chunk_size=16, metrics=["sts"], models={"sts": model}, nli_service="none"),
                     progress=lambda s: None)
        rows = pq.read_table(f"{out}/scores.parquet", columns=["example_id", "system", "metric", "value"])
        return sorted((r["example_id"], r["system"], r["metric"], r["value"]) for r in rows.to_pylist())

    local = scores(str(src), str(tmp_path / "local"))
    monkeypatch.setattr(fetch, "fetch", lambda *a, **k: pytest.fail("the driver copied the model"))
    assert fetch.fetched(uri) is None
    assert scores(uri, str(tmp_path / "from-uri")) == local and any(v is not None for *_, v in local)
    assert fetch.fetched(uri) is not None  # the actors' copy (on this one machine, this cache)
