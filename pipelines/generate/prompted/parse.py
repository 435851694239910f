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
_LAYOUT_START = re.compile(r"^(?:[-*•+]\s|\d+[.)]\s|#|\*\*)")  # a bullet, a numbered item, a heading
_UNIT_END = re.compile(r"(?<=[.!?])[ \t]+|\n+")  # a sentence end, or a line break of the layout


def parse_explanation(text: str, *, min_words: int = 5, max_words: int | None = 60,
                      asked: str = "20 to 30 words") -> tuple[str | None, str | None]:
    """The explanation text, or why the answer is not one (for the retry message).

    Reasoning blocks, code fences, a "Here is ...:" preamble, an "Explanation:" label and
    quotes around the whole text are dropped and whitespace is collapsed within each line;
    the layout's line breaks stay (one blank line at most between paragraphs), since
    PreferenceLogic asks for short paragraphs or bullets (seed 004, A.1). An answer that
    copies the prompt's data blocks (`<<<`, `>>>`) is refused. A trailing fragment without
    a sentence end (an answer cut by the token limit) is dropped when whole sentences of
    at least `min_words` words precede it; in an answer of several lines only within its
    last line (a last bullet without a full stop is kept: lists often end so). An answer
    longer than `max_words` keeps its leading whole sentences that fit in `max_words`,
    each distinct sentence once (small models often write a good first sentence, then
    repeat it until the token limit); with no such sentence of at least `min_words`
    words it is refused, as is an empty or too short answer (`asked` is the length the
    prompt asked for; the bounds are looser so a near miss is kept rather than
    regenerated). `max_words` None caps nothing: every answer of at least `min_words`
    words is kept whole.
    """
    body = _tidy(_FENCE.sub(" ", _THINK.sub(" ", text or "")))
    body = _tidy(_LABEL.sub("", _PREAMBLE.sub("", body)))
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


def _tidy(text: str) -> str:
    """Spaces collapsed within each line; a line that only wraps a sentence joined to the
    one before (a layout break follows a stop, a colon or a bold heading, or comes before
    a bullet, a number or a heading); blank lines between paragraphs kept as one."""
    out: list[str] = []
    for line in (" ".join(x.split()) for x in text.splitlines()):
        prev = out[-1] if out else ""
        if line and prev and not prev.endswith("**") and prev.rstrip(_QUOTES + ")*")[-1:] not in ".!?:" \
                and not _LAYOUT_START.match(line):
            out[-1] = f"{prev} {line}"
        else:
            out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def _units(body: str) -> list[tuple[str, str]]:
    """(sentence or line, the separator after it) in order: the layout's pieces."""
    out, start = [], 0
    for m in _UNIT_END.finditer(body):
        out.append((body[start:m.start()], m.group()))
        start = m.end()
    out.append((body[start:], ""))
    return [(u, sep) for u, sep in out if u]


def _leading_sentences(body: str, max_words: int) -> str:
    """The first distinct whole sentences (or lines) of `body` that together fit in
    `max_words`, with the line breaks between them."""
    units = _units(body)
    kept: list[str] = []
    seen: set[str] = set()
    words = 0
    for k, (unit, sep) in enumerate(units):
        if unit[-1] not in ".!?" and (k == len(units) - 1 or "\n" not in sep):
            break  # a sentence cut off by the token limit
        if unit in seen:
            continue
        n = len(unit.split())
        if words + n > max_words:
            break
        kept.append(unit + (sep if "\n" in sep else " "))
        seen.add(unit)
        words += n
    return "".join(kept).strip()


def _drop_cut_tail(body: str, min_words: int) -> str:
    """`body` without a last, unfinished sentence when whole sentences precede it."""
    if not body or body[-1] in ".!?" + _QUOTES + ")":
        return body
    if "\n" in body:  # a layout: only its last line can be the cut one
        head, last = body.rsplit("\n", 1)
        if _SENTENCE_END.search(last):
            parts = _SENTENCE_END.split(last)
            return _tidy(head + "\n" + " ".join(parts[:-1]))
        return body  # a last bullet or heading often ends without a stop: kept
    parts = _SENTENCE_END.split(body)
    head = " ".join(parts[:-1])
    return head if len(parts) > 1 and len(head.split()) >= min_words else body
