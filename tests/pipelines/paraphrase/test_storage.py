"""The cluster job with its input and output on an S3 endpoint (moto on 127.0.0.1): the
same tables as the same job on local folders, resumed from the markers it left there,
and nothing but orchestration in the driver (the FAISS indexes, the graph and whole
tables live on workers)."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.pipelines.paraphrase.pipeline import run_cluster
from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.schema import REVIEWS
from rexeval.storage import location
from tests.pipelines.paraphrase.test_pipeline import _statements

pytestmark = pytest.mark.usefixtures("ray_session")

REVIEW_TEXTS = ["Great product. Highly recommended! My son plays with it daily.",
                "Highly recommended. Great product!",
                "Works great. Highly recommended",
                "The strings broke in a week. Works great."]


def _reviews(folder) -> None:
    rows = [{"review_id": f"r{i}", "user_id": f"u{i}", "item_id": "i", "rating": 5.0, "timestamp": i,
             "text": t, "source": "x", "line": i + 1} for i, t in enumerate(REVIEW_TEXTS)]
    (location(folder) / "reviews" / "part-00000.parquet").write_parquet(pa.Table.from_pylist(rows, schema=REVIEWS))


def _outputs(root) -> dict[str, bytes]:
    """Every committed output file below `root` by its key, work files included, except
    those that name the input (error rows' source, the manifest) and timings."""
    root = location(root)
    return {f.relative_to(root): f.read_bytes() for f in root.walk_files()
            if f.name != "manifest.json" and not f.relative_to(root).startswith("errors/")}


def _errors(root) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "source"}
            for r in read_table(location(root) / "errors", "errors").to_pylist()]


def _driver_builds_nothing(monkeypatch) -> None:
    """Make every FAISS index construction and the graph fail in this (the driver's)
    process: the job passes only when workers do them (they import their own modules)."""
    import rexeval.pipelines.paraphrase.graph as graph
    import rexeval.pipelines.paraphrase.index as index
    import rexeval.pipelines.paraphrase.neighbours as nb

    def refuse(*_a, **_k):
        raise AssertionError("built in the driver process")

    for module, name in ((index, "build_index"), (nb, "build_index"), (index, "ivf_join_pairs"),
                         (nb, "ivf_join_pairs"), (nb, "candidate_pairs"), (graph, "cluster_graph"),
                         (index, "load_faiss"), (nb, "load_faiss")):
        monkeypatch.setattr(module, name, refuse)


@pytest.mark.slow
def test_star_job_on_s3_equals_the_local_job_and_resumes_from_its_markers(tmp_path, s3_root, monkeypatch):
    src = _statements(tmp_path / "st.parquet")
    uri_src = f"{s3_root}/in/st.parquet"
    location(uri_src).upload(src)
    local = run_cluster(ClusterConfig(input=str(src), out=str(tmp_path / "local")), progress=lambda _: None)

    _driver_builds_nothing(monkeypatch)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = f"{s3_root}/star"
    log: list[str] = []
    remote = run_cluster(ClusterConfig(input=uri_src, out=out), progress=log.append)
    assert remote["counts"] == local["counts"] and remote["quality"] == local["quality"]
    assert remote["config"]["input"]["files"] == [{"path": uri_src, "size": src.stat().st_size}]
    assert remote["reports"]["json"] == f"{out}/report.json"
    assert _outputs(out) == _outputs(tmp_path / "local")  # tables, work files, reports: same bytes
    assert _errors(out) == _errors(tmp_path / "local")
    assert "_work/nodes.parquet" in _outputs(out) and "_work/neighbours/pairs/part-00000.parquet" in _outputs(out)
    assert any("group" in m and "vectors" in m for m in log)  # the workers' FAISS lines reach the log
    assert list(cwd.iterdir()) == []  # nothing written here

    # Killed before the final commit: the re-run reuses the embeddings and the pairs from
    # their markers on S3 and writes the same bytes.
    before = _outputs(out)
    (location(out) / "_done" / "part-00000.json").unlink()
    manifest = (location(out) / "manifest.json").read_json()
    (location(out) / "manifest.json").write_json({**manifest, "status": "running"})
    log.clear()
    again = run_cluster(ClusterConfig(input=uri_src, out=out), progress=log.append)
    assert any("embeddings: 1 of 1 shard(s) already done" in m for m in log)
    pairs = remote["counts"]["candidate_pairs"]
    assert pairs and any(f"reusing {pairs} candidate pair(s) from {out}/_work/neighbours" in m for m in log)
    assert _outputs(out) == before and again["counts"] == remote["counts"]
    log.clear()
    run_cluster(ClusterConfig(input=uri_src, out=out), progress=log.append)
    assert any("already complete" in m for m in log)


@pytest.mark.slow
def test_extra_job_from_reviews_on_s3_equals_the_local_job(tmp_path, s3_root, monkeypatch):
    _reviews(tmp_path / "ingest")
    _reviews(f"{s3_root}/ingest")
    cfg = dict(method="extra", extra_min_count=2)
    local = run_cluster(ClusterConfig(input=str(tmp_path / "ingest"), out=str(tmp_path / "extra"), **cfg),
                        progress=lambda _: None)
    _driver_builds_nothing(monkeypatch)
    out = f"{s3_root}/extra"
    remote = run_cluster(ClusterConfig(input=f"{s3_root}/ingest", out=out, **cfg), progress=lambda _: None)
    assert remote["counts"] == local["counts"] and remote["extra_candidates"] == local["extra_candidates"]
    assert _outputs(out) == _outputs(tmp_path / "extra")
    st = read_table(location(out) / "statements", "statements").to_pylist()
    assert sorted({r["statement"] for r in st}) == ["great product", "highly recommended", "works great"]
    log: list[str] = []
    run_cluster(ClusterConfig(input=f"{s3_root}/ingest", out=out, **cfg), progress=log.append)
    assert any("already complete" in m for m in log)


def test_the_steps_run_where_the_data_can_be_read(tmp_path, s3_root, monkeypatch):
    """A local path pins the worker steps to the driver's node; URIs leave them free. GPUs
    follow --gpus-per-worker, whatever the cluster has now."""
    import ray

    import rexeval.pipelines.paraphrase.pipeline as pl

    seen = []

    def fake_on_worker(fn, *args, resources, threads=None, options=None):
        seen.append({"fn": fn.__name__, "resources": resources, "options": options or {}, "args": args})
        return {"pairs": 0, "digest": "d", "stats": {}, "messages": []}

    monkeypatch.setattr(pl, "on_worker", fake_on_worker)
    prep = {"n": 10, "digest": "x"}
    for workers, gpus, want in ((1, 1, "auto"), (3, 1, True), (1, 0, False)):
        cfg = ClusterConfig(input=f"{s3_root}/in", out=f"{s3_root}/o", neighbour_workers=workers,
                            gpus_per_worker=gpus)
        pl.neighbour_pairs(cfg, location(cfg.out) / "_work", "k", prep, {}, lambda _: None)
        call = seen[-1]
        assert call["fn"] == "neighbours" and call["args"][5] == want
        assert call["resources"].gpus == (1 if workers == 1 and gpus else 0)
    assert not ray.cluster_resources().get("GPU")  # none here: the request alone decides
    from rexeval.pipelines.core.runtime import reads_here

    assert reads_here([f"{s3_root}/in", f"{s3_root}/o"]) == {}
    pinned = reads_here([f"{s3_root}/in", str(tmp_path / "o")])["scheduling_strategy"]
    assert pinned.node_id == ray.get_runtime_context().get_node_id()
    # A one-process step's threads: with no cpus_per_worker, every core of this machine
    # (its Ray was started here), as before; never a count of the cluster's nodes.
    assert pl.step_threads(cfg.model_copy(update={"cpus_per_worker": None})) == int(ray.cluster_resources()["CPU"])
    assert pl.step_threads(cfg.model_copy(update={"cpus_per_worker": 3})) == 3


def _pid() -> int:
    return os.getpid()


def test_a_step_error_reads_as_the_error_it_is(tmp_path):
    from rexeval.pipelines.paraphrase.pipeline import on_worker

    def boom(path):
        raise FileNotFoundError(f"no such thing: {path}")

    with pytest.raises(FileNotFoundError, match="^no such thing: x$"):
        on_worker(boom, "x")
    assert on_worker(_pid) != os.getpid()


# -- vLLM's embed path, with a stand-in processor -----------------------------------------------

def fake_vectors(rows: np.ndarray) -> np.ndarray:
    v = np.stack([np.cos(rows * 0.1 + k) for k in range(4)], axis=1).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _fake_embed(row: dict) -> dict:
    if "FAIL" in row["text"]:
        return {"row": row["row"], "embedding": None, "error": "engine said no"}
    return {"row": row["row"], "embedding": fake_vectors(np.array([row["row"]]))[0], "error": None}


class FakeProcessor:
    """What `build_vllm_embed_processor` returns, minus vLLM: rows in, {row, embedding, error} out."""

    def __call__(self, ds):
        return ds.map(_fake_embed)


@pytest.mark.slow
def test_vllm_embeddings_are_written_by_workers_and_resume(s3_root, monkeypatch):
    import rexeval.models.encoders.embedder as embedder
    from rexeval.pipelines.paraphrase.embed import embed_texts, read_vectors

    monkeypatch.setattr(embedder, "build_vllm_embed_processor", lambda *a, **k: FakeProcessor())
    texts = location(s3_root) / "nodes.parquet"
    n = 10
    texts.write_parquet(pa.table({"row": np.arange(n), "text": [f"text {i}" for i in range(n)],
                                  "group": np.zeros(n, dtype=np.int64)}))
    folder = location(s3_root) / "emb"
    opts = dict(model_ref="m", location="m", digest="d", shard_size=4, backend="vllm")
    log: list[str] = []
    assert embed_texts(texts, n, folder, progress=log.append, **opts) == 3
    np.testing.assert_array_equal(read_vectors(folder, n), fake_vectors(np.arange(n)))
    assert not (folder / "_vllm").exists()  # the pieces are gone once the shards are committed
    (folder / "_done" / "part-00001.json").unlink()
    log.clear()
    embed_texts(texts, n, folder, progress=log.append, **opts)
    assert log == ["  embeddings: 2 of 3 shard(s) already done", "  embeddings (vllm): shard 1 done: 4 texts"]
    np.testing.assert_array_equal(read_vectors(folder, n), fake_vectors(np.arange(n)))

    texts.write_parquet(pa.table({"row": np.arange(n), "text": [f"text {i}" if i != 6 else "FAIL"
                                                                for i in range(n)],
                                  "group": np.zeros(n, dtype=np.int64)}))
    with pytest.raises(RuntimeError, match="could not embed 1 text.*row 6 \\('FAIL'\\): engine said no"):
        embed_texts(texts, n, location(s3_root) / "emb2", progress=lambda _: None, **opts)


def test_read_vectors_checks_the_rows(tmp_path):
    from rexeval.pipelines.paraphrase.embed import read_vectors, vectors_table

    (location(tmp_path) / "embeddings" / "part-00000.parquet").write_parquet(vectors_table(0, np.eye(3)))
    assert read_vectors(tmp_path, 3).shape == (3, 3)
    with pytest.raises(RuntimeError, match="expected 4 embedded rows"):
        read_vectors(tmp_path, 4)
    assert pq.read_table(tmp_path / "embeddings" / "part-00000.parquet").num_rows == 3
