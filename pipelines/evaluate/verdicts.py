"""Reading a judge's verdict out of raw model text.

Verifier prompts ask for a bare answer, and small or chatty models still add words,
quotes, code fences or a reasoning block. The parsers here accept an answer only when
it is unambiguous and return None otherwise, so the caller can retry and, in the end,
count the answer as unparseable (never guess).
"""
from __future__ import annotations

import re

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)
_FENCE = re.compile(r"```[a-zA-Z]*")
_BINARY = re.compile(r"(?<![\w.])([01])(?!\w|\.\d)")


def parse_binary_verdict(text: str | None) -> int | None:
    """1 or 0 from a verifier's answer; None when there is no digit or both appear.

    Reasoning blocks (<think>...</think>) and code fences are dropped first; "1",
    " 0\\n", '"1"', "Answer: 1" and "**0**" are read, while "1 or 0", "10", "0.5" and
    "yes" are not (they are ambiguous or not the requested format).
    """
    if text is None:
        return None
    body = _FENCE.sub(" ", _THINK.sub(" ", text))
    found = set(_BINARY.findall(body))
    if len(found) != 1:
        return None
    return int(found.pop())
