"""St2Exp (seed 000, eq. 6-8): an LLM verifier votes 1/0 on whether each statement is
backed by the other side's explanation text.

Precision votes check every generated statement against the reference explanation;
recall votes check every reference statement against the generated explanation. Each
distinct (statement, document) pair is asked once, greedily (temperature 0, a few
tokens), through any LLM backend (with the call cache, a re-run costs nothing). An
answer without a readable verdict (`pipelines.evaluate.verdicts.parse_binary_verdict`) is asked
again with the reason, at most `max_retries` times; what is still unreadable counts as
unparseable and the metric's `unparseable` policy decides (default: unsupported).
Backend errors count the same way, separately.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rexeval.metrics.statement_level import BatchScores, check_policy
from rexeval.metrics.st2exp import POPULATIONS, st2exp_batch
from rexeval.pipelines.evaluate.verdicts import parse_binary_verdict

MAX_TOKENS = 8


@dataclass
class VerifierStats:
    """What the verifier cost and how often it could not be read."""

    asked: int = 0  # distinct (statement, document) pairs
    calls: int = 0  # LLM requests, retries included
    retries: int = 0
    unparseable: int = 0  # distinct pairs without a verdict after the retries
    errors: int = 0  # distinct pairs whose last call failed in the backend
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    raw_unparseable: list[str] = field(default_factory=list)  # a few examples, for the report

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "raw_unparseable"} | {
            "raw_unparseable_examples": self.raw_unparseable[:5]}


def read_vote(text: str) -> tuple[int | None, str | None]:
    """The verifier's vote in an answer, or why there is none (`llm.calls.Parser`)."""
    vote = parse_binary_verdict(text)
    if vote is not None:
        return vote, None
    return None, "it was empty" if not (text or "").strip() else "it held no single 1 or 0"


def verify(tasks: Sequence[tuple[str, str]], llm, max_retries: int = 1,
           max_tokens: int = MAX_TOKENS) -> tuple[list[int | None], VerifierStats]:
    """Votes (1, 0 or None) for (statement, document) tasks; distinct tasks asked once,
    through `llm.calls.ask` (in-process, or a streamed job's questions: `ask`'s docstring)."""
    from rexeval.models.llm.base import SamplingParams
    from rexeval.pipelines.core.llm.calls import ask
    from rexeval.prompts import load_prompt

    prompt = load_prompt("st2exp_verify")
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    answers, calls = ask(llm, [prompt.render(statement=s, document=d) for s, d in tasks], read_vote,
                         sampling=sampling, max_retries=max_retries, expected="1 or 0",
                         retry_prompt="verdict_retry")
    u = calls.usage
    stats = VerifierStats(asked=calls.asked, calls=u.calls, retries=calls.retries, unparseable=calls.unparseable,
                          errors=calls.errors, prompt_tokens=u.prompt_tokens + u.cached_prompt_tokens,
                          completion_tokens=u.completion_tokens + u.cached_completion_tokens,
                          seconds=u.seconds, raw_unparseable=list(calls.examples_unparseable))
    return [a.value for a in answers], stats


def score_st2exp(gen_statements: Sequence[Sequence[str]], ref_texts: Sequence[str],
                 ref_statements: Sequence[Sequence[str]], gen_texts: Sequence[str], llm,
                 unparseable: str = "zero", empty: str = "skip", max_retries: int = 1,
                 population: str = "both") -> tuple[BatchScores, VerifierStats]:
    """St2Exp-P/R/F1 per example: generated statements against the reference text,
    reference statements against the generated text, in one verifier batch. `population`:
    `metrics.st2exp.POPULATIONS` (seed 000's "both" asks no vote for an example with an
    empty side, which scores nothing)."""
    b = len(gen_statements)
    if not (len(ref_texts) == len(ref_statements) == len(gen_texts) == b):
        raise ValueError("gen_statements, ref_texts, ref_statements and gen_texts differ in length")
    check_policy(population, POPULATIONS, "St2Exp population")
    n = np.array([len(s) for s in gen_statements], dtype=np.int64)
    m = np.array([len(s) for s in ref_statements], dtype=np.int64)
    # Under "both" an example with one empty side scores nothing: its statements are not asked.
    asked = (n > 0) == (m > 0) if population == "both" else np.ones(b, dtype=bool)
    p_tasks = [(s, ref_texts[e]) for e in range(b) if asked[e] for s in gen_statements[e]]
    r_tasks = [(s, gen_texts[e]) for e in range(b) if asked[e] for s in ref_statements[e]]
    votes, stats = verify(p_tasks + r_tasks, llm, max_retries=max_retries)
    got = iter([np.nan if v is None else v for v in votes])
    # The ones not asked stand as 0 (not as unparseable): st2exp_batch leaves those examples undefined.
    flat_p = [next(got) if asked[e] else 0.0 for e in range(b) for _ in gen_statements[e]]
    flat_r = [next(got) if asked[e] else 0.0 for e in range(b) for _ in ref_statements[e]]
    out = st2exp_batch(np.array(flat_p, dtype=np.float64), n, np.array(flat_r, dtype=np.float64), m,
                       unparseable=unparseable, empty=empty, population=population)
    out.counts.update({"verifier_" + k: v for k, v in stats.as_dict().items() if k != "raw_unparseable_examples"})
    return out, stats
