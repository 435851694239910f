"""Asking a judge: distinct conversations once, unreadable answers retried a bounded
number of times, and what every call cost.

Every judge (Likert scores, pairwise verdicts, St2Exp votes) has the same loop: send the
conversations, read each answer with a parser that either returns a value or says what
was wrong, send the unreadable ones back with that reason (prompt `judge_retry`), and
after `max_retries` count what is still unreadable. The loop never guesses a value; the
caller's policy decides what an unreadable answer means (seed 001: a Likert score of 0).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A parser returns (value, None) when the answer is usable, (None, problem) otherwise.
Parser = Callable[[str], tuple[Any, str | None]]


@dataclass
class Answer:
    """The outcome for one conversation: a value, or why there is none."""

    value: Any = None
    raw: str | None = None  # the last answer's text
    problem: str | None = None  # why the last answer could not be read
    error: str | None = None  # the backend's error for the last call
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.value is not None


@dataclass
class CallStats:
    """Counts of one judging run; `usage` holds tokens, seconds and cached calls."""

    asked: int = 0  # distinct conversations
    retries: int = 0
    unparseable: int = 0
    errors: int = 0
    usage: Any = None  # models.llm.pricing.Usage
    examples_unparseable: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.usage is None:
            from rexeval.models.llm.pricing import Usage

            self.usage = Usage()

    def merge(self, other: CallStats) -> CallStats:
        self.asked += other.asked
        self.retries += other.retries
        self.unparseable += other.unparseable
        self.errors += other.errors
        self.usage.merge(other.usage)
        room = 5 - len(self.examples_unparseable)
        self.examples_unparseable.extend(other.examples_unparseable[:max(0, room)])
        return self

    def as_dict(self, price_table=None, model_id: str | None = None) -> dict:
        usage = self.usage.as_dict(price_table=price_table, model_id=model_id)
        usage["call_errors"] = usage.pop("errors")  # failed calls; `errors` counts conversations
        return {"asked": self.asked, "retries": self.retries, "unparseable": self.unparseable,
                "errors": self.errors, **usage, "unparseable_examples": self.examples_unparseable[:5]}


def conversation_key(messages: Sequence[dict]) -> str:
    return json.dumps(list(messages), sort_keys=True, ensure_ascii=False)


def ask(llm, conversations: Sequence[list[dict[str, str]]], parse: Parser, *, sampling=None,
        max_retries: int = 2, expected: str = "the requested format",
        stats: CallStats | None = None, json_schema: dict | None = None) -> tuple[list[Answer], CallStats]:
    """One Answer per conversation, in order. Identical conversations are asked once
    (a greedy judge would answer them alike); an unreadable answer is asked again with
    the parser's reason, at most `max_retries` times. With `json_schema`, backends that
    can constrain decoding (hf with xgrammar, vLLM, OpenAI-compatible servers) are held
    to it; the parser still reads the answer, so a backend that cannot is no worse off."""
    from rexeval.models.llm.base import ChatRequest, SamplingParams
    from rexeval.prompts import load_prompt

    sampling = sampling or SamplingParams(temperature=0.0, max_tokens=512)
    stats = stats if stats is not None else CallStats()
    retry = load_prompt("judge_retry")
    index: dict[str, int] = {}
    inverse = [index.setdefault(conversation_key(c), len(index)) for c in conversations]
    first = {}
    for c, i in zip(conversations, inverse):
        first.setdefault(i, list(c))
    convs = [first[i] for i in range(len(index))]
    stats.asked += len(convs)
    answers = [Answer() for _ in convs]
    todo = list(range(len(convs)))
    for attempt in range(max_retries + 1):
        if not todo:
            break
        results = llm.generate([ChatRequest(messages=convs[i], sampling=sampling, json_schema=json_schema)
                                for i in todo])
        stats.retries += len(todo) if attempt else 0
        again = []
        for i, res in zip(todo, results):
            stats.usage.add(res)
            a = answers[i]
            a.attempts += 1
            a.raw, a.error = res.text, res.error
            if res.error is not None:
                a.problem = None  # a failed call is not retried here: the backend retries transport
                continue
            value, problem = parse(res.text or "")
            if value is not None:
                a.value, a.problem = value, None
                continue
            a.problem = problem or "it could not be read"
            if attempt < max_retries:
                convs[i] = convs[i] + [{"role": "assistant", "content": res.text or ""},
                                       retry.render(problem=a.problem, expected=expected)[-1]]
                again.append(i)
        todo = again
    for a in answers:
        if a.value is None:
            if a.error is not None:
                stats.errors += 1
            else:
                stats.unparseable += 1
                if len(stats.examples_unparseable) < 5:
                    stats.examples_unparseable.append((a.raw or "")[:300])
    return [answers[i] for i in inverse], stats
