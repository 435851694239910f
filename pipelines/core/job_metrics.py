"""The jobs' counters, exported through Ray's metrics (see serve/telemetry.py for how
and why recording is lazy, cheap and never fails the job).

Rows in, out and in error, per job (the `job` tag is the output's job name: "extract",
"ingest-parse", "llm:likert", ...), come from the shards' own counts, the ones their
done markers hold: the driver (`ShardedJob`) records each shard of this run once, as
it finishes. Counts name rows in different words from job to job, so `row_counts`
reads them by a small convention (`IN_KEYS`, `OUT_KEYS`, "errors"); a job whose counts
fit none of it records nothing rather than a guess.

LLM calls, cache hits and tokens are recorded where a job's stage gets its LLM results
(`record_llm_usage` with the chunk's `Usage`, or `record_llm_calls` with the numbers).

The dashboard (deploy/grafana/rexeval-dashboard.json) is tested against `ALL_METRICS`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rexeval.serve.telemetry import SERVE_METRICS, MetricSet, MetricSpec, llm_metrics, record_llm

JOB_METRICS = [
    MetricSpec("rexeval_job_rows_in", "counter", "Rows the job's finished shards read", ("job",)),
    MetricSpec("rexeval_job_rows_out", "counter", "Rows the job's finished shards wrote", ("job",)),
    MetricSpec("rexeval_job_rows_error", "counter", "Rows the job's finished shards set aside as errors", ("job",)),
    MetricSpec("rexeval_job_shards_done", "counter", "Shards the job finished (this run's, not resumed ones)",
               ("job",)),
    MetricSpec("rexeval_job_shards_left", "gauge", "Shards of the job's current run not finished yet", ("job",)),
    *llm_metrics("rexeval_job", "job", "the job's stages made"),
]
JOBS = MetricSet(JOB_METRICS)

ALL_METRICS: list[MetricSpec] = [*SERVE_METRICS, *JOB_METRICS]
"""Every metric rexeval defines: the Serve apps' and the jobs'."""

IN_KEYS = ("in", "rows", "examples", "pairs", "reviews_in")
OUT_KEYS = ("out", "ok")
ERROR_KEY = "errors"


def enabled() -> bool:
    """Whether recording does anything here (a Ray driver or worker); lets a caller
    skip the work of gathering numbers nobody would receive."""
    return JOBS.enabled()


def _first(counts: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        if isinstance(counts.get(k), (int, float)):
            return int(counts[k])
    return None


def row_counts(counts: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(rows in, rows out, rows in error) of one shard's counts: the first of `IN_KEYS`
    and of `OUT_KEYS` present, and "errors" (0 when absent). When only one side is
    there the other is derived (in = out + errors, out = in - errors); None when
    neither is."""
    errors = _first(counts, (ERROR_KEY,)) or 0
    rows_in, rows_out = _first(counts, IN_KEYS), _first(counts, OUT_KEYS)
    if rows_in is None and rows_out is None:
        return None
    if rows_in is None:
        rows_in = rows_out + errors
    if rows_out is None:
        rows_out = max(rows_in - errors, 0)
    return rows_in, rows_out, errors


def record_shard(job: str, counts: Mapping[str, Any]) -> None:
    """One finished shard of `job`: its rows in/out/error and one more shard done."""
    try:
        rows = row_counts(counts)
    except Exception:  # noqa: BLE001  (odd counts are no reason to fail a job)
        rows = None
    if rows is not None:
        for name, value in zip(("rexeval_job_rows_in", "rexeval_job_rows_out", "rexeval_job_rows_error"), rows):
            JOBS.record(name, value, job=job)
    JOBS.record("rexeval_job_shards_done", 1, job=job)


def record_shards_left(job: str, left: int) -> None:
    JOBS.record("rexeval_job_shards_left", left, job=job)


def record_llm_calls(job: str, model: str | None, calls: int, cache_hits: int = 0, prompt_tokens: int = 0,
                     completion_tokens: int = 0, errors: int = 0) -> None:
    """LLM calls a stage of `job` made: `calls` in all (cached and failed included),
    `errors` of them failed, `cache_hits` answered by the cache; tokens of the calls a
    model answered (as `models.llm.pricing.Usage` counts them)."""
    record_llm(JOBS, "rexeval_job", {"job": job, "model": model or "unknown"}, calls - errors, errors, cache_hits,
               prompt_tokens, completion_tokens)


def record_llm_usage(job: str, model: str | None, usage: Any) -> None:
    """`record_llm_calls` from a `models.llm.pricing.Usage` (a CallStats' `.usage`)."""
    try:
        record_llm_calls(job, model, int(usage.calls), cache_hits=int(usage.cached_calls),
                         prompt_tokens=int(usage.prompt_tokens), completion_tokens=int(usage.completion_tokens),
                         errors=int(usage.errors))
    except Exception:  # noqa: BLE001  (a usage of another shape: nothing to record)
        pass
