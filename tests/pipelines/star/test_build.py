"""The STAR builder on hand-made tables whose benchmark is worked out by hand."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rexeval.pipelines.core.schema import CANONICAL, CLUSTERS, REVIEWS, STATEMENTS
from rexeval.pipelines.star.build import before_clustering_stats, build_star, format_table6


def reviews(rows):
    """rows: (review_id, user, item, timestamp, line)."""
    n = len(rows)
    return pa.table({
        "review_id": [r[0] for r in rows], "user_id": [r[1] for r in rows], "item_id": [r[2] for r in rows],
        "rating": [5.0] * n, "timestamp": [r[3] for r in rows], "text": ["t"] * n, "summary": [None] * n,
        "user_name": [None] * n, "item_title": [None] * n, "category": [None] * n,
        "helpful_votes": pa.nulls(n, pa.int32()), "source": ["f.jsonl"] * n, "line": [r[4] for r in rows],
    }, schema=REVIEWS)


def statements(rows):
    """rows: (statement_id, review_id, text, sentiment)."""
    n = len(rows)
    return pa.table({
        "statement_id": [r[0] for r in rows], "review_id": [r[1] for r in rows], "user_id": ["?"] * n,
        "item_id": ["?"] * n, "statement": [r[2] for r in rows], "topic": [None] * n,
        "sentiment": [r[3] for r in rows], "stage": ["verified"] * n, "provenance": [None] * n,
    }, schema=STATEMENTS)


def clusters(rows):
    """rows: (statement_id, cluster_id)."""
    n = len(rows)
    return pa.table({"statement_id": [r[0] for r in rows], "cluster_id": [r[1] for r in rows],
                     "is_representative": [False] * n, "statement": ["x"] * n, "sentiment": [None] * n},
                    schema=CLUSTERS)


# User a: 4 reviews (train, train, valid, test by time); user b: 3 (train, valid, test);
# user c: 1 review (too short to evaluate: train). Review r9 has no statement.
REVIEWS_T = reviews([
    ("r1", "a", "i1", 10, 1), ("r2", "a", "i2", 20, 2), ("r3", "a", "i1", 30, 3), ("r4", "a", "i3", 40, 4),
    ("r5", "b", "i2", 5, 5), ("r6", "b", "i1", 6, 6), ("r7", "b", "i3", 7, 7),
    ("r8", "c", "i2", 1, 8), ("r9", "c", "i3", 2, 9),
])
STATEMENTS_T = statements([
    ("s1", "r1", "the product is sturdy", "positive"),
    ("s2", "r1", "the product feels solid", "positive"),  # same cluster as s1: merged
    ("s3", "r2", "the product is loud", "negative"),
    ("s4", "r3", "the product is sturdy", "positive"),
    ("s5", "r4", "the product is loud", "negative"),
    ("s6", "r5", "the product is cheap", "neutral"),
    ("s7", "r6", "the product is sturdy", "positive"),
    ("s8", "r7", "the product is cheap", "neutral"),
    ("s9", "r8", "the product is loud", "negative"),
    ("s10", "rX", "the product is loud", "negative"),  # unknown review
    ("s11", "r2", "the product squeaks", "negative"),  # not clustered
])
CLUSTERS_T = clusters([("s1", "cA"), ("s2", "cA"), ("s4", "cA"), ("s7", "cA"), ("s3", "cB"), ("s5", "cB"),
                       ("s9", "cB"), ("s10", "cB"), ("s6", "cC"), ("s8", "cC")])


def test_interactions_split_and_triplets():
    b = build_star(STATEMENTS_T, REVIEWS_T, CLUSTERS_T)
    inter = b.tables["interactions"].to_pandas().set_index("review_id")
    # r9 has no statement -> not an interaction; every other review is one.
    assert sorted(inter.index) == ["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"]
    assert inter.loc[["r1", "r2", "r3", "r4"], "split"].tolist() == ["train", "train", "valid", "test"]
    assert inter.loc[["r5", "r6", "r7"], "split"].tolist() == ["train", "valid", "test"]
    assert inter.loc["r8", "split"] == "train"  # user c has 1 interaction: train only
    # Users and items indexed in id order; statements in cluster-id order.
    assert inter.loc["r1", ["user", "item"]].tolist() == [0, 0]
    assert inter.loc["r8", ["user", "item"]].tolist() == [2, 1]
    cand = b.tables["candidates"].to_pandas()
    assert cand["cluster_id"].tolist() == ["cA", "cB", "cC"]
    assert cand["rows"].tolist() == [4, 3, 2]
    trip = b.tables["triplets"].to_pandas()
    r1 = inter.loc["r1", "interaction"]
    assert trip[trip["interaction"] == r1]["statement"].tolist() == [0]  # s1 + s2 counted once
    assert len(trip) == 8
    c = b.counts
    assert (c["statement_rows"], c["statement_rows_used"], c["statement_rows_merged"], c["error_rows"]) == (11, 9, 1, 2)
    assert c["statement_rows"] == c["statement_rows_used"] + c["error_rows"]
    assert (c["train"], c["valid"], c["test"], c["users_evaluated"]) == (4, 2, 2, 2)


def test_error_rows_name_the_reason():
    b = build_star(STATEMENTS_T, REVIEWS_T, CLUSTERS_T)
    errs = {r["row_id"]: r["error_type"] for r in b.errors.to_pylist()}
    assert errs == {"s10": "unknown_review", "s11": "no_cluster"}


def test_canonical_text_is_the_representative():
    canon = pa.table({"cluster_id": ["cA", "cB", "cC"], "statement": ["the product is sturdy", "the product is loud",
                                                                      "the product is cheap"],
                      "sentiment": ["positive", "negative", "neutral"], "size": [2, 1, 1],
                      "occurrences": [4, 4, 2], "representative_id": ["s1", "s3", "s6"]}, schema=CANONICAL)
    b = build_star(STATEMENTS_T, REVIEWS_T, CLUSTERS_T, canon)
    assert b.tables["candidates"].column("text").to_pylist() == ["the product is sturdy", "the product is loud",
                                                                  "the product is cheap"]


def test_without_clusters_statements_are_polarity_plus_words():
    b = build_star(STATEMENTS_T, REVIEWS_T)
    # sturdy, solid, loud, cheap, squeaks: 5 distinct (s10's review is unknown).
    assert b.counts["statements"] == 5
    assert b.counts["error_rows"] == 1
    assert b.counts["statement_rows_merged"] == 0


def test_table6_statistics_by_hand():
    b = build_star(STATEMENTS_T, REVIEWS_T, CLUSTERS_T)
    after = b.stats["after"]
    assert (after["users"], after["items"], after["interactions"]) == (3, 3, 8)
    assert after["statements"] == 3
    assert after["by_sentiment"] == {"negative": 1, "neutral": 1, "positive": 1}
    # Distinct statements per interaction: every interaction has 1 -> 1/1/1.
    assert after["per_interaction"] == {"min": 1, "mean": 1.0, "max": 1}
    # Per item: i1 {A}, i2 {B, C}, i3 {B, C} -> 1/1.67/2. Per user: a {A, B}, b {A, C}, c {B}.
    assert after["per_item"]["min"] == 1 and after["per_item"]["max"] == 2
    assert after["per_item"]["mean"] == pytest.approx(5 / 3)
    assert after["per_user"] == {"min": 1, "mean": pytest.approx(5 / 3), "max": 2}
    assert after["triplets"] == 8
    before = before_clustering_stats(STATEMENTS_T, b)
    # Before: r1 has sturdy + solid (2 statements), r2 has loud + squeaks.
    assert before["statements"] == 5
    assert before["triplets"] == 10
    assert before["per_interaction"]["max"] == 2
    md = format_table6({"Toy": {"before": before, "after": after}})
    assert "| Unique statements | 3 (40.0%) |" in md
    assert "| Total triplets | 10 |" in md and "| Total triplets | 8 |" in md


def test_statement_order_follows_cluster_ids_not_popularity():
    b = build_star(STATEMENTS_T, REVIEWS_T, CLUSTERS_T)
    ids = b.tables["candidates"].column("cluster_id").to_pylist()
    assert ids == sorted(ids)
    assert np.all(np.diff(b.tables["triplets"].column("interaction").to_numpy()) >= 0)
