"""The word-level vocabulary the trained generators read and write, saved with a checkpoint.

Text is split into words and punctuation marks with case kept; the `size` most frequent
training words are kept (ties broken alphabetically, so the vocabulary is the same on
every machine) and the rest read as UNK; a target is cut to a fixed number of words.

Case is kept because the references are cased: a lower-casing vocabulary makes NRT,
Att2Seq, PETER and CER write lower-case text, which case-sensitive metrics (BERTScore on
RoBERTa, BLEURT, BARTScore) penalise, while PEPLER and XRec (the backbone's tokenizer)
keep case; seed 000's code keeps case too. The original PETER-family corpora came
lower-cased from their preparers; that is a property of their data, not of the models.
Where we differ from seed 000: it splits on white space only ("great!" is one word
there); we tokenise with one regular expression so punctuation is a word of its own and
any review or ground-truth text works, and detokenise the output the same way back (no
space before punctuation).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from rexeval.models.generators.base import BOS, EOS, PAD, UNK

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
# Letters and digits of any script ([^\W_]), so "café" stays one word; every other
# non-space character is a mark of its own.
_WORD = re.compile(r"[^\W_]+(?:['’][^\W\d_]+)?|[^\w\s]|_")
_NO_SPACE_BEFORE = re.compile(r" ([.,!?;:%)\]'’])")
_NO_SPACE_AFTER = re.compile(r"([(\[$]) ")


def tokenize(text: str) -> list[str]:
    """The words and punctuation marks of `text`, case kept."""
    return _WORD.findall(text or "")


def detokenize(words: Iterable[str]) -> str:
    """Words joined back into a sentence (no space before punctuation)."""
    text = " ".join(words)
    return _NO_SPACE_AFTER.sub(r"\1", _NO_SPACE_BEFORE.sub(r"\1", text))


class Vocabulary:
    """Word <-> id, with PAD, BOS, EOS and UNK at ids 0-3."""

    def __init__(self, words: list[str]):
        self.words = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.index = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, texts: Iterable[str], size: int) -> Vocabulary:
        """The `size` most frequent words of `texts` (specials not counted in `size`)."""
        counts = Counter(w for t in texts for w in tokenize(t))
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls([w for w, _ in ranked[:size]])

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str, max_words: int) -> list[int]:
        """[BOS, w1 .. wn, EOS] with n <= max_words (longer texts are cut)."""
        ids = [self.index.get(w, UNK) for w in tokenize(text)[:max_words]]
        return [BOS, *ids, EOS]

    def decode(self, ids: Iterable[int]) -> str:
        return detokenize(self.words[i] for i in ids if i not in (PAD, BOS, EOS))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"words": self.words[len(SPECIALS):]}, ensure_ascii=False))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        return cls(json.loads(Path(path).read_text())["words"])
