"""The real local LLM (SmolLM2-135M through the hf backend) on real reviews."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rexeval.pipelines.extract.pipeline import run_extract
from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.pipelines.ingest.pipeline import run_ingest
from rexeval.pipelines.ingest.config import IngestConfig
from rexeval.pipelines.core.io import read_table


@pytest.mark.slow
def test_smollm2_extracts_schema_valid_rows_from_three_shared_reviews(tmp_path, shared_csv,
                                                                       ray_session):
    run_ingest(IngestConfig(inputs=[str(shared_csv)], out=str(tmp_path / "ingest"),
                            category="instruments"), progress=lambda s: None)
    # Three reviews of the shared data: the first three in file order.
    m = run_extract(ExtractConfig(input=str(tmp_path / "ingest"), out=str(tmp_path / "out"),
                                  limit=3, max_tokens=160, shard_size=3,
                                  cache=str(tmp_path / "cache.sqlite")),
                    progress=lambda s: None)
    statements = read_table(tmp_path / "out" / "statements", "statements")  # schema-checked
    errors = read_table(tmp_path / "out" / "errors", "errors")
    c = m["counts"]
    assert c["in"] == 3 and c["in"] == c["out"] + c["errors"]
    reviews = read_table(tmp_path / "ingest" / "reviews", "reviews").slice(0, 3)
    ids = set(reviews.column("review_id").to_pylist())
    ended = set(statements.column("review_id").to_pylist()) | set(errors.column("row_id").to_pylist())
    assert ended == ids
    from rexeval.prompts import load_domain

    topics = set(load_domain("instruments").topic_names)
    for row in statements.to_pylist():
        assert row["sentiment"] in ("positive", "negative", "neutral")
        assert row["topic"] in topics  # constrained to the list, or mapped onto it
        prov = json.loads(row["provenance"])
        assert prov["model"] == "SmolLM2-135M-Instruct" and prov["backend"] == "hf"
    # Errors, if any, carry the reason and the raw model output.
    for e in errors.to_pylist():
        assert e["error_type"] and e["message"]
    # A re-run into a new folder is served by the cache: no new model call.
    m2 = run_extract(ExtractConfig(input=str(tmp_path / "ingest"), out=str(tmp_path / "out2"),
                                   limit=3, max_tokens=160, shard_size=3,
                                   cache=str(tmp_path / "cache.sqlite")),
                     progress=lambda s: None)
    assert m2["counts"]["cached_calls"] == m2["counts"]["llm_calls"] > 0
    assert pc.sum(pa.array([m2["counts"]["statements"]])).as_py() == c["statements"]
