"""Extract, extract-quality and ground-truth with inputs and outputs on S3 (moto on
127.0.0.1): the same tables as a local run, the LLM calls cached under the output so a
re-run makes none, and nothing written to the local disk."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import REVIEWS, STATEMENTS, SchemaError
from rexeval.storage import location
from rexeval.pipelines.extract.config import ExtractConfig, GroundTruthConfig, QualityConfig
from rexeval.pipelines.extract.pipeline import ShardReader, review_parts, run_extract
from rexeval.pipelines.extract.quality import SamplePlan, run_quality, sample_statements
from rexeval.pipelines.extract.rows import TableParts
from tests.pipelines.extract.test_ground_truth import make_extract
from tests.pipelines.extract.test_pipeline import BACKEND, TRIPLETS, calls, write_reviews

QUIET = dict(progress=lambda s: None)


def upload(local: Path, uri: str) -> None:
    location(uri).write_bytes(local.read_bytes())


def tables(root: str, names=("statements", "errors")) -> dict[str, bytes]:
    base = location(root)
    return {f"{t}/{p.name}": p.read_bytes() for t in names for p in (base / t).glob("*.parquet")}


def extract_config(tmp_path: Path, input: str, out: str, **extra) -> ExtractConfig:
    return ExtractConfig(input=input, out=out, backend=BACKEND, models={"embedder": "none"}, shard_size=4,
                         backend_options={"default": TRIPLETS, "log": str(tmp_path / "calls.log")}, **extra)


def local_files(root: Path) -> set[str]:
    """Files under `root` but the test LLM's call log and the local run's cache file."""
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and p.name != "calls.log" and not p.name.startswith("local.sqlite")}


@pytest.mark.slow
def test_extract_on_s3_matches_local_and_reruns_from_any_node_without_calls(tmp_path, s3_root, ray_session,
                                                                         monkeypatch):
    write_reviews(tmp_path / "reviews.parquet", 10)
    local = run_extract(extract_config(tmp_path, str(tmp_path / "reviews.parquet"), str(tmp_path / "local"),
                                       cache=str(tmp_path / "local.sqlite")), **QUIET)
    (tmp_path / "calls.log").unlink()
    # An ingest-like folder on the bucket; the job's output beside it; no cache given.
    upload(tmp_path / "reviews.parquet", f"{s3_root}/ingest/reviews/part-00000.parquet")
    monkeypatch.setenv("REXEVAL_CACHE", str(tmp_path / "node-cache"))  # the node's default: not to be used
    before = local_files(tmp_path)
    cfg = extract_config(tmp_path, f"{s3_root}/ingest", f"{s3_root}/out")
    m = run_extract(cfg, **QUIET)
    assert m["status"] == "complete" and m["config"]["input"] == f"{s3_root}/ingest/reviews"
    assert {k: v for k, v in m["counts"].items()} == local["counts"]
    assert tables(f"{s3_root}/out") == tables(str(tmp_path / "local")) != {}
    assert calls(tmp_path / "calls.log") == 8
    # The calls are cached under the output, one object each; nothing went to local disk.
    cached = location(f"{s3_root}/out/_llm_cache").walk_files()
    assert len(cached) == 8 and all(f.suffix == ".json" for f in cached)
    assert local_files(tmp_path) == before and not (tmp_path / "node-cache").exists()

    # The shards' files and markers lost (say the job ran on a node that died before
    # committing): the re-run, from fresh workers, asks the model nothing again.
    out = location(f"{s3_root}/out")
    for name in ("_done", "statements", "errors"):
        (out / name).rmtree()
    lines: list[str] = []
    again = run_extract(cfg, progress=lines.append)
    assert calls(tmp_path / "calls.log") == 8 and again["counts"]["cached_calls"] == 8
    assert again["counts"]["llm_calls"] == 8  # the calls the results cost, served from the cache
    assert tables(f"{s3_root}/out") == tables(str(tmp_path / "local"))
    # And the same command once more: complete, nothing to do.
    run_extract(cfg, **QUIET)
    assert calls(tmp_path / "calls.log") == 8


@pytest.mark.slow
def test_a_cache_at_a_uri_serves_another_output(tmp_path, s3_root, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 6)
    upload(tmp_path / "reviews.parquet", f"{s3_root}/reviews.parquet")
    cache = f"{s3_root}/cache"
    first = run_extract(extract_config(tmp_path, f"{s3_root}/reviews.parquet", f"{s3_root}/a", cache=cache), **QUIET)
    made = calls(tmp_path / "calls.log")
    assert made == first["counts"]["llm_calls"] > 0
    second = run_extract(extract_config(tmp_path, f"{s3_root}/reviews.parquet", f"{s3_root}/b", cache=cache),
                         **QUIET)
    assert calls(tmp_path / "calls.log") == made and second["counts"]["cached_calls"] == made
    assert not location(f"{s3_root}/b/_llm_cache").exists()  # the given cache, not the default
    assert tables(f"{s3_root}/a") == tables(f"{s3_root}/b")


def test_workers_get_where_the_reviews_are_not_the_reviews(tmp_path):
    sizes = []
    for n in (10, 2000):
        write_reviews(tmp_path / "reviews.parquet", n)
        cfg = extract_config(tmp_path, str(tmp_path / "reviews.parquet"), str(tmp_path / "o"))
        parts, total = review_parts(cfg)
        assert total == n
        reader = ShardReader(parts, total, cfg.shard_size)
        sizes.append(len(pickle.dumps(reader)))
    assert abs(sizes[0] - sizes[1]) < 16


@pytest.mark.slow
def test_a_bad_review_fails_the_job_with_its_row_after_the_other_shards(tmp_path, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 12)
    rows = pq.read_table(tmp_path / "reviews.parquet").to_pylist()
    rows[6]["user_id"] = None
    loose = pa.schema([f.with_nullable(True) for f in REVIEWS])
    pq.write_table(pa.Table.from_pylist(rows, schema=loose), tmp_path / "reviews.parquet")
    cfg = extract_config(tmp_path, str(tmp_path / "reviews.parquet"), str(tmp_path / "o"), use_cache=False)
    with pytest.raises(SchemaError) as err:
        run_extract(cfg, **QUIET)
    assert err.value.row == 7 and err.value.field == "user_id"  # rows[6], counted from 1
    assert sorted(p.name for p in (tmp_path / "o" / "_done").iterdir()) == ["part-00000.json", "part-00002.json"]


# -- extract-quality -----------------------------------------------------------------


def statements(n_reviews: int) -> pa.Table:
    rows = [{"statement_id": f"s{r:02d}-{k}-{stage}", "review_id": f"r{r:02d}", "user_id": "u", "item_id": "i",
             "statement": f"the product is thing {r} {k}", "topic": None, "sentiment": "positive",
             "stage": stage, "provenance": None}
            for r in range(n_reviews) for stage in ("verified", "candidate") for k in range(r % 3 + 1)]
    return pa.Table.from_pylist(rows, schema=STATEMENTS)


def test_a_sample_plan_reads_the_same_shards_as_the_sample(tmp_path):
    table = statements(9)
    for k, (lo, hi) in enumerate([(0, 11), (11, 30), (30, table.num_rows)]):
        pq.write_table(table.slice(lo, hi - lo), tmp_path / f"part-{k:05d}.parquet")
    parts = TableParts.of(tmp_path, "statements")
    want = sample_statements(table, 5, seed=3)
    plan = SamplePlan.draw(parts, 5, seed=3)
    assert plan.num_rows == want.num_rows and len(plan.ids) == 5
    for size in (1, 3, 4, 7, 100):
        got = [plan.shard(parts, s, size) for s in range(-(-plan.num_rows // size))]
        assert pa.concat_tables(got).equals(want), size
    assert b"thing" not in pickle.dumps(plan)


@pytest.mark.slow
def test_extract_quality_on_s3_matches_local(tmp_path, s3_root, ray_session):
    rows = [{"review_id": f"r{i}", "user_id": "u", "item_id": "i", "rating": 4.0, "timestamp": i,
             "text": f"review text {i}", "category": "toys", "source": "t", "line": i + 1} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows, schema=REVIEWS), tmp_path / "reviews.parquet")
    upload(tmp_path / "reviews.parquet", f"{s3_root}/reviews.parquet")
    cands = json.dumps({"statements": [{"statement": "the product is sturdy", "sentiment": "positive"},
                                       {"statement": "I bought it for my son", "sentiment": "neutral"}]})
    star = dict(method="star", backend=BACKEND, use_cache=False, shard_size=3,
                backend_options={"rules": [['"statements"', cands]], "default": cands})
    run_extract(ExtractConfig(input=str(tmp_path / "reviews.parquet"), out=str(tmp_path / "star"), **star), **QUIET)
    run_extract(ExtractConfig(input=f"{s3_root}/reviews.parquet", out=f"{s3_root}/star", **star), **QUIET)
    # The judge sees the review (with_review): review 3's text makes it say "not explanatory".
    judge = {"rules": [["review text 3", json.dumps({"explanatory": False, "atomic": True})]],
             "default": json.dumps({"explanatory": True, "atomic": True}), "log": str(tmp_path / "judge.log")}
    q = dict(sample=5, seed=1, with_review=True, shard_size=7, backend=BACKEND, backend_options=judge, label="toys")
    local = run_quality(QualityConfig(input=str(tmp_path / "star"), out=str(tmp_path / "q"), use_cache=False, **q),
                        **QUIET)
    remote = run_quality(QualityConfig(input=f"{s3_root}/star", out=f"{s3_root}/q", **q), **QUIET)
    assert remote["summary"] == local["summary"] and remote["counts"] == local["counts"]
    sampled = pq.read_table(tmp_path / "q" / "judgements")
    assert local["counts"]["in"] == sampled.num_rows > 7 and remote["shards"] == -(-sampled.num_rows // 7)
    assert len(set(sampled.column("review_id").to_pylist())) == 5
    assert tables(f"{s3_root}/q", ("judgements", "errors")) == tables(str(tmp_path / "q"), ("judgements", "errors"))
    assert location(f"{s3_root}/q/report.md").read_text() == (tmp_path / "q" / "report.md").read_text()
    judged = {(r["review_id"], r["explanatory"]) for r in sampled.to_pylist()}
    assert all(ok is (rid != "r3") for rid, ok in judged)  # each worker read its reviews' texts
    # The judge's calls were cached under the S3 output: a re-run from scratch asks nothing.
    asked = calls(tmp_path / "judge.log")
    for name in ("_done", "judgements", "errors"):
        location(f"{s3_root}/q/{name}").rmtree()
    run_quality(QualityConfig(input=f"{s3_root}/star", out=f"{s3_root}/q", **q), **QUIET)
    assert calls(tmp_path / "judge.log") == asked


# -- ground truth ----------------------------------------------------------------------


def test_ground_truth_on_an_s3_extract_folder_matches_local(tmp_path, s3_root, ray_session):
    from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth

    src = make_extract(tmp_path / "extract")
    location(f"{s3_root}/extract").upload(src)
    local = run_ground_truth(GroundTruthConfig(input=str(src), out=str(tmp_path / "gt")), **QUIET)
    remote = run_ground_truth(GroundTruthConfig(input=f"{s3_root}/extract", out=f"{s3_root}/gt"), **QUIET)
    assert remote["counts"] == local["counts"] and remote["stage"] == local["stage"] == "triplet"
    assert [r["path"] for r in remote["config"]["input"]] == [
        f"{s3_root}/extract/statements/part-00000.parquet", f"{s3_root}/extract/statements/part-00001.parquet"]
    names = ("explanations", "sentences")
    assert tables(f"{s3_root}/gt", names) == tables(str(tmp_path / "gt"), names)
    errors = pq.read_table(location(f"{s3_root}/gt/errors").path, filesystem=location(f"{s3_root}/gt").fs)
    assert errors.num_rows == 2 and errors.column("source")[0].as_py().startswith(f"{s3_root}/extract/")
    # Re-run: complete, from the markers on the bucket.
    lines: list[str] = []
    run_ground_truth(GroundTruthConfig(input=f"{s3_root}/extract", out=f"{s3_root}/gt"), progress=lines.append)
    assert any("already complete" in s for s in lines)
