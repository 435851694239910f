"""LLM backends behind one interface: chat messages + sampling -> text and token counts.

`build_backend(spec)` returns a backend registered under `spec.backend` (hf, openai,
vllm); every backend module registers itself with `@register_backend(name)`, so adding
one is one new file. vLLM is imported lazily and only on GPU machines.
"""
from rexeval.models.llm.base import (BackendSpec, ChatRequest, LLMBackend, LLMResult,  # noqa: F401
                             SamplingParams, build_backend, register_backend)
