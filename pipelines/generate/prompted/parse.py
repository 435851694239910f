"""Reading an explanation out of an LLM's answer, for every prompted generator and for
the detection suite's generator (`pipelines/judge/detect.py`)."""
from __future__ import annotations

import re

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z]*")
_PREAMBLE = re.compile(r"^(?:sure|okay|ok|certainly)?[,.!]?\s*here(?:'s| is)\b[^:\n]{0,80}:\s*",
                       re.IGNORECASE)
_LABEL = re.compile(r"^[*_#\s]*(?:(?:recommendation|final|your)\s+)?explanation[*_\s]*[:\-–—][*_\s]*",
                    re.IGNORECASE)
_QUOTES = "\"'“”‘’`"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def parse_explanation(text: str, *, min_words: int = 5, max_words: int | None = 60,
                      asked: str = "20 to 30 words") -> tuple[str | None, str | None]:
    """The explanation text, or why the answer is not one (for the retry message).

    Reasoning blocks, code fences, a "Here is ...:" preamble, an "Explanation:" label and
    quotes around the whole text are dropped and whitespace is collapsed. An answer that
    copies the prompt's data blocks (`<<<`, `>>>`) is refused. A trailing fragment without
    a sentence end (an answer cut by the token limit) is dropped when whole sentences of
    at least `min_words` words precede it. An answer
    longer than `max_words` keeps its leading whole sentences that fit in `max_words`,
    each distinct sentence once (small models often write a good first sentence, then
    repeat it until the token limit); with no such sentence of at least `min_words`
    words it is refused, as is an empty or too short answer (`asked` is the length the
    prompt asked for; the bounds are looser so a near miss is kept rather than
    regenerated). `max_words` None caps nothing: every answer of at least `min_words`
    words is kept whole.
    """
    body = " ".join(_FENCE.sub(" ", _THINK.sub(" ", text or "")).split())
    body = _LABEL.sub("", _PREAMBLE.sub("", body)).strip()
    while len(body) >= 2 and body[0] in _QUOTES and body[-1] in _QUOTES:
        body = body[1:-1].strip()
    if "<<<" in body or ">>>" in body:
        return None, ("it copies the input blocks marked <<< and >>>; reply with the explanation alone, "
                      "in your own words")
    body = _drop_cut_tail(body, min_words)
    n = len(body.split())
    if n == 0:
        return None, "it was empty; reply with the explanation itself"
    if max_words is not None and n > max_words:
        kept = _leading_sentences(body, max_words)
        if len(kept.split()) >= min_words:
            return kept, None
        return None, (f"it has {n} words, more than {max_words}: write a single explanation of "
                      f"{asked} with nothing before or after it")
    if n < min_words:
        return None, f"it has only {n} word(s): write a full explanation of {asked}"
    return body, None


def _leading_sentences(body: str, max_words: int) -> str:
    """The first distinct whole sentences of `body` that together fit in `max_words`."""
    kept: list[str] = []
    words = 0
    for sentence in _SENTENCE_END.split(body):
        if not sentence or sentence[-1] not in ".!?":
            break  # a sentence cut off by the token limit
        if sentence in kept:
            continue
        n = len(sentence.split())
        if words + n > max_words:
            break
        kept.append(sentence)
        words += n
    return " ".join(kept)


def _drop_cut_tail(body: str, min_words: int) -> str:
    """`body` without a last, unfinished sentence when whole sentences precede it."""
    if not body or body[-1] in ".!?" + _QUOTES + ")":
        return body
    parts = _SENTENCE_END.split(body)
    head = " ".join(parts[:-1])
    return head if len(parts) > 1 and len(head.split()) >= min_words else body
