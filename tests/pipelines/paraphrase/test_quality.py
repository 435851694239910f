"""Clustering quality (seed 002 Table 3): SSE/SSB by hand and independently, counts, report."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import calinski_harabasz_score

from rexeval.pipelines.paraphrase import graph as cg
from rexeval.pipelines.paraphrase.quality import (
    cluster_examples,
    format_table3,
    quality_summary,
    reduction_pct,
    size_histogram,
    sse_ssb,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def loop_sse_ssb(emb, labels):
    """Definition written with explicit loops, float64."""
    x = emb.astype(np.float64)
    mu = x.mean(axis=0)
    sse = ssb = 0.0
    for lab in np.unique(labels):
        members = x[labels == lab]
        mk = members.mean(axis=0)
        sse += sum(float(((row - mk) ** 2).sum()) for row in members)
        ssb += len(members) * float(((mk - mu) ** 2).sum())
    return sse, ssb


def test_sse_ssb_by_hand():
    # a=(0,0), b=(2,0) in cluster 0; c=(0,4), d=(0,6) in cluster 1.
    # mu0 = (1,0), mu1 = (0,5): SSE = 1 + 1 + 1 + 1 = 4.
    # mu = (0.5, 2.5): SSB = 2*(0.25 + 6.25) + 2*(0.25 + 6.25) = 26.
    # TSS = 6.5 + 8.5 + 2.5 + 12.5 = 30 = SSE + SSB; per statement (N = 4): 1, 6.5, 7.5.
    emb = np.array([[0, 0], [2, 0], [0, 4], [0, 6]], dtype=np.float32)
    got = sse_ssb(emb, np.array([0, 0, 1, 1]))
    assert got == pytest.approx({"sse": 1.0, "ssb": 6.5, "sse_sum": 4.0, "ssb_sum": 26.0,
                                 "tss_mean": 7.5})
    # labels need not be sorted or contiguous
    assert sse_ssb(emb, np.array([5, 5, 2, 2]))["sse_sum"] == pytest.approx(4.0)


@pytest.mark.parametrize("block_rows", [None, 7])
def test_sse_ssb_against_loops_and_sklearn(monkeypatch, block_rows):
    if block_rows:  # clusters larger than a block take the one-big-cluster path
        monkeypatch.setattr(cg, "BLOCK_BYTES", 12 * 8 * 3 * block_rows)
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((400, 12)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    labels = np.concatenate([np.zeros(50, np.int64), np.arange(1, 60), rng.integers(1, 60, 291)])
    rng.shuffle(labels)
    got = sse_ssb(emb, labels)
    sse, ssb = loop_sse_ssb(emb, labels)
    assert got["sse_sum"] == pytest.approx(sse, rel=1e-9)
    assert got["ssb_sum"] == pytest.approx(ssb, rel=1e-9)
    assert got["sse"] == pytest.approx(sse / 400, rel=1e-9)
    tss = float(((emb.astype(np.float64) - emb.astype(np.float64).mean(0)) ** 2).sum())
    assert got["sse"] + got["ssb"] == pytest.approx(tss / 400, rel=1e-9)
    assert got["tss_mean"] == pytest.approx(tss / 400, rel=1e-9)
    # Calinski-Harabasz = (SSB / (k - 1)) / (SSE / (N - k)), computed by sklearn
    k, n = 60, 400
    ch = calinski_harabasz_score(emb.astype(np.float64), labels)
    assert (got["ssb_sum"] / (k - 1)) / (got["sse_sum"] / (n - k)) == pytest.approx(ch, rel=1e-6)


def test_singletons_and_one_cluster_extremes():
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((30, 5)).astype(np.float32)
    only = sse_ssb(emb, np.arange(30))
    assert only["sse"] == 0.0 and only["ssb"] == pytest.approx(only["tss_mean"])
    one = sse_ssb(emb, np.zeros(30, np.int64))
    assert one["ssb"] == pytest.approx(0.0, abs=1e-12) and one["sse"] == pytest.approx(one["tss_mean"])
    assert sse_ssb(emb[:0], np.zeros(0, np.int64))["sse"] == 0.0


def test_reduction_and_histogram():
    assert reduction_pct(200, 150) == pytest.approx(25.0)
    assert reduction_pct(0, 0) == 0.0 and reduction_pct(10, 10) == 0.0
    labels = np.array([0, 1, 1, 2, 2, 2, 3, 4, 4, 5])      # sizes 1, 2, 3, 1, 2, 1
    assert size_histogram(labels) == [{"size": 1, "clusters": 3, "statements": 3},
                                      {"size": 2, "clusters": 2, "statements": 4},
                                      {"size": 3, "clusters": 1, "statements": 3}]
    assert size_histogram(np.array([3, 3, 0])) == [{"size": 1, "clusters": 1, "statements": 1},
                                                   {"size": 2, "clusters": 1, "statements": 2}]
    assert size_histogram(np.zeros(0, np.int64)) == []


def make_clusters():
    # clusters: 0 size 4, 1 size 3, 2..6 size 2, 7..11 singletons: 22 statements
    sizes = [4, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    texts = [f"s{v}" for v in range(labels.size)]
    reps = np.array([np.flatnonzero(labels == c)[-1] for c in range(len(sizes))])  # last member
    return labels, reps, texts


def test_cluster_examples_largest_then_seeded_random():
    labels, reps, texts = make_clusters()
    ex = cluster_examples(labels, reps, texts, n_largest=2, n_random=3, max_members=2, seed=4)
    assert [e["kind"] for e in ex] == ["largest"] * 2 + ["random"] * 3
    assert ex[0] == {"cluster": 0, "kind": "largest", "size": 4, "representative": "s3",
                     "members": ["s0", "s1"]}
    assert ex[1]["cluster"] == 1 and ex[1]["members"] == ["s4", "s5"]
    drawn = [e["cluster"] for e in ex[2:]]
    assert set(drawn) <= {2, 3, 4, 5, 6} and len(set(drawn)) == 3    # no singletons, no repeats
    again = cluster_examples(labels, reps, texts, n_largest=2, n_random=3, max_members=2, seed=4)
    assert again == ex
    seeds = {tuple(e["cluster"] for e in cluster_examples(labels, reps, texts, 2, 3, seed=s))
             for s in range(10)}
    assert len(seeds) > 1
    # only singletons left for the draw -> singletons are used
    single = cluster_examples(np.arange(4), np.arange(4), list("abcd"), n_largest=1, n_random=2)
    assert [e["members"] for e in single] == [[], [], []]


def test_quality_summary_fields():
    labels, reps, texts = make_clusters()
    emb = np.eye(labels.size, dtype=np.float32)
    s = quality_summary("graph", emb, labels, reps, texts, n_statements_in=40)
    assert (s["method"], s["statements"], s["statements_in"], s["clusters"], s["singletons"],
            s["largest"]) == ("graph", 22, 40, 12, 5, 4)
    assert s["reduction_pct_rows"] == pytest.approx(70.0)          # 1 - 12/40
    assert s["reduction_pct"] == pytest.approx(100 * (1 - 12 / 22))
    assert s["sse"] == pytest.approx(sse_ssb(emb, labels)["sse"])
    assert s["histogram"] == size_histogram(labels)
    # 5 largest (clusters 0-4), then only 2 non-singletons (5, 6) are left for the draw
    assert [e["cluster"] for e in s["examples"]] == [0, 1, 2, 3, 4, 5, 6]
    json.dumps(s)                                                  # plain JSON values only
    assert quality_summary("x", emb, labels, reps, texts)["statements_in"] == 22


def test_format_table3_layout_and_bold_best_ssb():
    rows = [{"method": "Baseline", "clusters": 900, "reduction_pct": 10.0, "sse": 0.01234,
             "ssb": 0.05},
            {"method": "Ours", "clusters": 700, "reduction_pct": 30.004, "sse": 0.0033, "ssb": 0.08}]
    table = format_table3(rows, dataset="Toys")
    lines = table.strip().splitlines()
    assert lines[0] == "| Dataset | Method | #Clust. | Red.% | SSE ↓ | SSB ↑ |"
    assert lines[2] == "| Toys | Baseline | 900 | 10.00 | 0.0123 | 0.0500 |"
    assert lines[3] == "|  | Ours | 700 | 30.00 | 0.0033 | **0.0800** |"
    # one row: nothing to compare, no bold
    assert "**" not in format_table3(rows[:1])


@pytest.fixture(params=["local", "s3"])
def report_root(request, tmp_path):
    return str(tmp_path / "out") if request.param == "local" else request.getfixturevalue("s3_root")


def test_write_report_files(report_root):
    import io

    from rexeval.storage import location

    labels, reps, texts = make_clusters()
    rng = np.random.default_rng(2)
    emb = rng.standard_normal((labels.size, 4)).astype(np.float32)
    s = quality_summary("graph", emb, labels, reps, texts)
    paths = write_report(report_root, s)
    assert set(paths) == {"md", "json", "csv", "png"}
    assert all(p.exists() and p.parent == location(report_root) for p in paths.values())
    md = paths["md"].read_text()
    assert "| Dataset | Method |" in md and "| graph | 12 |" in md and "**s3**" in md
    assert json.loads(paths["json"].read_text())["clusters"] == 12
    csv = pd.read_csv(io.BytesIO(paths["csv"].read_bytes()))
    assert csv.to_dict("records") == s["histogram"]
    data = paths["png"].read_bytes()
    assert data[:8] == PNG_MAGIC
    import matplotlib.image as mpimg
    assert mpimg.imread(io.BytesIO(data), format="png").shape[:2] == (400, 700)
