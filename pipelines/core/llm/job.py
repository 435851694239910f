"""What every LLM-backed job shares: model, backend, cache and worker settings.

`rexeval extract`, `extract-quality`, `evaluate` and the judges take the same
profile/backend/cache settings, and where their model runs (actors, vLLM engines, a judge
deployment or an OpenAI-compatible server) is decided in one place for all of them
(`pipelines/core/llm/placement.py`); each model actor builds its
LLM with `rexeval.models.llm.cache.build_cached_backend` from these settings
(the cache may be a local SQLite file or a URI: `models/llm/cache.py`).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rexeval.models.llm.base import BACKENDS
from rexeval.models.profiles import ModelOverrides
from rexeval.pipelines.core.stage import CPUS_PER_WORKER, MEMORY_PER_WORKER
from rexeval.serve.common import default_serve_port

# The "serve" backend (a client of the judge deployment) lives in the serve layer, above
# models/: the jobs that can use it declare it here, so `backend: serve` resolves in every
# job process and Ray worker without models/ importing serve/.
BACKENDS.add_lazy("serve", "rexeval.serve.judge_client")

# Backend options that change how calls travel, not what they answer: kept out of the
# config hash so e.g. raising concurrency does not invalidate an output folder.
TRANSPORT_OPTIONS = ("concurrency", "timeout_s", "api_key", "api_key_env", "max_retries", "backoff_s",
                     "transport_retries", "stream_workers", "shards_in_flight", "inflight_per_engine",
                     "serve_port")


class LLMJobSettings(BaseModel):
    """Model, backend, cache and worker settings of a job that calls an LLM."""

    model_config = ConfigDict(extra="forbid")

    profile: str = "local"
    models: ModelOverrides = Field(default_factory=dict, description="role -> model ref")
    backend: str | None = Field(None, description="hf | openai | vllm | module:Class "
                                "(default: the profile's llm_backend)")
    backend_options: dict[str, Any] = Field(default_factory=dict)
    max_retries: int = Field(2, ge=0, le=10)
    workers: int = Field(1, ge=1, description="the most LLM actors (each loads the model)")
    min_workers: int = Field(1, ge=1, description="the fewest LLM actors (at most `workers`)")
    cpus_per_worker: float | None = Field(None, gt=0, description=CPUS_PER_WORKER)
    gpus_per_worker: float = Field(0.0, ge=0)
    memory_per_worker: float | None = Field(None, gt=0, description=MEMORY_PER_WORKER)
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each worker actor asks for, e.g. "
        "{accel: 1} for a node type of the cluster's own; an autoscaler starts that type for them")
    cache: str | None = Field(None, description="LLM-call cache: a SQLite file, or a URI folder of one "
                              "object per call (default: under $REXEVAL_CACHE, or <out>/_llm_cache when "
                              "the output is a URI)")
    use_cache: bool = True

    def cache_path(self) -> str | None:
        if not self.use_cache:
            return None
        if self.cache:
            return self.cache
        from rexeval.models.llm.cache import default_cache

        return default_cache()

    def with_resolved_cache(self, out: str | None = None):
        """A copy whose cache is decided, in the driver, so that every worker uses the
        driver's cache whatever its own environment says: a local path made absolute, a
        URI kept. A job that passes its output `out` gets `<out>/_llm_cache` when that
        is a URI and no cache was given (`models/llm/cache.py` says why)."""
        if not self.use_cache:
            return self
        from rexeval.models.llm.cache import resolve_cache

        return self.model_copy(update={"cache": resolve_cache(self.cache, out)})

    def hashed_backend_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.backend_options.items() if k not in TRANSPORT_OPTIONS}


class ChunkedLLMSettings(LLMJobSettings):
    """An LLM job run in resumable chunks (`pipelines.core.llm.chunks`): where it writes,
    the Serve deployment its calls go through, prices, chunk size and seed. The judges
    and the prompted explanation generators share these."""

    out: str
    judge_service: str = Field("auto", description="auto | none | serve:APP | http(s)://host:port/judge "
                               "(the rexeval-judge deployment serves any chat LLM, generators' too)")
    judge_replicas: int = Field(1, ge=1)
    judge_gpus: float = Field(0.0, ge=0)
    serve_port: int = Field(default_factory=default_serve_port, ge=1, le=65535)
    price_table: str | None = Field(None, description="YAML of USD per 1M tokens (and per GPU-hour: gpu_hour) by model")
    chunk_size: int = Field(16, ge=1)
    seed: int = 0
