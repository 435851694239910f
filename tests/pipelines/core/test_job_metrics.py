"""The jobs' metrics (pipelines/core/job_metrics.py): rows in/out/error read from the
shards' counts by one convention; each shard of a run recorded once, by the driver, as
it finishes or at finish(); LLM usage split by outcome, cache and token kind; and
recording that does nothing outside Ray and never raises.

Values are caught where they would go to Ray (`telemetry.emit`); the real export is
tests/deploy/test_metrics_scrape.py."""
from __future__ import annotations

import re

import pyarrow as pa
import pytest

from rexeval.models.llm.base import LLMResult
from rexeval.models.llm.pricing import Usage
from rexeval.pipelines.core import job_metrics
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.job_metrics import ALL_METRICS, JOB_METRICS, record_llm_calls, record_llm_usage, row_counts
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Stage
from rexeval.serve import telemetry
from tests.doubles.metrics import catch_metrics


@pytest.fixture
def caught(monkeypatch):
    return catch_metrics(monkeypatch)


def test_rows_in_out_error_by_the_counts_convention():
    assert row_counts({"in": 10, "out": 8, "errors": 2}) == (10, 8, 2)
    assert row_counts({"rows": 5}) == (5, 5, 0)  # an embedding shard: all rows out
    assert row_counts({"rows": 5, "unparseable": 2, "errors": 1}) == (5, 4, 1)  # an LLM chunk
    assert row_counts({"users": 3, "items": 2, "ok": 4, "errors": 1}) == (5, 4, 1)  # profiles: in derived
    assert row_counts({"examples": 7, "n_pairs": 3}) == (7, 7, 0)
    assert row_counts({"reviews_in": 9, "train": 6}) == (9, 9, 0)
    assert row_counts({"train": 6, "valid": 1}) is None  # no guess
    assert row_counts({"in": "x", "out": 1}) == (1, 1, 0)  # a non-number is not a count


def test_every_metric_has_one_valid_name_and_the_serve_and_job_lists_make_the_whole():
    names = [m.name for m in ALL_METRICS]
    assert len(names) == len(set(names))
    assert set(names) == {m.name for m in telemetry.SERVE_METRICS} | {m.name for m in JOB_METRICS}
    for m in ALL_METRICS:
        assert re.fullmatch(r"rexeval_(serve|job)_[a-z_]+", m.name) and not m.name.endswith("_total"), m.name
        assert m.description and m.tags and m.kind in ("counter", "gauge", "histogram")
        assert (m.kind == "histogram") == bool(m.boundaries)
        assert list(m.boundaries) == sorted(m.boundaries)
    assert job_metrics.JOBS.specs["rexeval_job_rows_in"].exported == "ray_rexeval_job_rows_in_total"
    assert job_metrics.JOBS.specs["rexeval_job_shards_left"].exported == "ray_rexeval_job_shards_left"


def test_outside_ray_recording_does_nothing(monkeypatch):
    made = []
    monkeypatch.setattr(telemetry, "_ray_ready", lambda: False)
    monkeypatch.setattr(telemetry, "_make", lambda spec: made.append(spec) or object())
    monkeypatch.setattr(job_metrics.JOBS, "_made", {})
    job_metrics.record_shard("extract", {"in": 3, "out": 3})
    record_llm_calls("llm:likert", "m", 4, cache_hits=1, prompt_tokens=10)
    assert made == [] and job_metrics.JOBS._made == {} and not job_metrics.enabled()


def test_a_failing_export_never_reaches_the_job(monkeypatch, caplog):
    def boom(*a, **k):
        raise RuntimeError("metrics agent gone")

    monkeypatch.setattr(telemetry, "_ray_ready", lambda: True)
    monkeypatch.setattr(telemetry, "_make", lambda spec: object())
    monkeypatch.setattr(telemetry, "emit", boom)
    monkeypatch.setattr(job_metrics.JOBS, "_made", {})
    monkeypatch.setattr(job_metrics.JOBS, "_warned", False)
    with caplog.at_level("WARNING"):
        job_metrics.record_shard("extract", {"in": 3, "out": 2, "errors": 1})
        job_metrics.record_shard("extract", {"in": 3, "out": 2, "errors": 1})
    assert sum("metrics agent gone" in r.message for r in caplog.records) == 1  # said once


def test_shard_counts_recorded_once_zero_counters_skipped(caught):
    job_metrics.record_shard("extract", {"in": 10, "out": 10, "errors": 0, "candidates": 4})
    assert caught.total("rexeval_job_rows_in", job="extract") == 10
    assert caught.total("rexeval_job_rows_out", job="extract") == 10
    assert caught.total("rexeval_job_shards_done", job="extract") == 1
    assert not any(n == "rexeval_job_rows_error" for n, _ in caught.sums)  # a zero is not sent
    job_metrics.record_shard("extract", {"in": 4, "out": 3, "errors": 1})
    assert caught.total("rexeval_job_rows_error") == 1 and caught.total("rexeval_job_shards_done") == 2
    assert caught.made.count("rexeval_job_rows_in") == 1  # the Ray object is made once per process


def test_llm_usage_split_by_outcome_cache_and_token_kind(caught):
    usage = Usage().add_all([LLMResult(text="a", prompt_tokens=100, completion_tokens=5),
                             LLMResult(text="b", prompt_tokens=100, completion_tokens=7, cached=True),
                             LLMResult(error="timeout")])
    record_llm_usage("llm:likert", "judge-7b", usage)
    tags = {"job": "llm:likert", "model": "judge-7b"}
    assert caught.total("rexeval_job_llm_calls", outcome="ok", **tags) == 2
    assert caught.total("rexeval_job_llm_calls", outcome="error", **tags) == 1
    assert caught.total("rexeval_job_llm_cache_hits", **tags) == 1
    assert caught.total("rexeval_job_llm_tokens", kind="prompt", **tags) == 100  # the cached call cost none
    assert caught.total("rexeval_job_llm_tokens", kind="completion", **tags) == 5
    record_llm_calls("generate-profiles", None, 3, cache_hits=3)
    assert caught.total("rexeval_job_llm_calls", model="unknown") == 3
    record_llm_usage("x", "m", object())  # not a Usage: nothing, and no error


# -- the driver records as shards finish --------------------------------------------------


class CountingStage(Stage):
    """Shard i reads 10 rows, writes 10 - i, sets i aside (runs in Ray)."""

    batch_size = 1

    def __init__(self, output: ShardedOutput):
        self.output = output

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            self.output.write_shard(shard, {"values": pa.table({"x": [shard]})},
                                    {"in": 10, "out": 10 - shard, "errors": shard})
            rows.append({"shard": shard})
        return pa.Table.from_pylist(rows)


def _output(root):
    return ShardedOutput(root, "counting", {"v": 1}, ["values"])


@pytest.mark.slow
def test_a_run_records_each_of_its_shards_once(tmp_path, ray_session, caught):
    earlier = _output(tmp_path).open()
    earlier.write_shard(0, {"values": pa.table({"x": [0]})}, {"in": 10, "out": 10, "errors": 0})  # resumed: not counted
    job = ShardedJob(_output(tmp_path), 4, progress=lambda line: None)
    job.run(CountingStage(job.output), workers=2)
    assert caught.total("rexeval_job_shards_done", job="counting") == 3
    assert caught.total("rexeval_job_rows_in", job="counting") == 30
    assert caught.total("rexeval_job_rows_out", job="counting") == 9 + 8 + 7
    assert caught.total("rexeval_job_rows_error", job="counting") == 1 + 2 + 3
    left = caught.gauge("rexeval_job_shards_left", job="counting")
    assert left[0] == 3 and left[-1] == 0 and left == sorted(left, reverse=True)
    job.finish()
    assert caught.total("rexeval_job_shards_done") == 3  # finish() counts nothing twice


def test_shards_a_job_commits_itself_are_recorded_at_finish(tmp_path, caught):
    job = ShardedJob(_output(tmp_path), 2, progress=lambda line: None)
    for shard in job.todo:  # as split and star do: the driver writes its one shard
        job.output.write_shard(shard, {"values": pa.table({"x": [shard]})}, {"rows": 5})
    job.finish()
    assert caught.total("rexeval_job_rows_in", job="counting") == 10
    assert caught.total("rexeval_job_shards_done", job="counting") == 2
    assert caught.gauge("rexeval_job_shards_left", job="counting")[-1] == 0
    again = ShardedJob(_output(tmp_path), 2, progress=lambda line: None)
    again.finish()  # a re-run with nothing to do records nothing
    assert caught.total("rexeval_job_shards_done", job="counting") == 2


def test_without_ray_the_driver_reads_no_marker_for_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(telemetry, "_ray_ready", lambda: False)
    job = ShardedJob(_output(tmp_path), 1, progress=lambda line: None)
    job.output.write_shard(0, {"values": pa.table({"x": [0]})}, {"rows": 1})
    reads = []
    monkeypatch.setattr(job.output, "shard_counts", lambda s: reads.append(s) or {})
    monkeypatch.setattr(job.output, "done_shards", lambda: reads.append("all") or {})
    job._count(0)
    job._count_rest()
    assert reads == []
