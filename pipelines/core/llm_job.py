"""What every LLM-backed job shares: model settings, the cached backend, actor sizing.

`rexeval extract` and `rexeval extract-quality` (and the judges to come) take the same
profile/backend/cache settings, build their LLM the same way in each actor, and size
their actors the same way; this module holds that once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rexeval.models.llm.base import BackendSpec
from rexeval.models.profiles import ModelOverrides

# Backend options that change how calls travel, not what they answer: kept out of the
# config hash so e.g. raising concurrency does not invalidate an output folder.
TRANSPORT_OPTIONS = ("concurrency", "timeout_s", "api_key", "api_key_env", "max_retries", "backoff_s")


class LLMJobSettings(BaseModel):
    """Model, backend, cache and worker settings of a job that calls an LLM."""

    model_config = ConfigDict(extra="forbid")

    profile: str = "local"
    models: ModelOverrides = Field(default_factory=dict, description="role -> model ref")
    backend: str | None = Field(None, description="hf | openai | vllm | module:Class "
                                "(default: the profile's llm_backend)")
    backend_options: dict[str, Any] = Field(default_factory=dict)
    max_retries: int = Field(2, ge=0, le=10)
    workers: int = Field(1, ge=1, description="LLM actors (each loads the model)")
    cpus_per_worker: float | None = Field(None, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    cache: str | None = Field(None, description="LLM-call cache file (default: under $REXEVAL_CACHE)")
    use_cache: bool = True

    def cache_path(self) -> str | None:
        if not self.use_cache:
            return None
        if self.cache:
            return self.cache
        from rexeval.models.gguf_cache import cache_root

        return str(cache_root() / "llm-calls.sqlite")

    def with_resolved_cache(self):
        """A copy whose cache path is absolute, resolved in the driver so that every
        worker uses the driver's cache file whatever its own environment says."""
        if not self.use_cache:
            return self
        return self.model_copy(update={"cache": str(Path(self.cache_path()).resolve())})

    def hashed_backend_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.backend_options.items() if k not in TRANSPORT_OPTIONS}


def llm_generate(backend: str, model: str, options: dict, cache_path: str | None):
    """A backend behind the call cache (when a cache path is given); built once per actor."""
    from rexeval.models.llm.base import build_backend

    llm = build_backend(BackendSpec(backend=backend, model=model, options=dict(options)))
    if cache_path:
        from rexeval.models.llm.cache import CachedBackend, LLMCache

        Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
        llm = CachedBackend(llm, LLMCache(cache_path))
    return llm
