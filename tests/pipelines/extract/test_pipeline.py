"""The extract job on Ray with a scripted LLM: sharding, accounting, resume, cache."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.extract.pipeline import run_extract
from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.pipelines.core.schema import REVIEWS

ROOT = Path(__file__).resolve().parents[3]
BACKEND = "tests.doubles.llm:ScriptedLLM"
TRIPLETS = json.dumps([{"statement": "the zipper sticks", "topic": "construction",
                        "sentiment": "negative"}])


def write_reviews(path: Path, n: int) -> Path:
    rows = []
    for i in range(n):
        text = f"Review number {i}: the zipper sticks." if i % 5 else ""  # every 5th is empty
        rows.append({"review_id": f"r{i:03d}", "user_id": f"u{i % 3}", "item_id": f"i{i % 4}",
                     "rating": 3.0, "timestamp": 1_500_000_000 + i, "text": text,
                     "category": "clothes", "source": "test.jsonl", "line": i + 1})
    pq.write_table(pa.Table.from_pylist(rows, schema=REVIEWS), path)
    return path


def config(tmp_path: Path, out: str, cache: str, log: str, **extra) -> ExtractConfig:
    opts = {"default": TRIPLETS, "log": str(tmp_path / log), **extra.pop("options", {})}
    return ExtractConfig(input=str(tmp_path / "reviews.parquet"), out=str(tmp_path / out),
                         backend=BACKEND, backend_options=opts, models={"embedder": "none"},
                         cache=str(tmp_path / cache), shard_size=4, **extra)


def calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for t in ("statements", "errors") for p in sorted((root / t).glob("*.parquet"))}


@pytest.mark.slow
def test_extract_job_accounts_for_every_review_and_reruns_from_cache(tmp_path, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 10)
    m = run_extract(config(tmp_path, "out", "cache.sqlite", "calls.log"), progress=lambda s: None)
    c = m["counts"]
    assert c["in"] == 10 and c["out"] == 8 and c["errors"] == 2 and c["in"] == c["out"] + c["errors"]
    assert m["shards"] == 3 and c["statements"] == 8 and c["llm_calls"] == 8
    errors = pq.read_table(tmp_path / "out" / "errors").to_pylist()
    assert {e["row_id"] for e in errors} == {"r000", "r005"}
    assert calls(tmp_path / "calls.log") == 8
    # Same command again: complete, nothing recomputed. New folder, same cache: no calls.
    run_extract(config(tmp_path, "out", "cache.sqlite", "calls.log"), progress=lambda s: None)
    m2 = run_extract(config(tmp_path, "out2", "cache.sqlite", "calls.log"), progress=lambda s: None)
    assert calls(tmp_path / "calls.log") == 8 and m2["counts"]["cached_calls"] == 8
    assert files(tmp_path / "out") == files(tmp_path / "out2")


@pytest.mark.slow
def test_extract_job_killed_half_way_resumes_to_identical_output(tmp_path, ray_session):
    write_reviews(tmp_path / "reviews.parquet", 24)  # 6 shards
    # Reference: an uninterrupted run with its own cache.
    run_extract(config(tmp_path, "ref", "ref.sqlite", "ref.log"), progress=lambda s: None)

    # The same job as a separate driver process, slowed down, killed after two shards.
    # One shard's requests per call (batch_size 4 = shard_size): the shards then end one
    # call (0.7 s) apart, 2.8 s from the second to the last. With calls of 16, five
    # shards ended in one call and the sixth 0.7 s later, less than a loaded CI machine
    # may take to notice and kill.
    cfg = config(tmp_path, "out", "cache.sqlite", "calls.log", options={"delay_s": 0.7, "batch_size": 4})
    cfg_file = tmp_path / "extract.yaml"
    cfg_file.write_text(json.dumps(cfg.model_dump()))
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "rexeval.ray_jobs.extract", "--config", str(cfg_file)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    done_dir = tmp_path / "out" / "_done"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(done_dir.glob("*.json"))) < 2:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(list(done_dir.glob("*.json")))
    assert 2 <= finished < 6, "the job should have been killed half-way"
    before = calls(tmp_path / "calls.log")

    # Re-run the same command: finished shards are skipped; the rest is computed.
    lines = []
    m = run_extract(cfg, progress=lines.append)
    assert any("resuming" in s for s in lines)
    assert m["counts"]["in"] == 24 and m["status"] == "complete"
    assert files(tmp_path / "out") == files(tmp_path / "ref")
    # Only the unfinished part reached the model; calls of the killed shard already
    # answered were served by the cache.
    assert calls(tmp_path / "calls.log") - before <= (6 - finished) * 4
    assert calls(tmp_path / "calls.log") <= calls(tmp_path / "ref.log") + 4


@pytest.mark.slow
def test_streamed_job_writes_what_the_extractor_gives_in_one_process(tmp_path, ray_session):
    """The streamed job (passes over Ray Data, shards written by workers) and the
    extractor's own loop in this process give the same rows, shard by shard."""
    import rexeval.pipelines.extract.pipeline as ep
    from rexeval.pipelines.extract.extractor import Extractor
    from tests.doubles.llm import ScriptedLLM

    write_reviews(tmp_path / "reviews.parquet", 10)
    cfg = config(tmp_path, "out", "a.sqlite", "a.log")
    run_extract(cfg, progress=lambda s: None)
    models = ep.resolve_models(cfg)
    llm = ScriptedLLM.make(default=TRIPLETS)
    parts, total = ep.review_parts(cfg)
    for shard in range(3):
        extractor = Extractor(ep.make_settings(cfg, models), llm.generate)
        st, er, _ = extractor.run(ep.shard_reviews(parts, total, shard, cfg.shard_size))
        assert pq.read_table(tmp_path / "out" / "statements" / f"part-{shard:05d}.parquet").equals(st)
        assert pq.read_table(tmp_path / "out" / "errors" / f"part-{shard:05d}.parquet").equals(er)


