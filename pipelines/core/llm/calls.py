"""Asking a judge: distinct conversations once, unreadable answers retried a bounded
number of times, and what every call cost.

Every judge (Likert scores, pairwise verdicts, St2Exp votes) has the same loop: send the
conversations, read each answer with a parser that either returns a value or says what
was wrong, send the unreadable ones back with that reason (prompt `judge_retry`), and
after `max_retries` count what is still unreadable. The loop never guesses a value; the
caller's policy decides what an unreadable answer means (seed 001: a Likert score of 0).
"""
from __future__ import annotations

import abc
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


def parser_ref(parse: Parser) -> dict:
    """A parser as data a worker can rebuild (`rebuild_parser`): a module-level function,
    or a `functools.partial` of one with keyword arguments."""
    import functools

    fn, kwargs = (parse.func, dict(parse.keywords)) if isinstance(parse, functools.partial) else (parse, {})
    if isinstance(parse, functools.partial) and parse.args:
        raise ValueError("a parser partial may bind keyword arguments only")
    where = f"{fn.__module__}:{fn.__qualname__}"
    if "<" in where:
        raise ValueError(f"the parser {where} is not a module-level function: a worker cannot import it")
    return {"fn": where, "kwargs": kwargs}


def rebuild_parser(ref: dict) -> Parser:
    import functools
    import importlib

    module, name = ref["fn"].split(":")
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return functools.partial(fn, **ref["kwargs"]) if ref["kwargs"] else fn


def question(messages: Sequence[dict], parse: Parser, *, sampling, max_retries: int, expected: str,
             json_schema: dict | None, retry_prompt: str = "judge_retry") -> dict:
    """One conversation to ask, with how to read and retry its answer (the prompt that
    sends an unreadable answer back), as plain data."""
    q = {"messages": list(messages), "parser": parser_ref(parse), "sampling": sampling.model_dump(),
         "json_schema": json_schema, "max_retries": int(max_retries), "expected": expected}
    if retry_prompt != "judge_retry":
        q["retry_prompt"] = retry_prompt
    return q


class AskSteps:
    """`ask`'s loop for one question as steps (`start` / `request` / `role` / `advance`):
    what `ask` runs in-process and a streamed job (`llm.stream.StreamSteps`) runs over
    passes, so both read, retry and count alike. The work is a plain JSON dict."""

    def __init__(self):
        self._retry: dict[str, Any] = {}
        self._parsers: dict[str, Parser] = {}

    def _retry_prompt(self, name: str):
        from rexeval.prompts import load_prompt

        if name not in self._retry:
            self._retry[name] = load_prompt(name)
        return self._retry[name]

    def start(self, q: dict) -> dict:
        return {"q": q, "messages": list(q["messages"]), "attempts": 0, "value": None, "raw": None,
                "problem": None, "error": None, "done": False, "usage": []}

    def request(self, work: dict):
        from rexeval.models.llm.base import ChatRequest, SamplingParams

        if work["done"]:
            return None
        q = work["q"]
        return ChatRequest(messages=work["messages"], sampling=SamplingParams(**q["sampling"]),
                           json_schema=q["json_schema"])

    def role(self, work: dict) -> str:
        return "llm"

    def _parser(self, ref: dict) -> Parser:
        key = json.dumps(ref, sort_keys=True)
        if key not in self._parsers:
            self._parsers[key] = rebuild_parser(ref)
        return self._parsers[key]

    def advance(self, work: dict, res) -> dict:
        w = dict(work)
        q = w["q"]
        w["usage"] = [*w["usage"], res.model_dump(include={"error", "cached", "prompt_tokens",
                                                          "completion_tokens", "seconds"})]
        w["attempts"] += 1
        w["raw"], w["error"] = res.text, res.error
        if res.error is not None:
            # A model-side failure is not retried here (transport failures never reach
            # advance: the backend or the stream retries them).
            w.update(problem=None, done=True)
            return w
        value, problem = self._parser(q["parser"])(res.text or "")
        if value is not None:
            w.update(value=value, problem=None, done=True)
            return w
        w["problem"] = problem or "it could not be read"
        if w["attempts"] <= q["max_retries"]:
            w["messages"] = w["messages"] + [{"role": "assistant", "content": res.text or ""},
                                             self._retry_prompt(q.get("retry_prompt", "judge_retry")).render(
                                                 problem=w["problem"], expected=q["expected"])[-1]]
        else:
            w["done"] = True
        return w


def answer_of(work: dict) -> Answer:
    return Answer(value=work["value"], raw=work["raw"], problem=work["problem"], error=work["error"],
                  attempts=work["attempts"])


def count_works(works: Sequence[dict], stats: CallStats) -> CallStats:
    """Add settled questions' calls and outcomes to `stats` (as `ask` counts them)."""
    from rexeval.models.llm.base import LLMResult

    stats.asked += len(works)
    for w in works:
        stats.retries += max(0, w["attempts"] - 1)
        for u in w["usage"]:
            stats.usage.add(LLMResult(text=None if u["error"] else "", **u))
        if w["value"] is None:
            if w["error"] is not None:
                stats.errors += 1
            else:
                stats.unparseable += 1
                if len(stats.examples_unparseable) < 5:
                    stats.examples_unparseable.append((w["raw"] or "")[:300])
    return stats


class AskPlayback(abc.ABC):
    """What stands in for the LLM when a streamed job runs a task function (`ask` hands
    it its questions): `Recorder` collects them, `Replayer` answers them from the
    stream's settled questions."""

    model_id: str = "?"

    @abc.abstractmethod
    def ask(self, questions: list[dict], stats: CallStats) -> list[Answer]:
        """One Answer per question, in order (counting what they cost into `stats`)."""


def question_key(q: dict) -> str:
    return json.dumps(q, sort_keys=True, ensure_ascii=False)


class Recorder(AskPlayback):
    """Collects every question a task function asks (distinct, in order); the answers it
    gives back are empty, and the function's output is thrown away. A task function
    whose later questions depend on earlier answers cannot be streamed this way: the
    `Replayer` then finds a question nobody asked, and says so."""

    def __init__(self, model_id: str):
        self.model_id = model_id
        self.questions: dict[str, dict] = {}

    def ask(self, questions: list[dict], stats: CallStats) -> list[Answer]:
        for q in questions:
            self.questions.setdefault(question_key(q), q)
        return [Answer(problem="not asked yet") for _ in questions]


class Replayer(AskPlayback):
    """Answers a task function's questions from the stream's settled works."""

    def __init__(self, model_id: str, works: Sequence[dict]):
        self.model_id = model_id
        self.works = {question_key(w["q"]): w for w in works if "q" in w}

    def ask(self, questions: list[dict], stats: CallStats) -> list[Answer]:
        keys = [question_key(q) for q in questions]
        missing = [k for k in keys if k not in self.works]
        if missing:
            raise RuntimeError("the task asked a question that was not streamed (its questions must not depend "
                               f"on earlier answers): {missing[0][:200]}")
        count_works([self.works[k] for k in dict.fromkeys(keys)], stats)
        return [answer_of(self.works[k]) for k in keys]


def ask(llm, conversations: Sequence[list[dict[str, str]]], parse: Parser, *, sampling=None,
        max_retries: int = 2, expected: str = "the requested format",
        stats: CallStats | None = None, json_schema: dict | None = None,
        retry_prompt: str = "judge_retry") -> tuple[list[Answer], CallStats]:
    """One Answer per conversation, in order. Identical conversations are asked once
    (a greedy judge would answer them alike); an unreadable answer is asked again with
    the parser's reason, at most `max_retries` times. With `json_schema`, backends that
    can constrain decoding (hf with xgrammar, vLLM, OpenAI-compatible servers) are held
    to it; the parser still reads the answer, so a backend that cannot is no worse off.

    `llm` is a backend (the loop runs here, over `AskSteps`) or an `AskPlayback` (a
    streamed job: the questions go through the job's stream instead)."""
    from rexeval.models.llm.base import SamplingParams

    sampling = sampling or SamplingParams(temperature=0.0, max_tokens=512)
    stats = stats if stats is not None else CallStats()
    qs = [question(c, parse, sampling=sampling, max_retries=max_retries, expected=expected,
                   json_schema=json_schema, retry_prompt=retry_prompt) for c in conversations]
    if isinstance(llm, AskPlayback):
        return llm.ask(qs, stats), stats
    index: dict[str, int] = {}
    inverse = [index.setdefault(conversation_key(c), len(index)) for c in conversations]
    first: dict[int, dict] = {}
    for q, i in zip(qs, inverse):
        first.setdefault(i, q)
    steps = AskSteps()
    works = [steps.start(first[i]) for i in range(len(index))]
    while todo := [i for i, w in enumerate(works) if steps.request(w) is not None]:
        results = llm.generate([steps.request(works[i]) for i in todo])
        for i, res in zip(todo, results):
            works[i] = steps.advance(works[i], res)
    count_works(works, stats)
    return [answer_of(works[i]) for i in inverse], stats
