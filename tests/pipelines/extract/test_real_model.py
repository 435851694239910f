"""The real local LLM (SmolLM2-135M through the hf backend) on real reviews."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.extract.pipeline import run_extract
from tests.conftest import SMOLLM2_REVIEWS


@pytest.mark.slow
def test_smollm2_extracts_schema_valid_rows_from_the_first_shared_reviews(smollm2_extraction, tmp_path):
    """The session's extraction (tests/conftest.py): the first shared reviews, in file
    order, through SmolLM2 on the hf backend."""
    ext = smollm2_extraction
    m, n = ext["manifest"], SMOLLM2_REVIEWS
    statements = read_table(ext["out"] / "statements", "statements")  # schema-checked
    errors = read_table(ext["out"] / "errors", "errors")
    c = m["counts"]
    assert c["in"] == n and c["in"] == c["out"] + c["errors"]
    reviews = read_table(ext["ingest"] / "reviews", "reviews").slice(0, n)
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
    m2 = run_extract(ext["config"].model_copy(update={"out": str(tmp_path / "out2")}), progress=lambda s: None)
    assert m2["counts"]["cached_calls"] == m2["counts"]["llm_calls"] > 0
    assert pc.sum(pa.array([m2["counts"]["statements"]])).as_py() == c["statements"]
