"""Statement-level factual-consistency metrics (seed 000, section IV, eq. 4-11).

Pure NumPy: the NLI probabilities are computed elsewhere (by models, through Ray); this
module only turns them into metric values. St2Exp, the same statements judged by an LLM
verifier instead of NLI, is in `metrics/st2exp.py`.

Notation (seed 000): the generated explanation e' yields statements s'_1..s'_n, the
ground-truth explanation e yields statements s_1..s_m.

Reading of f(statement, text unit)
----------------------------------
Every scoring function f(x, y) in the seed checks whether x is supported by y. We read
it as an NLI call with **the statement x as the hypothesis and the unit y it is
checked against as the premise**. Hence the two per-example NLI arrays:

- ``P_gen_given_ref`` [n, m, 3]: entry [k, l] = NLI(premise=s_l, hypothesis=s'_k),
  "is s'_k supported by s_l?". Used for precision (eq. 9):
  St*-P = 1/n sum_k max_l f(s'_k, s_l).
- ``P_ref_given_gen`` [m, n, 3]: entry [l, k] = NLI(premise=s'_k, hypothesis=s_l),
  "is s_l supported by s'_k?". Used for recall (eq. 10):
  St*-R = 1/m sum_l max_k f(s_l, s'_k).

In both arrays the first axis is the hypothesis (the statement being checked), so
precision and recall are the same max-then-mean (`max_mean`) of a scored array.
The last axis holds probabilities in the order (entailment, neutral, contradiction),
i.e. indices ENT=0, NEU=1, CON=2. Reorder a model's logits/probabilities to this
order before calling (many MNLI heads emit contradiction first).

Scoring functions on one (E, N, C) triple
-----------------------------------------
- ``ent``:     E                                   (StEnt-*)
- ``ent_bin``: 1 if E >= N and E >= C, else 0      (StEnt-bin-*)
  Tie rule: E only has to be *at least* as large as both others, so a tie for the
  maximum that involves E (E == N >= C, E == C >= N, or all three equal) scores 1.
  A NaN in any of the three gives NaN.
- ``coh``:     E - C, in [-1, 1]                    (StCoh-*)
  StCoh has precision and recall only: E - C can be negative, so the harmonic mean
  is not meaningful and the seed defines no StCoh-F1; neither does this module.

F1 (eq. 8, 11) is ``f1(p, r)`` = 2pr / (p + r), 0 when p + r == 0, NaN if either is
NaN.

Empty statement sets (``empty=``)
---------------------------------
An example whose generated set (n = 0) or reference set (m = 0) is empty has no
defined NLI precision or recall (the mean over k, or the max over l, is over an
empty set). Policy:

- ``empty="skip"`` (default): every NLI metric of that example is NaN; the batch
  functions count such examples (``counts["n_skipped"]``) so a report can say how
  many were left out of the averages.
- ``empty="zero"``: P = R = F1 = 0 for that example (StCoh-P/R too, although 0 is
  not the bottom of its [-1, 1] range).

SummaC-ZS and AlignScore (eq. 4, 5)
-----------------------------------
Both aggregate a pair-score matrix X [n, m] (rows: units of the checked text, columns:
units of the source) as 1/n sum_k max_l X_kl, which is `max_mean`, the same function
that gives St*-P and St*-R. ``summac_zs`` with ``zs_score="e"`` is exactly that with
X = E; with the default ``"e-c"`` it follows the summac package the seed used, which
takes the maxima of E and of C separately (max_l E_kl - max_l C_kl per row), so its
values match the seed's tables. ``alignscore`` takes the ALIGNED probabilities directly.

Vectorised layout (``statement_nli_batch``)
-------------------------------------------
Many examples e = 0..B-1 with counts n_gen[e] = n_e and n_ref[e] = m_e. Both flat
arrays have sum_e n_e * m_e rows of 3 probabilities, example blocks in example
order, block e starting at ``pair_offsets(n_gen, n_ref)[e]`` (examples with an empty
side have an empty block):

- ``p_gen_given_ref``: block e is P_gen_given_ref of e, [n_e, m_e, 3], flattened in
  (k, l) order: row offset_e + k * m_e + l = NLI(premise=s_l, hypothesis=s'_k).
- ``p_ref_given_gen``: block e is P_ref_given_gen of e, [m_e, n_e, 3], flattened in
  (l, k) order: row offset_e + l * n_e + k = NLI(premise=s'_k, hypothesis=s_l).

In each layout a block is made of rows of contiguous pairs sharing one hypothesis,
so the max over premises is one ``np.maximum.reduceat`` over all rows of all
examples and the mean is one ``np.add.reduceat`` over those row maxima: no Python
loop per pair or per example. ``pair_index`` gives (example, k, l) for every flat row
of either layout, which is how a caller builds the NLI inputs; ``flatten_nli_pairs``
builds the flat arrays from per-example arrays.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rexeval.metrics.registry import register_metric

ENT, NEU, CON = 0, 1, 2
"""Column indices of entailment, neutral and contradiction in every NLI array."""

EMPTY_POLICIES: tuple[str, ...] = ("skip", "zero")
ZS_SCORES: tuple[str, ...] = ("e-c", "e")
LAYOUTS: tuple[str, ...] = ("gen_given_ref", "ref_given_gen")

NLI_METRICS: tuple[str, ...] = (
    "stent_p", "stent_r", "stent_f1",
    "stent_bin_p", "stent_bin_r", "stent_bin_f1",
    "stcoh_p", "stcoh_r",
)
"""Keys of `statement_nli_metrics` / `statement_nli_batch`, in this order."""


ScoreFn = Callable[[np.ndarray], np.ndarray]


# ------------------------------------------------------------------ checks


def check_policy(value: str, allowed: tuple[str, ...], what: str) -> None:
    """A ValueError naming the policy and the allowed values when `value` is not one."""
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {allowed}")


def empty_value(empty: str) -> float:
    """The value of a metric over an empty set under the `empty` policy (NaN or 0)."""
    check_policy(empty, EMPTY_POLICIES, "empty policy")
    return float("nan") if empty == "skip" else 0.0


def _probs(probs, name: str = "probs") -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim == 0 or p.shape[-1] != 3:
        raise ValueError(
            f"{name} must end with an axis of 3 (entailment, neutral, contradiction), "
            f"got shape {p.shape}"
        )
    return p


def _pair_probs(probs, name: str) -> np.ndarray:
    p = _probs(probs, name)
    if p.ndim != 3:
        raise ValueError(f"{name} must be [hypotheses, premises, 3], got shape {p.shape}")
    return p


def _matched_pair(p_gen_given_ref, p_ref_given_gen) -> tuple[np.ndarray, np.ndarray]:
    """Both per-example arrays, checked to describe the same n and m."""
    pg = _pair_probs(p_gen_given_ref, "P_gen_given_ref")
    pr = _pair_probs(p_ref_given_gen, "P_ref_given_gen")
    if pg.shape[:2] != pr.shape[1::-1]:
        raise ValueError(
            f"P_gen_given_ref is [n, m, 3] and P_ref_given_gen [m, n, 3]; got "
            f"{pg.shape} and {pr.shape}"
        )
    return pg, pr


# ------------------------------------------------------- scoring functions


def score_ent(probs) -> np.ndarray:
    """f_NLI-ent: the entailment probability E, for each triple in `probs` [..., 3]."""
    return _probs(probs)[..., ENT].copy()


def score_ent_bin(probs) -> np.ndarray:
    """f_NLI-ent-bin: 1.0 where E >= N and E >= C (ties with E count as 1), else 0.0;
    NaN where any of the three is NaN."""
    p = _probs(probs)
    e, n, c = p[..., ENT], p[..., NEU], p[..., CON]
    out = ((e >= n) & (e >= c)).astype(np.float64)
    return np.where(np.isnan(e) | np.isnan(n) | np.isnan(c), np.nan, out)


def score_coh(probs) -> np.ndarray:
    """f_NLI-coh: the coherence score E - C, in [-1, 1]."""
    p = _probs(probs)
    return p[..., ENT] - p[..., CON]


SCORE_FUNCTIONS: dict[str, ScoreFn] = {
    "ent": score_ent,
    "ent_bin": score_ent_bin,
    "coh": score_coh,
}


def _resolve_score(score_fn: str | ScoreFn) -> ScoreFn:
    if callable(score_fn):
        return score_fn
    try:
        return SCORE_FUNCTIONS[score_fn]
    except KeyError:
        raise ValueError(
            f"unknown score function {score_fn!r}; expected one of {sorted(SCORE_FUNCTIONS)} "
            "or a callable"
        ) from None


# ------------------------------------------------------- shared aggregation


def max_mean(x, empty: str = "skip") -> float:
    """1/n sum_k max_l x[k, l] of a score matrix x [n, m] (eq. 4, 5, 9, 10).

    The one max-then-mean of this module: St*-P, St*-R, SummaC-ZS and AlignScore all
    come down to it. With n == 0 or m == 0 the value follows `empty` (NaN for "skip",
    0 for "zero"). A NaN score makes its row maximum, hence the result, NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"score matrix must be [n, m], got shape {x.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        return empty_value(empty)
    check_policy(empty, EMPTY_POLICIES, "empty policy")
    return float(x.max(axis=1).mean())


def f1(p, r):
    """Harmonic mean 2pr / (p + r) of scalars or arrays.

    0 where p + r == 0 (so F1 with a zero side is 0, never a division error); NaN
    where p or r is NaN. Scalars in, float out; arrays in, array out.
    """
    p = np.asarray(p, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    total = p + r
    zero = total == 0
    out = np.where(zero, 0.0, 2.0 * p * r / np.where(zero, 1.0, total))
    return float(out) if out.ndim == 0 else out


# -------------------------------------------------- NLI metrics, one example


def statement_precision(
    P_gen_given_ref, score_fn: str | ScoreFn = "ent", empty: str = "skip"
) -> float:
    """St*-P (eq. 9) = 1/n sum_k max_l f(s'_k, s_l) from P_gen_given_ref [n, m, 3]
    (premise s_l, hypothesis s'_k). `score_fn` is a name of SCORE_FUNCTIONS or a
    callable mapping [..., 3] probabilities to [...] scores."""
    p = _pair_probs(P_gen_given_ref, "P_gen_given_ref")
    return max_mean(_resolve_score(score_fn)(p), empty)


def statement_recall(
    P_ref_given_gen, score_fn: str | ScoreFn = "ent", empty: str = "skip"
) -> float:
    """St*-R (eq. 10) = 1/m sum_l max_k f(s_l, s'_k) from P_ref_given_gen [m, n, 3]
    (premise s'_k, hypothesis s_l)."""
    p = _pair_probs(P_ref_given_gen, "P_ref_given_gen")
    return max_mean(_resolve_score(score_fn)(p), empty)


_NLI_INPUTS_P = ("nli_gen_given_ref",)
_NLI_INPUTS_R = ("nli_ref_given_gen",)
_NLI_INPUTS_F1 = ("nli_gen_given_ref", "nli_ref_given_gen")


@register_metric("stent_p", group="statement_nli", inputs=_NLI_INPUTS_P,
                 description="StEnt-P: mean over generated statements of the best entailment "
                             "probability against any reference statement (eq. 9)")
def stent_p(P_gen_given_ref, *, empty: str = "skip") -> float:
    return statement_precision(P_gen_given_ref, score_ent, empty)


@register_metric("stent_r", group="statement_nli", inputs=_NLI_INPUTS_R,
                 description="StEnt-R: mean over reference statements of the best entailment "
                             "probability against any generated statement (eq. 10)")
def stent_r(P_ref_given_gen, *, empty: str = "skip") -> float:
    return statement_recall(P_ref_given_gen, score_ent, empty)


@register_metric("stent_f1", group="statement_nli", inputs=_NLI_INPUTS_F1,
                 description="StEnt-F1: harmonic mean of StEnt-P and StEnt-R (eq. 11)")
def stent_f1(P_gen_given_ref, P_ref_given_gen, *, empty: str = "skip") -> float:
    pg, pr = _matched_pair(P_gen_given_ref, P_ref_given_gen)
    return f1(stent_p(pg, empty=empty), stent_r(pr, empty=empty))


@register_metric("stent_bin_p", group="statement_nli", inputs=_NLI_INPUTS_P,
                 description="StEnt-bin-P: share of generated statements entailed (E is the "
                             "top class, ties allowed) by some reference statement (eq. 9)")
def stent_bin_p(P_gen_given_ref, *, empty: str = "skip") -> float:
    return statement_precision(P_gen_given_ref, score_ent_bin, empty)


@register_metric("stent_bin_r", group="statement_nli", inputs=_NLI_INPUTS_R,
                 description="StEnt-bin-R: share of reference statements entailed (E is the "
                             "top class, ties allowed) by some generated statement (eq. 10)")
def stent_bin_r(P_ref_given_gen, *, empty: str = "skip") -> float:
    return statement_recall(P_ref_given_gen, score_ent_bin, empty)


@register_metric("stent_bin_f1", group="statement_nli", inputs=_NLI_INPUTS_F1,
                 description="StEnt-bin-F1: harmonic mean of StEnt-bin-P and StEnt-bin-R (eq. 11)")
def stent_bin_f1(P_gen_given_ref, P_ref_given_gen, *, empty: str = "skip") -> float:
    pg, pr = _matched_pair(P_gen_given_ref, P_ref_given_gen)
    return f1(stent_bin_p(pg, empty=empty), stent_bin_r(pr, empty=empty))


@register_metric("stcoh_p", group="statement_nli", inputs=_NLI_INPUTS_P,
                 description="StCoh-P: mean over generated statements of the best E - C "
                             "against any reference statement, in [-1, 1] (eq. 9)")
def stcoh_p(P_gen_given_ref, *, empty: str = "skip") -> float:
    return statement_precision(P_gen_given_ref, score_coh, empty)


@register_metric("stcoh_r", group="statement_nli", inputs=_NLI_INPUTS_R,
                 description="StCoh-R: mean over reference statements of the best E - C "
                             "against any generated statement, in [-1, 1] (eq. 10)")
def stcoh_r(P_ref_given_gen, *, empty: str = "skip") -> float:
    return statement_recall(P_ref_given_gen, score_coh, empty)


def statement_nli_metrics(
    P_gen_given_ref, P_ref_given_gen, *, empty: str = "skip"
) -> dict[str, float]:
    """All NLI statement metrics (NLI_METRICS) of one example."""
    pg, pr = _matched_pair(P_gen_given_ref, P_ref_given_gen)
    out: dict[str, float] = {}
    for prefix, score in (("stent", score_ent), ("stent_bin", score_ent_bin), ("stcoh", score_coh)):
        p = statement_precision(pg, score, empty)
        r = statement_recall(pr, score, empty)
        out[f"{prefix}_p"], out[f"{prefix}_r"] = p, r
        if prefix != "stcoh":
            out[f"{prefix}_f1"] = f1(p, r)
    return {name: out[name] for name in NLI_METRICS}


# -------------------------------------------------- SummaC-ZS and AlignScore


@register_metric("summac_zs", group="summac_zs", inputs=("nli_sentence_pairs",),
                 description="SummaC-ZS: mean over checked sentences of the best entailment "
                             "minus the strongest contradiction (or the best entailment) over "
                             "source sentences (eq. 4, as the summac package computes it)")
def summac_zs(probs, *, zs_score: str = "e-c", empty: str = "skip") -> float:
    """SummaC-ZS (eq. 4) from NLI probabilities [n, m, 3]: entry [k, l] =
    NLI(premise=b_l, hypothesis=a_k). zs_score="e-c" (SummaC's default, the seed's
    choice) follows the summac package the seed ran: per checked sentence, the best
    entailment minus the strongest contradiction over source sentences,
    max_l E_kl - max_l C_kl (not max_l of E_kl - C_kl); zs_score="e" is max_l E_kl.
    `metrics.summac` computes the same for many examples and is tested against the
    package."""
    check_policy(zs_score, ZS_SCORES, "zs_score")
    p = _pair_probs(probs, "probs")
    if zs_score == "e":
        return max_mean(score_ent(p), empty)
    e, c = max_mean(p[..., ENT], empty), max_mean(p[..., CON], empty)
    return e - c if np.isfinite(e) and np.isfinite(c) else e if not np.isfinite(e) else c


@register_metric("alignscore", group="alignscore", inputs=("alignment_chunk_pairs",),
                 description="AlignScore: mean over checked chunks of the best ALIGNED "
                             "probability against any source chunk (eq. 5)")
def alignscore(aligned, *, empty: str = "skip") -> float:
    """AlignScore aggregation (eq. 5) of ALIGNED probabilities [n, m], entry [k, l] =
    alignment(a_k, b_l)."""
    return max_mean(aligned, empty)


# -------------------------------------------------- NLI metrics, many examples


@dataclass(frozen=True)
class BatchScores:
    """Per-example values (name -> float64 [B], NaN where skipped) and counts."""

    values: dict[str, np.ndarray]
    counts: dict[str, int]


def set_sizes(n_gen, n_ref) -> tuple[np.ndarray, np.ndarray]:
    """The per-example set sizes as checked int64 vectors of one length."""
    n = np.asarray(n_gen)
    m = np.asarray(n_ref)
    if n.ndim != 1 or m.ndim != 1 or n.shape != m.shape:
        raise ValueError(f"n_gen and n_ref must be 1-D of equal length, got {n.shape}, {m.shape}")
    for name, a in (("n_gen", n), ("n_ref", m)):
        if a.size and (a.dtype.kind not in "iu" or a.min() < 0):
            raise ValueError(f"{name} must hold non-negative integers")
    return n.astype(np.int64), m.astype(np.int64)


def pair_offsets(n_gen, n_ref) -> np.ndarray:
    """[B + 1] start of each example's block in the flat layouts (both share them)."""
    n, m = set_sizes(n_gen, n_ref)
    off = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(n * m, out=off[1:])
    return off


def pair_index(
    n_gen, n_ref, layout: str = "gen_given_ref"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(example, k, l) of every row of a flat layout, as int64 arrays [sum_e n_e m_e].

    k indexes generated statements s'_k and l reference statements s_l, whichever the
    layout: for "gen_given_ref" row i is NLI(premise=s_l, hypothesis=s'_k), for
    "ref_given_gen" it is NLI(premise=s'_k, hypothesis=s_l).
    """
    check_policy(layout, LAYOUTS, "layout")
    n, m = set_sizes(n_gen, n_ref)
    sizes = n * m
    off = pair_offsets(n, m)
    ex = np.repeat(np.arange(len(n), dtype=np.int64), sizes)
    within = np.arange(off[-1], dtype=np.int64) - off[:-1][ex]
    if layout == "gen_given_ref":
        k, ell = np.divmod(within, m[ex])
    else:
        ell, k = np.divmod(within, n[ex])
    return ex, k, ell


def flatten_nli_pairs(
    P_gen_given_ref: Sequence, P_ref_given_gen: Sequence
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-example arrays -> (p_gen_given_ref, p_ref_given_gen, n_gen, n_ref) in the
    flat layout of `statement_nli_batch`. An example with an empty side must still be
    shaped, e.g. [0, m, 3] and [m, 0, 3]."""
    if len(P_gen_given_ref) != len(P_ref_given_gen):
        raise ValueError("need as many P_gen_given_ref as P_ref_given_gen arrays")
    pairs = [_matched_pair(g, r) for g, r in zip(P_gen_given_ref, P_ref_given_gen, strict=True)]
    n = np.array([g.shape[0] for g, _ in pairs], dtype=np.int64)
    m = np.array([g.shape[1] for g, _ in pairs], dtype=np.int64)
    empty = np.zeros((0, 3))
    flat_g = np.concatenate([empty, *(g.reshape(-1, 3) for g, _ in pairs)])
    flat_r = np.concatenate([empty, *(r.reshape(-1, 3) for _, r in pairs)])
    return flat_g, flat_r, n, m


def segment_max_mean(
    scores: np.ndarray, rows: np.ndarray, row_len: np.ndarray, ok: np.ndarray
) -> np.ndarray:
    """`max_mean` of every example at once.

    scores [T, c] is the concatenation over examples of row-major [rows_e, row_len_e]
    blocks (c score columns side by side); examples not `ok` must have empty blocks.
    Returns [B, c], NaN where not ok. Only ok examples (rows_e, row_len_e >= 1) enter
    the reductions, so every reduceat segment is non-empty and its start strictly
    increases, which reduceat needs to reduce segments correctly.
    """
    out = np.full((len(ok), scores.shape[1]), np.nan)
    if not ok.any():
        return out
    r, width = rows[ok], row_len[ok]
    lengths = np.repeat(width, r)
    row_starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=row_starts[1:])
    row_max = np.maximum.reduceat(scores, row_starts, axis=0)
    ex_starts = np.zeros(len(r), dtype=np.int64)
    np.cumsum(r[:-1], out=ex_starts[1:])
    out[ok] = np.add.reduceat(row_max, ex_starts, axis=0) / r[:, None]
    return out


def _flat_probs(p, total: int, name: str) -> np.ndarray:
    p = _probs(p, name)
    if p.ndim != 2 or p.shape[0] != total:
        raise ValueError(f"{name} must be [sum(n_gen * n_ref) = {total}, 3], got {p.shape}")
    return p


def _all_scores(p: np.ndarray) -> np.ndarray:
    """[T, 3] columns ent, ent_bin, coh."""
    return np.stack([score_ent(p), score_ent_bin(p), score_coh(p)], axis=1)


def statement_nli_batch(
    p_gen_given_ref, p_ref_given_gen, n_gen, n_ref, *, empty: str = "skip"
) -> BatchScores:
    """All NLI statement metrics for B examples from the flat layout (module docstring).

    values: NLI_METRICS -> float64 [B]. counts: n_examples; n_empty_gen (n_e == 0);
    n_empty_ref (m_e == 0); n_empty (either); n_skipped (examples left NaN: n_empty
    under empty="skip", 0 under "zero").
    """
    check_policy(empty, EMPTY_POLICIES, "empty policy")
    n, m = set_sizes(n_gen, n_ref)
    total = int((n * m).sum())
    pg = _flat_probs(p_gen_given_ref, total, "p_gen_given_ref")
    pr = _flat_probs(p_ref_given_gen, total, "p_ref_given_gen")
    ok = (n > 0) & (m > 0)
    prec = segment_max_mean(_all_scores(pg), n, m, ok)
    rec = segment_max_mean(_all_scores(pr), m, n, ok)
    if empty == "zero":
        prec[~ok] = 0.0
        rec[~ok] = 0.0
    values: dict[str, np.ndarray] = {}
    for j, prefix in enumerate(("stent", "stent_bin", "stcoh")):
        values[f"{prefix}_p"] = prec[:, j].copy()
        values[f"{prefix}_r"] = rec[:, j].copy()
        if prefix != "stcoh":
            values[f"{prefix}_f1"] = f1(prec[:, j], rec[:, j])
    n_empty = int((~ok).sum())
    counts = {
        "n_examples": int(len(n)),
        "n_empty_gen": int((n == 0).sum()),
        "n_empty_ref": int((m == 0).sum()),
        "n_empty": n_empty,
        "n_skipped": n_empty if empty == "skip" else 0,
    }
    return BatchScores({name: values[name] for name in NLI_METRICS}, counts)
