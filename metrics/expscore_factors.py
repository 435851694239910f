"""The nine explainability factors of ExpScore (seed 003, section 3.2), one pure function each.

ExpScore learns a quality score from a handful of interpretable numbers per explanation.
Each number is computed here over a batch (a sequence of texts, plus what that factor
needs), returning a float64 array with one value per explanation. Nothing here loads a
model or talks to a server: the sentence encoder, the sentiment analyser and the grammar
checker are objects the caller passes in, so every factor runs in a unit test with a fake.

Words. Every factor that counts words uses `words()`: lowercase, then each run of
letters/digits (with inner apostrophes, "don't") is one word. Punctuation is not a word.

The factors (codes as in the seed's Table 3):

- REL relevance: mean cosine similarity between the explanation's sentence embedding and
  the embeddings of the item's reviews. The seed compares with one review; the mean over
  all of the item's reviews is the expected value of that comparison for a review drawn
  at random, with less noise. With unit vectors it equals the dot product with the mean
  review vector (the un-normalised centroid), which is how it is computed. Empty
  explanation: 0 (as STS does in this project); item without reviews: NaN.
- LEN length: number of words that are not in scikit-learn's `ENGLISH_STOP_WORDS`
  (a fixed list of 318 English words, so results do not drift with a package's data).
- REA readability: Flesch reading ease, 206.835 - 1.015 * words/sentences
  - 84.6 * syllables/words. Sentences are the pieces between runs of . ! ? that hold
  at least one word (a text without end punctuation is one sentence). Syllables come
  from `syllables()`, a documented rule (textstat needs the CMU dictionary, an NLTK
  download that fails offline). A text without words: NaN.
- WI word importance: the sum, over the explanation's words (repeats included), of the
  inverse term frequency 1 / (1 + tf(w)), tf counted over a reference corpus of reviews
  (`term_frequencies`). The +1 is add-one smoothing: a word the corpus never uses
  scores 1, the most a word can.
- REP repetition: duplicate segments, counted as repeated word n-grams: for each
  distinct n-gram, its occurrences beyond the first (n = 2 by default, so "the sound is
  great and the sound is great" has 3: "the sound", "sound is", "is great").
- SUB subjectivity and POL polarity: TextBlob's pattern analyser (lexicon inside the
  package, no corpus download); SUB in [0, 1], POL in [-1, 1] as signed by TextBlob.
- GC grammar correctness: 1 / (1 + e), e the number of issues a LanguageTool checker
  reports (grammar, spelling, style: every match). 1 means none found; higher is
  better, like the seed's positive GC weight. The checker is any object with
  `count_errors(texts) -> list[int]`; without one the factor is *unavailable* (see
  `factor_table`), never 0.
- FA feature appearance: how many of the row's distinct feature words/phrases appear in
  the explanation, as a contiguous run of its words (case-insensitive, no stemming:
  "string" does not match "strings").

`factor_table` computes the matrix for a DataFrame and lists the factors it could not
compute with the reason; the learned heads are then trained and scored without them.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

FACTORS: tuple[str, ...] = ("REL", "LEN", "REA", "WI", "REP", "SUB", "POL", "GC", "FA")
"""Factor codes in the seed's order (Table 3)."""

FACTOR_NAMES: dict[str, str] = {
    "REL": "relevance", "LEN": "length", "REA": "readability", "WI": "word importance",
    "REP": "repetition", "SUB": "subjectivity", "POL": "polarity",
    "GC": "grammar correctness", "FA": "feature appearance",
}

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")
_SENTENCE_END = re.compile(r"[.!?]+")
_VOWEL_RUN = re.compile(r"[aeiouy]+")


class Encoder(Protocol):
    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class GrammarChecker(Protocol):
    def count_errors(self, texts: Sequence[str]) -> list[int]: ...


# --- words, sentences, syllables --------------------------------------------------------

def words(text: str) -> list[str]:
    """Lowercased words of `text` (runs of letters/digits, inner apostrophes kept)."""
    return _WORD.findall(str(text).lower())


def stop_words() -> frozenset[str]:
    """scikit-learn's fixed English stop-word list."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def sentence_count(text: str) -> int:
    """Pieces between runs of . ! ? that contain a word."""
    return sum(1 for piece in _SENTENCE_END.split(str(text)) if words(piece))


def syllables(word: str) -> int:
    """Syllables of one word by rule: vowel groups (a e i o u y), less a silent final e.

    The final e is silent unless the word ends in consonant + "le" ("table" keeps 2) or
    it is the only vowel group ("the" stays 1). Words without letters count 1. Examples:
    make 1, happy 2, guitar 2, beautiful 3, table 2, strings 1.
    """
    w = "".join(c for c in word.lower() if c.isalpha())
    if not w:
        return 1
    count = len(_VOWEL_RUN.findall(w))
    if count > 1 and w.endswith("e") and not (len(w) > 2 and w.endswith("le") and w[-3] not in "aeiouy"):
        count -= 1
    return max(1, count)


# --- the factors -------------------------------------------------------------------------

def relevance(explanations: Sequence[str], review_sets: Sequence[Sequence[str]], encoder: Encoder,
              centroid_cache: dict | None = None) -> np.ndarray:
    """REL: mean cosine between each explanation and its item's reviews.

    `encoder.encode(texts)` returns one row per text; rows are re-normalised here.
    Each distinct text is encoded once per call; `centroid_cache` (a dict keyed by the
    tuple of review texts) lets a caller keep review means across calls.
    """
    cache = {} if centroid_cache is None else centroid_cache
    keys = [tuple(str(r) for r in (() if reviews is None else reviews) if str(r).strip())
            for reviews in review_sets]
    new_texts = sorted({t for k in keys if k and k not in cache for t in k})
    expl = [str(e) for e in explanations]
    to_encode = sorted(set(new_texts) | {e for e in expl if e.strip()})
    vectors = dict(zip(to_encode, _unit_rows(encoder.encode(to_encode)))) if to_encode else {}
    for k in keys:
        if k and k not in cache:
            cache[k] = np.mean([vectors[t] for t in k], axis=0)
    out = np.full(len(expl), np.nan)
    for i, (e, k) in enumerate(zip(expl, keys)):
        if not k:
            continue
        out[i] = float(np.clip(vectors[e] @ cache[k], -1.0, 1.0)) if e.strip() else 0.0
    return out


def length(texts: Sequence[str]) -> np.ndarray:
    """LEN: words that are not stop words."""
    stops = stop_words()
    return np.array([sum(1 for w in words(t) if w not in stops) for t in texts], dtype=np.float64)


def flesch_reading_ease(text: str) -> float:
    """Flesch reading ease of one text (NaN without words)."""
    ws = words(text)
    if not ws:
        return float("nan")
    n_sent = max(1, sentence_count(text))
    n_syll = sum(syllables(w) for w in ws)
    return 206.835 - 1.015 * len(ws) / n_sent - 84.6 * n_syll / len(ws)


def readability(texts: Sequence[str]) -> np.ndarray:
    """REA: Flesch reading ease per text."""
    return np.array([flesch_reading_ease(t) for t in texts], dtype=np.float64)


def term_frequencies(corpus: Iterable[str]) -> Counter:
    """Word counts over a reference corpus (the reviews), for WI."""
    counts: Counter = Counter()
    for text in corpus:
        counts.update(words(text))
    return counts


def word_importance(texts: Sequence[str], term_frequency: Mapping[str, int]) -> np.ndarray:
    """WI: sum of 1 / (1 + tf(w)) over the text's words (unseen words: 1)."""
    return np.array([sum(1.0 / (1.0 + term_frequency.get(w, 0)) for w in words(t)) for t in texts],
                    dtype=np.float64)


def repeated_ngrams(text: str, n: int = 2) -> int:
    """Occurrences of word n-grams beyond their first in one text."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ws = words(text)
    grams = Counter(tuple(ws[i:i + n]) for i in range(len(ws) - n + 1))
    return sum(c - 1 for c in grams.values())


def repetition(texts: Sequence[str], n: int = 2) -> np.ndarray:
    """REP: repeated word n-grams per text."""
    return np.array([repeated_ngrams(t, n) for t in texts], dtype=np.float64)


def textblob_sentiment(text: str) -> tuple[float, float]:
    """(polarity, subjectivity) from TextBlob's pattern analyser (offline lexicon)."""
    from textblob import TextBlob

    s = TextBlob(str(text)).sentiment
    return float(s.polarity), float(s.subjectivity)


def subjectivity(texts: Sequence[str],
                 analyse: Callable[[str], tuple[float, float]] = textblob_sentiment) -> np.ndarray:
    """SUB: subjectivity in [0, 1]; `analyse(text) -> (polarity, subjectivity)`."""
    return np.array([analyse(t)[1] for t in texts], dtype=np.float64)


def polarity(texts: Sequence[str],
             analyse: Callable[[str], tuple[float, float]] = textblob_sentiment) -> np.ndarray:
    """POL: signed polarity in [-1, 1]; `analyse(text) -> (polarity, subjectivity)`."""
    return np.array([analyse(t)[0] for t in texts], dtype=np.float64)


def grammar_correctness(texts: Sequence[str], checker: GrammarChecker) -> np.ndarray:
    """GC: 1 / (1 + issues found by the checker)."""
    texts = [str(t) for t in texts]
    counts = list(checker.count_errors(texts)) if texts else []
    if len(counts) != len(texts):
        raise ValueError(f"grammar checker returned {len(counts)} counts for {len(texts)} texts")
    return np.array([1.0 / (1.0 + max(0, int(c))) for c in counts], dtype=np.float64)


def _phrase_in(phrase: tuple[str, ...], ws: list[str]) -> bool:
    n = len(phrase)
    return any(tuple(ws[i:i + n]) == phrase for i in range(len(ws) - n + 1))


def feature_appearance(texts: Sequence[str], features: Sequence[Sequence[str] | None]) -> np.ndarray:
    """FA: distinct features of the row that appear in its explanation as a run of words."""
    out = []
    for text, feats in zip(texts, features):
        ws = words(text)
        phrases = {tuple(words(f)) for f in (() if feats is None else feats)} - {()}
        out.append(sum(1 for p in phrases if _phrase_in(p, ws)))
    return np.array(out, dtype=np.float64)


# --- the whole matrix -------------------------------------------------------------------

@dataclass
class FactorTable:
    """Factor values (one column per factor code, NaN where unavailable) and, for each
    unavailable factor, why."""

    values: Any  # pandas.DataFrame
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def available(self) -> list[str]:
        return [c for c in self.values.columns if c not in self.unavailable]


def factor_table(frame, *, encoder: Encoder | None, term_frequency: Mapping[str, int],
                 grammar: GrammarChecker | None = None, grammar_note: str = "no grammar checker given",
                 text_column: str = "explanation", reviews_column: str = "item_reviews",
                 features_column: str | None = "features", repetition_n: int = 2,
                 factors: Sequence[str] = FACTORS,
                 analyse: Callable[[str], tuple[float, float]] = textblob_sentiment,
                 centroid_cache: dict | None = None) -> FactorTable:
    """The factors named in `factors` for each row of `frame` (a pandas DataFrame).

    A factor whose input is missing is reported in `unavailable` with the reason and
    left NaN: GC without a grammar checker (`grammar_note` says why there is none), FA
    without a features column, REL without an encoder. Callers train and score without
    those factors, and say so.
    """
    import pandas as pd

    unknown = [f for f in factors if f not in FACTORS]
    if unknown:
        raise ValueError(f"unknown factor {unknown[0]!r}; factors: {', '.join(FACTORS)}")
    texts = [str(t) for t in frame[text_column].tolist()]
    n = len(texts)
    cols: dict[str, np.ndarray] = {}
    unavailable: dict[str, str] = {}
    sentiment = [analyse(t) for t in texts] if {"SUB", "POL"} & set(factors) else []
    for f in factors:
        if f == "REL":
            if encoder is None:
                unavailable[f] = "no sentence encoder given"
            else:
                cols[f] = relevance(texts, frame[reviews_column].tolist(), encoder, centroid_cache)
        elif f == "LEN":
            cols[f] = length(texts)
        elif f == "REA":
            cols[f] = readability(texts)
        elif f == "WI":
            cols[f] = word_importance(texts, term_frequency)
        elif f == "REP":
            cols[f] = repetition(texts, repetition_n)
        elif f == "SUB":
            cols[f] = np.array([s[1] for s in sentiment], dtype=np.float64)
        elif f == "POL":
            cols[f] = np.array([s[0] for s in sentiment], dtype=np.float64)
        elif f == "GC":
            if grammar is None:
                unavailable[f] = grammar_note
            else:
                cols[f] = grammar_correctness(texts, grammar)
        elif f == "FA":
            if not features_column or features_column not in frame.columns:
                unavailable[f] = f"no features column{f' {features_column!r}' if features_column else ''} in the input"
            else:
                cols[f] = feature_appearance(texts, frame[features_column].tolist())
    values = pd.DataFrame({f: cols.get(f, np.full(n, np.nan)) for f in factors}, index=frame.index)
    return FactorTable(values=values, unavailable=unavailable)


def _unit_rows(matrix) -> np.ndarray:
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim == 1:
        m = m[None]
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
