"""SummaC-ZS and SummaC-Conv (seed 000, section IV-A-2, eq. 4) on our own NLI engine.

The seed reports SummaC through the public `summac` package. That package loads its NLI
models from the hub and no longer runs under transformers 5, so this module recomputes
the same numbers from any NLI scorer with `score(premises, hypotheses) -> [N, 3]`
(columns entailment, neutral, contradiction: `models.encoders.nli.NLIScorer`, the Serve
client, a test double). The tests check equality with the package on one model.

Roles: the checked text (SummaC's "summary") is the GENERATED explanation, the source
(SummaC's "document") is the REFERENCE explanation. Both are split into sentences; every
pair (premise = reference sentence l, hypothesis = generated sentence k) is scored.

What the package computes, and so what this module computes
-----------------------------------------------------------
- SummaC-ZS, zs_score="e-c" (the default the seed uses): per generated sentence k,
  ``max_l E_kl - max_l C_kl`` (the two maxima are taken separately, so this is at most
  ``max_l (E_kl - C_kl)``), then the mean over k. zs_score="e": ``mean_k max_l E_kl``.
  Note: `metrics.statement_level.summac_zs` takes ``max_l (E_kl - C_kl)``, which is
  eq. 4 read literally but not what the package (hence the seed's tables) computes.
- SummaC-Conv: per generated sentence k, a histogram (raw counts) of its row of
  scores over the reference sentences, one histogram per NLI label used (in the order
  E, C, N, whatever the order of the letters in `nli_labels`). The histograms are
  concatenated and mapped to one number by a linear layer (the package calls it a 1-D
  convolution: the kernel spans the whole histogram). The mean of those numbers over
  the first `CONV_ROWS` (10) generated sentences is repeated three times into a 2-way
  linear layer; the score is the softmax probability of class 1 (consistent).
  Bin edges: "percentile" (the fixed edges of the published checkpoint) or "evenN"
  (N equal bins on [0, 1]); each bin is [lo, hi) except the last, [lo, 1], as in
  `np.histogram`. The two layers and their binning are the trained head,
  `models/encoders/summac_head.py` (it holds weights; this module is the maths).
- Only the first `MAX_REF_SENTENCES` (100) reference sentences are used (both variants).

Where we differ from the package, on purpose
--------------------------------------------
- Sentences come from `split` (default `rexeval.models.sentences.split_sentences`,
  Punkt without NLTK data). The package uses NLTK's `sent_tokenize` and then drops
  sentences of 10 characters or fewer; `summac_sentences` applies that same filter to
  our splitter for callers who want it.
- An example with no sentence on either side is NaN (empty="skip") or 0 ("zero"). The
  package instead scores an all-zero 1x1 image (ZS gives 0, Conv some constant).
- A NaN probability makes its example NaN.
- Pairs are scored once per distinct (premise, hypothesis) over the whole batch, in one
  scorer call; the reductions are segment reductions over a flat layout (below), with
  no Python loop per pair or per example.

Flat layout (as `metrics.statement_level`'s "gen_given_ref")
------------------------------------------------------------
Example e has n_e generated and m_e reference sentences; its n_e * m_e rows come in
(k, l) order, row ``pair_offsets(n, m)[e] + k * m_e + l`` = NLI(premise=ref_l,
hypothesis=gen_k). The `*_batch` functions take that layout and apply the caps above
themselves, so they accept uncapped arrays.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rexeval.metrics.registry import register_metric
from rexeval.models.encoders.summac_head import NLI_LABEL_SETS, SummaCConvHead
from rexeval.metrics.statement_level import (
    CON,
    EMPTY_POLICIES,
    ENT,
    NEU,
    ZS_SCORES,
    segment_max_mean,
    pair_index,
)

MAX_REF_SENTENCES = 100
"""Reference (source) sentences used per example; the package's `max_doc_sents`."""
CONV_ROWS = 10
"""Generated sentences SummaC-Conv aggregates (the package's `n_rows`); later ones are
ignored, so they are not even scored."""
MIN_SENTENCE_CHARS = 10
"""`summac_sentences` keeps sentences longer than this, as the package does."""

_LABEL_COLUMNS = (("e", ENT), ("c", CON), ("n", NEU))
"""Histogram blocks come in this order (the package's image channel order)."""

SplitFn = Callable[[str], list[str]]


# ------------------------------------------------------------------ checks, splitting


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {allowed}")


def _fill_empty(out: np.ndarray, ok: np.ndarray, empty: str) -> np.ndarray:
    out[~ok] = np.nan if empty == "skip" else 0.0
    return out


def summac_sentences(text: str | None) -> list[str]:
    """Our Punkt splitter with the package's length filter (sentences of more than 10
    characters), for results closest to the package's own splitting."""
    from rexeval.models.sentences import split_sentences

    return [s for s in split_sentences(text) if len(s) > MIN_SENTENCE_CHARS]


def _splitter(split: SplitFn | None) -> SplitFn:
    if split is not None:
        return split
    from rexeval.models.sentences import split_sentences

    return split_sentences


def sentence_pairs(
    generated: Sequence[str], references: Sequence[str], split: SplitFn | None = None, *,
    max_gen: int | None = None, max_ref: int | None = MAX_REF_SENTENCES,
) -> tuple[list[tuple[str, str]], np.ndarray, np.ndarray]:
    """(premise, hypothesis) pairs of all examples in the flat layout, and the sentence
    counts n (generated) and m (reference) per example after the caps."""
    if isinstance(generated, str) or isinstance(references, str):
        raise TypeError("generated and references must be sequences of texts, not one text")
    if len(generated) != len(references):
        raise ValueError(f"{len(generated)} generated texts but {len(references)} references")
    split = _splitter(split)
    pairs: list[tuple[str, str]] = []
    n, m = [], []
    for gen, ref in zip(generated, references):
        g = list(split(gen))[:max_gen] if gen else []
        r = list(split(ref))[:max_ref] if ref else []
        pairs += [(rl, gk) for gk in g for rl in r]
        n.append(len(g))
        m.append(len(r))
    return pairs, np.array(n, dtype=np.int64), np.array(m, dtype=np.int64)


def _capped(probs, n_gen, n_ref, max_gen: int | None, max_ref: int | None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The flat probabilities restricted to the first max_gen rows and max_ref columns of
    each example (order kept, so the result is again a flat layout), and the new counts."""
    n = np.asarray(n_gen, dtype=np.int64).reshape(-1)
    m = np.asarray(n_ref, dtype=np.int64).reshape(-1)
    ex, k, ell = pair_index(n, m)
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape != (len(ex), 3):
        raise ValueError(f"probs must be [sum(n_gen * n_ref) = {len(ex)}, 3] "
                         f"(entailment, neutral, contradiction), got {p.shape}")
    n_cap = n if max_gen is None else np.minimum(n, max_gen)
    m_cap = m if max_ref is None else np.minimum(m, max_ref)
    if (n_cap == n).all() and (m_cap == m).all():
        return p, n, m
    keep = (k < n_cap[ex]) & (ell < m_cap[ex])
    return p[keep], n_cap, m_cap


# ---------------------------------------------------------------------- SummaC-ZS


def summac_zs_batch(probs, n_gen, n_ref, *, zs_score: str = "e-c", empty: str = "skip"
                    ) -> np.ndarray:
    """SummaC-ZS [B] from flat NLI probabilities [sum n_e m_e, 3] (module docstring)."""
    _check(zs_score, ZS_SCORES, "zs_score")
    _check(empty, EMPTY_POLICIES, "empty policy")
    p, n, m = _capped(probs, n_gen, n_ref, None, MAX_REF_SENTENCES)
    ok = (n > 0) & (m > 0)
    # mean_k max_l of E and of C, separately; the difference of the means is the mean
    # of the per-sentence differences.
    means = segment_max_mean(p[:, [ENT, CON]], n, m, ok)
    out = means[:, 0] - means[:, 1] if zs_score == "e-c" else means[:, 0].copy()
    return _fill_empty(out, ok, empty)


def summac_zs_scores(generated: Sequence[str], references: Sequence[str], scorer, *,
                     zs_score: str = "e-c", empty: str = "skip",
                     split: SplitFn | None = None) -> np.ndarray:
    """SummaC-ZS of each generated explanation against its reference, float64 [B].

    All sentence pairs of the batch go to `scorer` in one call, each distinct pair once.
    """
    from rexeval.models.encoders.nli import score_unique

    _check(zs_score, ZS_SCORES, "zs_score")
    _check(empty, EMPTY_POLICIES, "empty policy")
    pairs, n, m = sentence_pairs(generated, references, split)
    probs, _ = score_unique(pairs, scorer)
    return summac_zs_batch(probs, n, m, zs_score=zs_score, empty=empty)


# --------------------------------------------------------------------- SummaC-Conv


def conv_histograms(probs, n_rows, n_ref, edges, nli_labels: str = "e") -> np.ndarray:
    """Per generated sentence, the concatenated label histograms of its row: [sum n_rows,
    len(labels) * bins] counts, rows of example 0 first. `probs` is the flat layout for
    n_rows generated and n_ref reference sentences per example (no caps applied here)."""
    _check(nli_labels, NLI_LABEL_SETS, "nli_labels")
    edges = np.asarray(edges, dtype=np.float64)
    n = np.asarray(n_rows, dtype=np.int64)
    m = np.asarray(n_ref, dtype=np.int64)
    ex, k, _ = pair_index(n, m)
    cols = [col for letter, col in _LABEL_COLUMNS if letter in nli_labels]
    v = np.asarray(probs, dtype=np.float64)[:, cols]  # [T, L]
    n_bins, n_labels = len(edges) - 1, len(cols)
    # bin i holds [edge_i, edge_i+1); the top edge itself goes to the last bin.
    idx = np.minimum(np.searchsorted(edges, v, side="right") - 1, n_bins - 1)
    inside = (v >= edges[0]) & (v <= edges[-1])
    row_start = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    row = row_start[ex] + k
    flat = (row[:, None] * n_labels + np.arange(n_labels)) * n_bins + idx
    total = int(n.sum())
    counts = np.bincount(flat[inside], minlength=total * n_labels * n_bins)
    return counts.reshape(total, n_labels * n_bins)


def summac_conv_batch(probs, n_gen, n_ref, head: SummaCConvHead, *, empty: str = "skip"
                      ) -> np.ndarray:
    """SummaC-Conv [B] from flat NLI probabilities (module docstring)."""
    _check(empty, EMPTY_POLICIES, "empty policy")
    p, n, m = _capped(probs, n_gen, n_ref, CONV_ROWS, MAX_REF_SENTENCES)
    ok = (n > 0) & (m > 0)
    n_ok = np.where(ok, n, 0)  # examples with m == 0 have no pairs, so no rows either
    out = np.full(len(n), np.nan)
    if ok.any():
        hist = conv_histograms(p, n_ok, m, head.edges, head.nli_labels)
        rows = head.row_scores(hist)
        row_example = np.repeat(np.arange(len(n)), n_ok)
        mean = np.bincount(row_example, weights=rows, minlength=len(n))[ok] / n_ok[ok]
        out[ok] = head.final_scores(mean)
        ex, _, _ = pair_index(n_ok, m)
        bad = np.bincount(ex[np.isnan(p).any(axis=1)], minlength=len(n)) > 0
        out[bad] = np.nan
    return _fill_empty(out, ok, empty)


def summac_conv_scores(generated: Sequence[str], references: Sequence[str], scorer,
                       head: SummaCConvHead, *, empty: str = "skip",
                       split: SplitFn | None = None) -> np.ndarray:
    """SummaC-Conv of each generated explanation against its reference, float64 [B].

    Only the first CONV_ROWS generated sentences are scored (the head ignores the rest);
    one scorer call for the batch, each distinct pair once.
    """
    from rexeval.models.encoders.nli import score_unique

    _check(empty, EMPTY_POLICIES, "empty policy")
    pairs, n, m = sentence_pairs(generated, references, split, max_gen=CONV_ROWS)
    probs, _ = score_unique(pairs, scorer)
    return summac_conv_batch(probs, n, m, head, empty=empty)


@register_metric("summac_conv", group="summac_conv", inputs=("nli_sentence_pairs", "summac_conv_head"),
                 description="SummaC-Conv: a trained head over histograms of each checked "
                             "sentence's NLI scores against the source sentences, averaged "
                             "(seed 000, section IV-A-2)")
def summac_conv(probs, head: SummaCConvHead, *, empty: str = "skip") -> float:
    """SummaC-Conv of one example from NLI probabilities [n, m, 3]: entry [k, l] =
    NLI(premise=reference sentence l, hypothesis=generated sentence k)."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 3 or p.shape[-1] != 3:
        raise ValueError(f"probs must be [n, m, 3], got shape {p.shape}")
    n, m = np.array([p.shape[0]]), np.array([p.shape[1]])
    return float(summac_conv_batch(p.reshape(-1, 3), n, m, head, empty=empty)[0])
