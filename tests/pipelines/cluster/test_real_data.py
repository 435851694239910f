"""The cluster job on real data: statements the local LLM extracts from the shared
reviews (STAR pipeline, bi-encoder only) and the EXTRA baseline on all of them."""
from __future__ import annotations

import math

import pytest

from rexeval.pipelines.cluster.pipeline import run_cluster
from rexeval.pipelines.cluster.config import ClusterConfig
from rexeval.pipelines.extract.pipeline import run_extract
from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.pipelines.ingest.pipeline import run_ingest
from rexeval.pipelines.ingest.config import IngestConfig
from rexeval.pipelines.core.io import read_table


@pytest.mark.slow
def test_clusters_real_statements_and_extra_on_shared_reviews(tmp_path, shared_csv, ray_session):
    quiet = lambda s: None  # noqa: E731
    run_ingest(IngestConfig(inputs=[str(shared_csv)], out=str(tmp_path / "ingest"), category="instruments"),
               progress=quiet)
    ext = run_extract(ExtractConfig(input=str(tmp_path / "ingest"), out=str(tmp_path / "triplets"), limit=4,
                                    max_tokens=160, shard_size=4, cache=str(tmp_path / "cache.sqlite")),
                      progress=quiet)
    star = run_cluster(ClusterConfig(input=str(tmp_path / "triplets"), out=str(tmp_path / "star")), progress=quiet)
    c, q = star["counts"], star["quality"]
    assert c["statements_in"] == ext["counts"]["statements"] > 0
    assert c["statements_in"] == c["statements_clustered"] + c["errors"]
    assert 0 < c["clusters"] <= c["distinct_statements"]
    assert "bi-encoder only" in star["pair_filter"]
    assert all(math.isfinite(q[k]) for k in ("reduction_pct", "sse", "ssb")) and q["sse"] >= 0
    clusters = read_table(tmp_path / "star" / "clusters", "clusters")
    assert set(clusters.column("statement_id").to_pylist()) <= set(
        read_table(tmp_path / "triplets" / "statements", "statements").column("statement_id").to_pylist())

    extra = run_cluster(ClusterConfig(input=str(tmp_path / "ingest"), out=str(tmp_path / "extra"), method="extra"),
                        progress=quiet)
    e = extra["extra_candidates"]
    assert e["sentences"] == e["kept"] + sum(e["dropped"].values()) and e["kept"] > 0
    # EXTRA keeps frequent generic sentences and merges almost nothing beyond exact repeats.
    assert extra["quality"]["reduction_pct"] < 5.0
    assert extra["counts"]["statements_in"] == e["kept"]
