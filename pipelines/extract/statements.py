"""Surface normalisation of extracted statements, and off-list topic mapping.

Present tense is the model's job (the prompts ask for it); here we only do what can be
done without changing meaning (seed 002): tidy whitespace, quotes and end punctuation,
give pronoun subjects the canonical "the product" subject, and drop duplicates within
one review. Topics outside the domain's list are mapped to the nearest listed topic by
embedding similarity, and the mapping is recorded on the row.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Callable, Sequence

import numpy as np

_SPACE = re.compile(r"\s+")
_QUOTES = "\"'`\u201c\u201d\u2018\u2019"
# Subjects that refer to the reviewed item; seed 002 writes them as "the product".
_PRONOUN_SUBJECT = re.compile(
    r"^(?:it|this|this product|this item|the item|this one|product)(?=\s)(\s+)", re.I)


def normalise_statement(text: str, product_subject: bool = False) -> str:
    """Tidy one statement; with `product_subject`, pronoun subjects become "the product"."""
    s = unicodedata.normalize("NFKC", text)
    s = _SPACE.sub(" ", s).strip().strip(_QUOTES).strip()
    s = re.sub(r"^[-*\u2022]\s*", "", s)  # list bullets
    s = re.sub(r"\s*[.!;,]+$", "", s).strip()
    if product_subject:
        s = _PRONOUN_SUBJECT.sub(lambda m: "the product" + m.group(1), s, count=1)
        if s[:12].lower() == "the product ":
            s = "the product " + s[12:]
    return s


def truncate_words(text: str, max_words: int) -> tuple[str, int]:
    """Keep the first `max_words` words (the seeds' reference code truncates by words).

    Returns the text and its original word count (equal to the kept count when nothing
    was cut), so the caller can record the truncation.
    """
    words = text.split()
    if len(words) <= max_words:
        return text, len(words)
    return " ".join(words[:max_words]), len(words)


class TopicMapper:
    """Map a topic label outside a domain's list to the closest listed topic.

    `encode` turns strings into L2-normalised vectors (a sentence-transformers model in
    the product; any function in tests). Each listed topic is represented by its name,
    long name and description, so "sizing" lands on fit and "cost" on price.
    """

    def __init__(self, encode: Callable[[Sequence[str]], np.ndarray]):
        self.encode = encode
        self._topics: dict[str, tuple[list[str], np.ndarray]] = {}

    def _domain(self, domain) -> tuple[list[str], np.ndarray]:
        if domain.domain not in self._topics:
            names = [t.name for t in domain.topics]
            texts = [f"{t.name}: {t.long_name}. {t.description}" for t in domain.topics]
            self._topics[domain.domain] = (names, np.asarray(self.encode(texts), dtype=np.float32))
        return self._topics[domain.domain]

    def map(self, domain, labels: Sequence[str]) -> list[tuple[str, float]]:
        """(listed topic, cosine similarity) for each label."""
        names, mat = self._domain(domain)
        if not labels:
            return []
        vecs = np.asarray(self.encode([lab.replace("_", " ") for lab in labels]), dtype=np.float32)
        sims = vecs @ mat.T
        best = sims.argmax(axis=1)
        return [(names[j], float(sims[i, j])) for i, j in enumerate(best)]


def sentence_encoder(model_location: str, device: str | None = None) -> Callable[[Sequence[str]], np.ndarray]:
    """A normalised sentence-transformers encoder for `TopicMapper` (loaded once)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_location, device=device or "cpu")

    def encode(texts: Sequence[str]) -> np.ndarray:
        return model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True,
                            show_progress_bar=False)

    return encode
