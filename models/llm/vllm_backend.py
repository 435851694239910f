"""The `vllm` backend: vLLM on GPUs through Ray (Ray 2.60, vLLM 0.32).

The ways in:
- An LLM job with `--backend vllm` deploys Ray's `ray.serve.llm` OpenAI app of vLLM
  replicas once (`pipelines/core/llm/engines.py`, with `serve/judge_vllm.py`'s
  `LLMConfig`), and every turn, repair and retry of the job is served by those engines.
- `build_request_processor(spec)` gives a `ray.data.llm` Processor for a Dataset whose
  rows carry `messages`, `temperature`, `top_p`, `max_tokens`, `seed` and optionally
  `json_schema` (JSON text) and `request_index`: one pass of single-turn requests over a
  dataset (benchmarks/bench_hf_batching.py), with its own engines for that pass.
- There is no per-call path: `VLLMBackend.generate` refuses, saying what to use (an
  engine started for every call was what made LLM work "called, not streamed").

vLLM is never imported here: `ray.data.llm` builds configs and processors without it,
and the engine actors import it on the GPU workers. Rows the engine fails come back
with `error` set (`should_continue_on_error=True`), never as a failed job.

`finish_reason` is inferred: Ray's vLLM stage does not report it, so a completion that
used all of `max_tokens` is "length" and any shorter one "stop".

Options (`BackendSpec.options`): engine_kwargs (merged over DEFAULT_ENGINE_KWARGS),
tensor_parallel_size, batch_size (32), concurrency (engine replicas: an int n means an
autoscaling pool of 1..n, a pair [m, n] a pool of m..n), accelerator_type (e.g. "H100"),
max_concurrent_batches (the processor's), serve_port (a job's vLLM app; default $REXEVAL_SERVE_PORT or 8000).
"""
from __future__ import annotations

import functools
import json
from typing import Any, Callable, Sequence

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMBackend, LLMResult, register_backend

DEFAULT_ENGINE_KWARGS: dict[str, Any] = {
    "max_model_len": 4096,
    "enable_prefix_caching": True,   # the same instructions open many prompts
    "enable_chunked_prefill": True,
}
ERROR_COLUMN = "__inference_error__"  # set by ray.data.llm on rows the engine failed
OUTPUT_COLUMNS = ("text", "prompt_tokens", "completion_tokens", "finish_reason", "error")


def processor_config(spec: BackendSpec, *, batch_size: int | None = None,
                     concurrency: int | Sequence[int] | None = None):
    """The `vLLMEngineProcessorConfig` for a spec; arguments override its options. A
    model URI stays the `model_source`: each engine copies it on its own node (Ray's
    vLLM stage downloads an `s3://` or `gs://` source where the engine starts), never
    through the driver's disk."""
    from ray.data.llm import vLLMEngineProcessorConfig

    from rexeval.models.refs import shipped_location

    opts = spec.options
    engine_kwargs = {**DEFAULT_ENGINE_KWARGS, **(opts.get("engine_kwargs") or {})}
    if opts.get("tensor_parallel_size"):
        engine_kwargs["tensor_parallel_size"] = int(opts["tensor_parallel_size"])
    conc = concurrency if concurrency is not None else opts.get("concurrency", 1)
    conc = tuple(int(c) for c in conc) if isinstance(conc, (list, tuple)) else int(conc)
    extra = {}
    if opts.get("max_concurrent_batches"):
        extra["max_concurrent_batches"] = int(opts["max_concurrent_batches"])
    return vLLMEngineProcessorConfig(
        model_source=shipped_location(spec.model),
        engine_kwargs=engine_kwargs,
        batch_size=int(batch_size or opts.get("batch_size", 32)),
        concurrency=conc,
        accelerator_type=opts.get("accelerator_type"),
        should_continue_on_error=True,
        **extra,
    )


def to_vllm_row(row: dict[str, Any], default_schema: str | None = None) -> dict[str, Any]:
    """Our request row -> the columns Ray's vLLM stages read (messages + sampling_params).

    The schema travels as JSON text (`structured_outputs.json` accepts a string), so the
    column has one Arrow type whatever the schemas are; rows without one carry None.
    """
    schema = row.get("json_schema") or default_schema
    seed = row.get("seed")
    sampling = {
        "temperature": float(row.get("temperature", 0.0)),
        "top_p": float(row.get("top_p", 1.0)),
        "max_tokens": int(row.get("max_tokens", 512)),
        "seed": None if seed is None else int(seed),
        "detokenize": False,  # the DetokenizeStage writes generated_text
        "structured_outputs": {"json": schema} if schema else None,
    }
    return {"messages": row["messages"], "sampling_params": sampling}


def from_vllm_row(row: dict[str, Any], passthrough: Sequence[str] = ("request_index",)) -> dict:
    """An engine output row (success or error) -> our output columns + passthrough."""
    out = {k: row.get(k) for k in passthrough if k in row}
    error = row.get(ERROR_COLUMN) or None
    if error:
        out.update(text=None, prompt_tokens=0, completion_tokens=0, finish_reason=None,
                   error=str(error))
        return out
    n_out = int(row.get("num_generated_tokens") or 0)
    max_tokens = row.get("max_tokens")
    out.update(text=row.get("generated_text") or "",
               prompt_tokens=int(row.get("num_input_tokens") or 0),
               completion_tokens=n_out,
               finish_reason="length" if max_tokens is not None and n_out >= int(max_tokens)
               else "stop",
               error=None)
    return out


def build_request_processor(spec: BackendSpec, *, json_schema: dict | str | None = None,
                            batch_size: int | None = None,
                            concurrency: int | Sequence[int] | None = None,
                            passthrough: Sequence[str] = ("request_index",)):
    """A Processor: request rows in, rows with OUTPUT_COLUMNS + `passthrough` out.

    `json_schema` is the default for rows without their own `json_schema` column value.
    Building it starts/joins Ray (ray.data.llm calls `ray.init`) but imports no vLLM.
    """
    from ray.data.llm import build_processor

    default_schema = (json.dumps(json_schema) if isinstance(json_schema, dict) else json_schema)
    passthrough = tuple(passthrough)
    processor = build_processor(
        processor_config(spec, batch_size=batch_size, concurrency=concurrency),
        preprocess=lambda row: to_vllm_row(row, default_schema),
        postprocess=lambda row: from_vllm_row(row, passthrough),
    )
    return FinishedRows(processor, functools.partial(_request_row, passthrough=passthrough))


def _request_row(row: dict[str, Any], passthrough: tuple[str, ...]) -> dict[str, Any]:
    if row.get(ERROR_COLUMN):
        return from_vllm_row(row, passthrough)
    return {k: row.get(k) for k in (*OUTPUT_COLUMNS, *passthrough) if k in row}


class FinishedRows:
    """A `ray.data.llm` processor whose output rows all pass through `finish`. Ray hands
    rows the engine failed straight to the output, skipping the postprocess (they hold
    every internal column), so a map after the processor (public API, nothing of the
    processor edited) gives them the same columns as the others. `processor` is the
    processor itself, for its config and stages."""

    def __init__(self, processor, finish: Callable[[dict[str, Any]], dict[str, Any]]):
        self.processor, self.finish = processor, finish

    @property
    def config(self):
        return self.processor.config

    def __call__(self, ds):
        return self.processor(ds).map(self.finish)


def request_rows(requests: list[ChatRequest]) -> list[dict[str, Any]]:
    """ChatRequests -> the row format `build_request_processor` reads."""
    return [{"request_index": i, "messages": r.messages, "temperature": r.sampling.temperature,
             "top_p": r.sampling.top_p, "max_tokens": r.sampling.max_tokens,
             "seed": r.sampling.seed,
             "json_schema": json.dumps(r.json_schema) if r.json_schema is not None else None}
            for i, r in enumerate(requests)]


@register_backend("vllm")
class VLLMBackend(LLMBackend):
    """The `vllm` backend has no per-call path: its engines serve a job's whole stream
    (`build_request_processor` inside `pipelines/core/llm/stream.py`), started once per
    job, never once per call."""

    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        raise ValueError(
            "the vllm backend runs inside a job's Ray Data stream, not call by call: run the job with "
            "--backend vllm (judges with --judge-service none or auto), or serve the model with "
            "`rexeval serve judge --backend vllm` and call it with --backend openai")
