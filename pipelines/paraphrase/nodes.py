"""Statements -> graph nodes, and cluster labels -> the clusters and canonical tables.

Clustering works on distinct statements, not rows: rows with the same polarity and the
same text up to case, spaces and punctuation (`statements.dedup_key`) are one node, so
a statement repeated by thousands of reviewers is embedded and searched once. Every
input row keeps its own line in the output map (nothing is lost), and a cluster's size
counts distinct statements while its `occurrences` counts rows. These are pure
functions over Arrow/NumPy; the Ray wiring lives in `pipelines.paraphrase.pipeline`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.schema import CANONICAL, CLUSTERS, error_rows
from rexeval.pipelines.core.ids import dedup_key

NO_SENTIMENT = "(none)"  # the polarity group of rows without a sentiment


@dataclass(frozen=True)
class Nodes:
    """Distinct statements, ordered by (sentiment, key) so every run numbers them alike."""

    keys: np.ndarray  # object [n]: dedup key
    texts: np.ndarray  # object [n]: the text shown for the node (its most frequent form)
    sentiments: np.ndarray  # object [n]: sentiment or None
    counts: np.ndarray  # int64 [n]: statement rows per node
    first_ids: np.ndarray  # object [n]: a statement_id of the node (smallest)
    row_node: np.ndarray  # int64 [rows]: node of every kept input row (-1: error row)
    groups: np.ndarray  # int64 [n]: polarity group code (index into group_names)
    group_names: tuple[str, ...]

    @property
    def n(self) -> int:
        return len(self.keys)

    def digest(self) -> str:
        """Identifies the node set (and order): work files are reused only when it matches."""
        h = hashlib.blake2b(digest_size=12)
        for s, t in zip(self.sentiments, self.texts):
            h.update(f"{s}\x1f{t}\x1e".encode())
        return h.hexdigest()


def build_nodes(statements: pa.Table, source: str = "statements") -> tuple[Nodes, pa.Table]:
    """Group statement rows into nodes; rows whose text is empty after tidying are errors.

    The node's text is its most frequent original spelling (ties: the smallest string),
    so the canonical set reads like the statements users wrote.
    """
    df = pd.DataFrame({
        "sid": statements.column("statement_id").to_pylist(),
        "text": statements.column("statement").to_pylist(),
        "sent": statements.column("sentiment").to_pylist(),
    })
    df["key"] = [dedup_key(t) for t in df["text"]]
    bad = df["key"] == ""
    errors = error_rows("cluster", [
        {"source": source, "row_id": sid, "field": "statement", "error_type": "empty_statement",
         "message": "statement has no words once case, spaces and punctuation are ignored",
         "raw": text}
        for sid, text in zip(df.loc[bad, "sid"], df.loc[bad, "text"])])
    good = df[~bad].copy()
    good["sent_key"] = good["sent"].fillna(NO_SENTIMENT)
    # Most frequent spelling per node; ties broken by the smallest string.
    spell = (good.groupby(["sent_key", "key", "text"], sort=True).size()
             .rename("n").reset_index()
             .sort_values(["sent_key", "key", "n", "text"], ascending=[True, True, False, True],
                          kind="mergesort")
             .drop_duplicates(["sent_key", "key"]))
    agg = good.groupby(["sent_key", "key"], sort=True).agg(count=("sid", "size"), first_id=("sid", "min"))
    nodes = agg.join(spell.set_index(["sent_key", "key"])["text"]).reset_index()
    index = pd.Series(np.arange(len(nodes)), index=pd.MultiIndex.from_frame(nodes[["sent_key", "key"]]))
    row_node = np.full(len(df), -1, dtype=np.int64)
    if len(good):
        row_node[~bad.to_numpy()] = index.reindex(
            pd.MultiIndex.from_frame(good[["sent_key", "key"]])).to_numpy()
    group_names = tuple(sorted(nodes["sent_key"].unique()))
    codes = {g: i for i, g in enumerate(group_names)}
    sentiments = nodes["sent_key"].to_numpy(dtype=object)
    return Nodes(
        keys=nodes["key"].to_numpy(dtype=object),
        texts=nodes["text"].to_numpy(dtype=object),
        sentiments=np.array([None if s == NO_SENTIMENT else s for s in sentiments], dtype=object),
        counts=nodes["count"].to_numpy(dtype=np.int64),
        first_ids=nodes["first_id"].to_numpy(dtype=object),
        row_node=row_node,
        groups=np.array([codes[s] for s in sentiments], dtype=np.int64),
        group_names=group_names,
    ), errors


def cluster_ids(nodes: Nodes, representatives: np.ndarray) -> np.ndarray:
    """A stable id per cluster: a hash of its representative's polarity and key."""
    return np.array([
        hashlib.blake2b(f"{nodes.sentiments[r] or ''}\x1f{nodes.keys[r]}".encode(),
                        digest_size=8).hexdigest()
        for r in representatives], dtype=object)


def output_tables(statements: pa.Table, nodes: Nodes, labels: np.ndarray,
                  representatives: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """The statement -> cluster map (one row per kept input row) and the canonical set."""
    ids = cluster_ids(nodes, representatives)
    keep = nodes.row_node >= 0
    row_node = nodes.row_node[keep]
    row_label = labels[row_node]
    is_rep = representatives[row_label] == row_node
    kept = statements.filter(pa.array(keep))
    clusters = pa.table({
        "statement_id": kept.column("statement_id"),
        "cluster_id": pa.array(ids[row_label], type=pa.string()),
        "is_representative": pa.array(is_rep),
        "statement": kept.column("statement"),
        "sentiment": kept.column("sentiment"),
    }, schema=CLUSTERS)
    n_clusters = len(representatives)
    size = np.bincount(labels, minlength=n_clusters)
    occurrences = np.bincount(labels, weights=nodes.counts, minlength=n_clusters).astype(np.int64)
    canonical = pa.table({
        "cluster_id": pa.array(ids, type=pa.string()),
        "statement": pa.array(nodes.texts[representatives], type=pa.string()),
        "sentiment": pa.array(nodes.sentiments[representatives], type=pa.string()),
        "size": pa.array(size, type=pa.int64()),
        "occurrences": pa.array(occurrences, type=pa.int64()),
        "representative_id": pa.array(nodes.first_ids[representatives], type=pa.string()),
    }, schema=CANONICAL)
    return clusters, canonical
