"""Statements -> distinct nodes -> clusters/canonical tables (pure functions)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from rexeval.pipelines.paraphrase.nodes import build_nodes, cluster_ids, output_tables
from rexeval.pipelines.core.schema import STATEMENTS, validate_table


def _statements(rows):
    cols = {f.name: [r.get(f.name) for r in rows] for f in STATEMENTS}
    return pa.Table.from_pydict(cols, schema=STATEMENTS)


def _row(sid, text, sent, review="r1"):
    return {"statement_id": sid, "review_id": review, "user_id": "u", "item_id": "i",
            "statement": text, "sentiment": sent, "stage": "verified"}


ROWS = [
    _row("s1", "The sound is great.", "positive"),
    _row("s2", "the sound is great", "positive", "r2"),
    _row("s3", "the sound is great", "positive", "r3"),
    _row("s4", "the sound is great", "negative", "r4"),  # same words, other polarity: its own node
    _row("s5", "Breaks easily", "negative"),
    _row("s6", "...", "positive"),  # nothing left once punctuation is ignored
    _row("s7", "works fine", None),
]


def test_nodes_group_rows_by_polarity_and_key():
    nodes, errors = build_nodes(_statements(ROWS), source="x.parquet")
    # sorted by (sentiment group, key); rows without sentiment form the "(none)" group
    assert nodes.group_names == ("(none)", "negative", "positive")
    assert list(nodes.keys) == ["works fine", "breaks easily", "the sound is great", "the sound is great"]
    assert list(nodes.sentiments) == [None, "negative", "negative", "positive"]
    assert list(nodes.counts) == [1, 1, 1, 3]
    assert list(nodes.groups) == [0, 1, 1, 2]
    # the most frequent spelling ("the sound is great" twice) names the node
    assert nodes.texts[3] == "the sound is great"
    assert nodes.first_ids[3] == "s1"
    assert list(nodes.row_node) == [3, 3, 3, 2, 1, -1, 0]
    assert errors.num_rows == 1
    e = errors.to_pylist()[0]
    assert (e["row_id"], e["error_type"], e["field"], e["source"]) == ("s6", "empty_statement", "statement", "x.parquet")
    # the digest changes when a text changes, not when it is rebuilt
    again, _ = build_nodes(_statements(ROWS))
    assert again.digest() == nodes.digest()
    other, _ = build_nodes(_statements(ROWS[:-1]))
    assert other.digest() != nodes.digest()


def test_output_tables_map_every_kept_row_and_count_occurrences():
    st = _statements(ROWS)
    nodes, errors = build_nodes(st)
    # clusters: {works fine}, {breaks easily, sound-great (neg)}, {sound-great (pos)}
    labels = np.array([0, 1, 1, 2])
    reps = np.array([0, 2, 3])
    clusters, canonical = output_tables(st, nodes, labels, reps)
    validate_table(clusters, "clusters")
    validate_table(canonical, "canonical")
    assert clusters.num_rows + errors.num_rows == st.num_rows  # nothing lost
    by_sid = {r["statement_id"]: r for r in clusters.to_pylist()}
    assert by_sid["s1"]["cluster_id"] == by_sid["s2"]["cluster_id"] == by_sid["s3"]["cluster_id"]
    assert by_sid["s1"]["is_representative"] and by_sid["s2"]["is_representative"]
    assert by_sid["s5"]["cluster_id"] == by_sid["s4"]["cluster_id"]
    assert by_sid["s4"]["is_representative"] and not by_sid["s5"]["is_representative"]
    canon = {r["cluster_id"]: r for r in canonical.to_pylist()}
    pos = canon[by_sid["s1"]["cluster_id"]]
    assert (pos["size"], pos["occurrences"], pos["sentiment"], pos["representative_id"]) == (1, 3, "positive", "s1")
    neg = canon[by_sid["s5"]["cluster_id"]]
    assert (neg["size"], neg["occurrences"], neg["statement"]) == (2, 2, "the sound is great")
    assert len(set(cluster_ids(nodes, reps))) == 3
