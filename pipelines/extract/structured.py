"""Ask an LLM for structured answers: generate -> parse/repair/validate -> bounded retries.

Every task ends in an `Outcome`: valid items, or the reason and the raw text of the
last attempt, so the caller writes statements or an error row and never crashes or
drops a row. A retry shows the model its previous answer and what was wrong with it
(the feedback prompt is `prompts/retry_feedback.yaml`), which changes the prompt, so
greedy decoding can give a different answer and the call cache still applies.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from rexeval.models.llm.base import ChatRequest, LLMResult, SamplingParams
from rexeval.pipelines.extract.outputs import OutputSpec, Parsed, parse_output

Generate = Callable[[list[ChatRequest]], list[LLMResult]]


@dataclass
class Task:
    """One prompt whose answer must match `spec` (and `schema` when decoding is constrained)."""

    messages: list[dict[str, str]]
    spec: OutputSpec
    schema: dict[str, Any] | None = None


@dataclass
class Outcome:
    parsed: Parsed | None = None
    raw: str | None = None
    attempts: int = 0
    error_type: str | None = None
    message: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_calls: int = 0
    repairs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error_type is None and self.parsed is not None


def _feedback(problem: str, spec: OutputSpec, prompt) -> str:
    want = {"array": "a JSON array of objects",
            "object_list": f'a JSON object with the single key "{spec.key}" holding a list',
            "object": "one JSON object"}[spec.container]
    fields = ", ".join(f'"{k}"' for k in spec.item.model_fields)
    msgs = prompt.render(problem=problem, expected=want, fields=fields)
    return msgs[-1]["content"]


def _safe_generate(generate: Generate, requests: list[ChatRequest]) -> list[LLMResult]:
    """A backend that raises fails only this round's requests, with the reason."""
    try:
        results = list(generate(requests))
    except Exception as exc:  # noqa: BLE001 - any backend failure becomes error rows
        return [LLMResult(error=f"{type(exc).__name__}: {exc}") for _ in requests]
    if len(results) != len(requests):
        return [LLMResult(error=f"backend returned {len(results)} results for {len(requests)} requests")
                for _ in requests]
    return results


def record_answer(out: Outcome, convo: list[dict[str, str]], task: Task, res: LLMResult,
                  sampling: SamplingParams, last: bool, feedback) -> list[dict[str, str]] | None:
    """Take one answer into `out`; the conversation to send next (the answer shown back
    with what was wrong) or None when the task is settled. Pure: the extraction and
    extraction-quality steps share it, in a stream or in-process, so an answer means
    the same wherever it was asked."""
    out.attempts += 1
    out.prompt_tokens += res.prompt_tokens
    out.completion_tokens += res.completion_tokens
    out.cached_calls += int(res.cached)
    if not res.ok:
        # Backend errors are not retried here: transport failures are retried (or left
        # for a re-run) by whoever calls; what remains is the model's or the request's.
        out.error_type, out.message, out.raw = "backend_error", res.error or "no text", None
        return None
    out.raw = res.text
    parsed = parse_output(res.text, task.spec, salvage=last)
    if parsed.ok:
        out.parsed, out.error_type, out.message = parsed, None, ""
        out.repairs = parsed.repairs
        return None
    out.error_type, out.message = parsed.error_type, parsed.message
    if res.finish_reason == "length":
        out.message += f" (the answer hit the {sampling.max_tokens}-token limit)"
    if last:
        return None
    return convo + [{"role": "assistant", "content": res.text},
                    {"role": "user", "content": _feedback(out.message, task.spec, feedback)}]


def items_json(items: list[Any], key: str | None = None) -> str:
    """Compact JSON of validated items (the verifier's input), stable across runs."""
    data = [it.model_dump() if hasattr(it, "model_dump") else it for it in items]
    return json.dumps({key: data} if key else data, ensure_ascii=False, separators=(", ", ": "))
