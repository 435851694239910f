"""An LLM job's settings decide its cache once, in the driver
(`models/llm/cache.resolve_cache` says where)."""
from __future__ import annotations

from rexeval.pipelines.core.llm.job import LLMJobSettings


def test_a_jobs_settings_resolve_their_cache_once(tmp_path, monkeypatch):
    monkeypatch.setenv("REXEVAL_CACHE", str(tmp_path / "home"))
    assert LLMJobSettings().with_resolved_cache().cache == str((tmp_path / "home" / "llm-calls.sqlite").resolve())
    assert LLMJobSettings().with_resolved_cache("s3://b/runs/x").cache == "s3://b/runs/x/_llm_cache"
    assert LLMJobSettings(use_cache=False).with_resolved_cache("s3://b/x").cache is None
    monkeypatch.setenv("REXEVAL_CACHE", "s3://b/cache")
    assert LLMJobSettings().cache_path() == "s3://b/cache/llm-calls"
