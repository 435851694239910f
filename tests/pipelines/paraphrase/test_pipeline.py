"""The cluster job end to end on a local Ray: real MiniLM embeddings, FAISS, the graph."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.paraphrase.pipeline import run_cluster
from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.schema import REVIEWS, STATEMENTS

pytestmark = pytest.mark.usefixtures("ray_session")

TEXTS = [  # (statement, sentiment); MiniLM cosines: strings 0.90-0.96, tuner 0.98, cable 0.99
    ("the strings sound bright", "positive"),
    ("the strings sound really bright", "positive"),
    ("the strings have a bright sound", "positive"),
    ("The strings sound bright.", "positive"),  # a repeat: same node as the first
    ("the tuner is accurate", "positive"),
    ("the tuner is very accurate", "positive"),
    ("the case is sturdy", "positive"),
    ("the cable breaks easily", "negative"),
    ("the cable breaks very easily", "negative"),
    ("the strings sound bright", "negative"),  # same words, other polarity: never merged
    ("!!!", "positive"),  # nothing to cluster: an error row
]


def _statements(path: Path, texts=TEXTS, stage="verified") -> Path:
    rows = [{"statement_id": f"s{i:02d}", "review_id": f"r{i}", "user_id": "u", "item_id": "i",
             "statement": t, "topic": None, "sentiment": s, "stage": stage, "provenance": None}
            for i, (t, s) in enumerate(texts)]
    rows.append({**rows[0], "statement_id": "c00", "stage": "candidate"})  # another stage: not input
    pq.write_table(pa.Table.from_pylist(rows, schema=STATEMENTS), path)
    return path


def _by_text(out: Path) -> dict[tuple[str, str], str]:
    rows = read_table(out / "clusters", "clusters").to_pylist()
    return {(r["statement"], r["sentiment"]): r["cluster_id"] for r in rows}


@pytest.mark.slow
def test_bi_encoder_only_job(tmp_path):
    src = _statements(tmp_path / "st.parquet")
    out = tmp_path / "out"
    log: list[str] = []
    m = run_cluster(ClusterConfig(input=str(src), out=str(out)), progress=log.append)
    c = m["counts"]
    assert c["statements_in"] == 11 and c["statements_clustered"] + c["errors"] == 11
    assert c["distinct_statements"] == 9  # repeat folded, "!!!" is an error
    assert "bi-encoder only" in m["pair_filter"] and "cross_encoder" in m["pair_filter"]
    cl = _by_text(out)
    strings = {cl[("the strings sound bright", "positive")], cl[("the strings sound really bright", "positive")],
               cl[("the strings have a bright sound", "positive")], cl[("The strings sound bright.", "positive")]}
    assert len(strings) == 1
    assert cl[("the tuner is accurate", "positive")] == cl[("the tuner is very accurate", "positive")]
    assert cl[("the cable breaks easily", "negative")] == cl[("the cable breaks very easily", "negative")]
    assert cl[("the strings sound bright", "negative")] != cl[("the strings sound bright", "positive")]
    assert cl[("the case is sturdy", "positive")] not in strings
    canon = read_table(out / "canonical", "canonical").to_pylist()
    assert len(canon) == c["clusters"] == 5
    strings_row = next(r for r in canon if r["cluster_id"] in strings)
    assert (strings_row["size"], strings_row["occurrences"]) == (3, 4)
    errors = read_table(out / "errors", "errors").to_pylist()
    assert [(e["row_id"], e["error_type"]) for e in errors] == [("s10", "empty_statement")]
    for name in ("report.md", "report.json", "cluster_sizes.csv", "cluster_sizes.png"):
        assert (out / name).exists(), name
    report = json.loads((out / "report.json").read_text())
    assert report["clusters"] == 5 and report["statements"] == 9
    assert report["reduction_pct"] == pytest.approx(100 * (1 - 5 / 9))
    assert "bi-encoder only" in (out / "report.md").read_text()

    # Done: a re-run says so and changes nothing.
    before = {p: p.read_bytes() for p in out.rglob("*.parquet")}
    again = run_cluster(ClusterConfig(input=str(src), out=str(out)), progress=log.append)
    assert again["config_hash"] == m["config_hash"] and any("already complete" in x for x in log)

    # Interrupted after the neighbour search: the re-run reuses the work and writes the same bytes.
    (out / "_done" / "part-00000.json").unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    log.clear()
    run_cluster(ClusterConfig(input=str(src), out=str(out)), progress=log.append)
    assert any("embeddings: 1 of 1 shard(s) already done" in x for x in log)
    assert any("reusing" in x for x in log)
    assert {p: p.read_bytes() for p in out.rglob("*.parquet")} == before


@pytest.mark.slow
def test_cross_encoder_filter_runs_on_actors(tmp_path):
    src = _statements(tmp_path / "st.parquet")
    ckpt = tmp_path / "scorer"
    ckpt.mkdir()
    out = tmp_path / "out"
    m = run_cluster(ClusterConfig(input=str(src), out=str(out), models={"cross_encoder": str(ckpt)},
                                  cross_kind="tests.doubles.pair_scorer:NoIntensifierScorer"), progress=lambda _: None)
    assert m["pair_filter"].startswith("cross-encoder") and "> 0.9" in m["pair_filter"]
    c = m["counts"]
    assert c["validated_pairs"] < c["candidate_pairs"]
    cl = _by_text(out)
    # The scripted scorer rejects pairs where only one side says "really"/"very".
    assert cl[("the strings sound really bright", "positive")] != cl[("the strings sound bright", "positive")]
    assert cl[("the strings have a bright sound", "positive")] == cl[("the strings sound bright", "positive")]
    assert cl[("the tuner is accurate", "positive")] != cl[("the tuner is very accurate", "positive")]
    # --bi-encoder-only ignores the configured scorer and says why.
    m2 = run_cluster(ClusterConfig(input=str(src), out=str(tmp_path / "bi"), models={"cross_encoder": str(ckpt)},
                                   bi_encoder_only=True), progress=lambda _: None)
    assert "--bi-encoder-only" in m2["pair_filter"]


def test_missing_cross_encoder_path_fails_before_work(tmp_path):
    src = _statements(tmp_path / "st.parquet")
    with pytest.raises(Exception, match="cross_encoder"):
        run_cluster(ClusterConfig(input=str(src), out=str(tmp_path / "o"),
                                  models={"cross_encoder": str(tmp_path / "nope")}), progress=lambda _: None)
    assert not (tmp_path / "o").exists()


def test_extra_method_from_reviews(tmp_path):
    texts = ["Great product. Highly recommended! My son plays with it daily.",
             "Highly recommended. Great product!",
             "Works great. Highly recommended",
             "The strings broke in a week. Works great."]
    rows = [{"review_id": f"r{i}", "user_id": f"u{i}", "item_id": "i", "rating": 5.0, "timestamp": i,
             "text": t, "source": "x", "line": i + 1} for i, t in enumerate(texts)]
    (tmp_path / "ingest" / "reviews").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=REVIEWS), tmp_path / "ingest" / "reviews" / "part-00000.parquet")
    out = tmp_path / "extra"
    m = run_cluster(ClusterConfig(input=str(tmp_path / "ingest"), out=str(out), method="extra",
                                  extra_min_count=2), progress=lambda _: None)
    assert m["method"] == "extra" and m["stage"] == "extra"
    st = read_table(out / "statements", "statements").to_pylist()
    assert sorted({r["statement"] for r in st}) == ["great product", "highly recommended", "works great"]
    assert m["counts"]["clusters"] == 3 and m["quality"]["reduction_pct"] == 0.0
    assert m["extra_candidates"]["kept"] == len(st)


def test_the_steps_threads_come_from_the_settings_not_the_clusters_nodes(tmp_path, monkeypatch):
    """Joined to a cluster whose nodes may not be read (a cold autoscaling one): the
    neighbour step gets `cpus_per_worker` threads (FAISS) and asks for as many CPUs;
    with none it gets one, not the largest node's cores; with several neighbour
    workers each of their tasks and actors gets `cpus_per_worker` CPUs."""
    import ray

    import rexeval.pipelines.paraphrase.pipeline as pl
    from rexeval.storage import location

    def refuse(*_a, **_k):
        raise AssertionError("the cluster's nodes or resources were read")

    for name in ("cluster_resources", "available_resources", "nodes"):
        monkeypatch.setattr(ray, name, refuse)
    monkeypatch.delenv("REXEVAL_ONE_MACHINE", raising=False)  # joined, not started here
    seen = []

    def fake_on_worker(fn, *args, resources, threads=None, options=None):
        seen.append({"resources": resources, "threads": threads, "step_threads": args[6]})
        return {"pairs": 0, "digest": "d", "stats": {}, "messages": []}

    monkeypatch.setattr(pl, "on_worker", fake_on_worker)
    prep = {"n": 10, "digest": "x"}
    for cpus, workers, want in ((4, 1, (4, 4, 4)), (None, 1, (1, 1, 1)), (4, 3, (1, 4, 4))):
        cfg = ClusterConfig(input=str(tmp_path / "in"), out=str(tmp_path / "o"), cpus_per_worker=cpus,
                            neighbour_workers=workers)
        pl.neighbour_pairs(cfg, location(cfg.out) / "_work", "k", prep, {}, lambda _: None)
        call = seen[-1]
        assert (call["resources"].cpus, call["threads"], call["step_threads"]) == want
    assert pl.step_threads(ClusterConfig(input="i", out="o")) == 1
