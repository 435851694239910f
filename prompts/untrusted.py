"""Fencing of untrusted text (reviews, model output) inside a prompt.

A review is written by a stranger: it may try to close its block and talk to the model
as if it were the system. We wrap it between an opening and a closing line and break
every run of three or more angle brackets inside it, so no text can forge either
delimiter, whatever its case or spacing.
"""
from __future__ import annotations

import re

from rexeval.prompts.errors import PromptError

_LABEL = re.compile(r"^[A-Z][A-Z_]*$")
_RUN_OPEN = re.compile(r"<{3,}")
_RUN_CLOSE = re.compile(r">{3,}")


def open_tag(label: str = "REVIEW") -> str:
    """The line that opens an untrusted block, e.g. `<<<REVIEW`."""
    _check_label(label)
    return f"<<<{label}"


def close_tag(label: str = "REVIEW") -> str:
    """The line that closes an untrusted block, e.g. `REVIEW>>>`."""
    _check_label(label)
    return f"{label}>>>"


def neutralise(text: str) -> str:
    """Shorten every `<<<`/`>>>` run to two brackets: the text keeps its sense, not its power."""
    return _RUN_CLOSE.sub(">>", _RUN_OPEN.sub("<<", text))


def delimit_untrusted(text: str, label: str = "REVIEW") -> str:
    """`text` between its delimiter lines, with any delimiter look-alike inside it broken."""
    if not isinstance(text, str):
        raise PromptError(f"untrusted text must be a string, got {type(text).__name__}")
    return f"{open_tag(label)}\n{neutralise(text).strip()}\n{close_tag(label)}"


def _check_label(label: str) -> None:
    if not _LABEL.match(label):
        raise PromptError(f"delimiter label must be upper-case letters or '_', got {label!r}")
