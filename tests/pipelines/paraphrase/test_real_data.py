"""The cluster job on real data: statements the local LLM extracts from the shared
reviews (the session's extraction, tests/conftest.py; STAR pipeline, bi-encoder only)
and the EXTRA baseline on all of them."""
from __future__ import annotations

import math

import pytest

from rexeval.pipelines.paraphrase.pipeline import run_cluster
from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.pipelines.core.io import read_table


@pytest.mark.slow
def test_clusters_real_statements_and_extra_on_shared_reviews(tmp_path, smollm2_extraction):
    quiet = lambda s: None  # noqa: E731
    ext = smollm2_extraction["manifest"]
    ingest, triplets = smollm2_extraction["ingest"], smollm2_extraction["out"]
    star = run_cluster(ClusterConfig(input=str(triplets), out=str(tmp_path / "star")), progress=quiet)
    c, q = star["counts"], star["quality"]
    assert c["statements_in"] == ext["counts"]["statements"] > 0
    assert c["statements_in"] == c["statements_clustered"] + c["errors"]
    assert 0 < c["clusters"] <= c["distinct_statements"]
    assert "bi-encoder only" in star["pair_filter"]
    assert all(math.isfinite(q[k]) for k in ("reduction_pct", "sse", "ssb")) and q["sse"] >= 0
    clusters = read_table(tmp_path / "star" / "clusters", "clusters")
    assert set(clusters.column("statement_id").to_pylist()) <= set(
        read_table(triplets / "statements", "statements").column("statement_id").to_pylist())

    extra = run_cluster(ClusterConfig(input=str(ingest), out=str(tmp_path / "extra"), method="extra"),
                        progress=quiet)
    e = extra["extra_candidates"]
    assert e["sentences"] == e["kept"] + sum(e["dropped"].values()) and e["kept"] > 0
    # EXTRA keeps frequent generic sentences and merges almost nothing beyond exact repeats.
    assert extra["quality"]["reduction_pct"] < 5.0
    assert extra["counts"]["statements_in"] == e["kept"]
