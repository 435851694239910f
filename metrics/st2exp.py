"""St2Exp: statement-level support judged by an LLM verifier (seed 000, eq. 6-8).

Pure NumPy over the verifier's votes (`pipelines/evaluate/st2exp.py` asks the LLM); the
empty-set policy and F1 are those of `metrics/statement_level.py`.

St2Exp (LLM verifier votes, eq. 6-8)
------------------------------------
St2Exp-P averages one vote per generated statement, each judged against the whole
reference explanation *text* e; St2Exp-R averages one vote per reference statement,
judged against the generated text e'. A vote is 1 (supported), 0 (not supported),
or None / NaN (the verifier's answer could not be parsed). Policies:

- ``unparseable="zero"`` (default): an unparseable vote counts as 0 (unsupported)
  and stays in the denominator. ``unparseable="skip"``: it is dropped from the
  denominator (and numerator). Either way the number of unparseable votes is
  returned next to the value.
- St2Exp-P only needs the generated votes and St2Exp-R only the reference votes
  (the other side is a text, not a statement set), so ``empty=`` applies to each
  average on its own: a side with nothing to average (no statements, or, under
  ``unparseable="skip"``, only unparseable votes) gives NaN under "skip" and 0
  under "zero". St2Exp-F1 is then NaN (skip) as soon as either side is.

Population (``population=``, the batch over examples only)
----------------------------------------------------------
Which examples the averages over a system take. ``"both"`` (default) is seed 000's: an
example counts only when it has statements on both sides, for all three metrics (the
released evaluation/llm/compute_metrics.py averages over the examples found in both the
precision and the recall votes; eq. 6-7 are undefined for an empty side). An example
with an empty side is then undefined on P, R and F1 alike, and ``empty=`` gives it NaN
(left out of the means) or 0. ``"each"``: St2Exp-P keeps every example with generated
statements and St2Exp-R every example with reference statements, each on its own (what
rexeval did before; F1 is the same under both). The single-example functions above see
one side each, so the population is the batch's.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rexeval.metrics.registry import register_metric
from rexeval.metrics.statement_level import EMPTY_POLICIES, BatchScores, check_policy, empty_value, f1, set_sizes


UNPARSEABLE_POLICIES: tuple[str, ...] = ("zero", "skip")

POPULATIONS: tuple[str, ...] = ("both", "each")
"""Examples St2Exp averages over: with statements on both sides (seed 000), or each side's own."""


ST2EXP_METRICS: tuple[str, ...] = ("st2exp_p", "st2exp_r", "st2exp_f1")



class VoteScore(NamedTuple):
    """An St2Exp value and how many verifier answers could not be parsed."""

    value: float
    n_unparseable: int



def _votes(votes) -> np.ndarray:
    """Votes as float64 with NaN for unparseable; only 0, 1 (bools too), None, NaN."""
    if isinstance(votes, np.ndarray) and votes.dtype.kind in "biuf":
        v = votes.astype(np.float64).reshape(-1)
    else:
        v = np.empty(len(votes), dtype=np.float64)
        for i, x in enumerate(votes):
            if x is None:
                v[i] = np.nan
            elif isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)):
                v[i] = float(x)
            else:
                raise TypeError(f"vote {i} is {x!r}; expected 0, 1, None or NaN")
    _check_votes(v)
    return v



def _check_votes(v: np.ndarray) -> None:
    known = v[~np.isnan(v)]
    if not np.isin(known, (0.0, 1.0)).all():
        raise ValueError(f"votes must be 0, 1 or unparseable (None/NaN), got {np.unique(known)}")



def _vote_average(votes, unparseable: str, empty: str) -> VoteScore:
    check_policy(unparseable, UNPARSEABLE_POLICIES, "unparseable policy")
    v = _votes(votes)
    bad = np.isnan(v)
    n_bad = int(bad.sum())
    denominator = len(v) if unparseable == "zero" else len(v) - n_bad
    if denominator == 0:
        return VoteScore(empty_value(empty), n_bad)
    check_policy(empty, EMPTY_POLICIES, "empty policy")
    return VoteScore(float(v[~bad].sum() / denominator), n_bad)


_VOTES_GEN = ("verifier_votes_gen",)


_VOTES_REF = ("verifier_votes_ref",)



@register_metric("st2exp_p", group="st2exp", inputs=_VOTES_GEN,
                 description="St2Exp-P: share of generated statements an LLM verifier judges "
                             "supported by the reference explanation (eq. 6)")
def st2exp_p(votes_gen, *, unparseable: str = "zero", empty: str = "skip") -> VoteScore:
    """St2Exp-P (eq. 6) = 1/n sum_k f_LLM(s'_k, e) from one vote per generated
    statement. Returns (value, n_unparseable)."""
    return _vote_average(votes_gen, unparseable, empty)



@register_metric("st2exp_r", group="st2exp", inputs=_VOTES_REF,
                 description="St2Exp-R: share of reference statements an LLM verifier judges "
                             "supported by the generated explanation (eq. 7)")
def st2exp_r(votes_ref, *, unparseable: str = "zero", empty: str = "skip") -> VoteScore:
    """St2Exp-R (eq. 7) = 1/m sum_l f_LLM(s_l, e') from one vote per reference
    statement. Returns (value, n_unparseable)."""
    return _vote_average(votes_ref, unparseable, empty)



@register_metric("st2exp_f1", group="st2exp", inputs=_VOTES_GEN + _VOTES_REF,
                 description="St2Exp-F1: harmonic mean of St2Exp-P and St2Exp-R (eq. 8)")
def st2exp_f1(
    votes_gen, votes_ref, *, unparseable: str = "zero", empty: str = "skip"
) -> VoteScore:
    """St2Exp-F1 (eq. 8); n_unparseable counts both sides."""
    p = st2exp_p(votes_gen, unparseable=unparseable, empty=empty)
    r = st2exp_r(votes_ref, unparseable=unparseable, empty=empty)
    return VoteScore(f1(p.value, r.value), p.n_unparseable + r.n_unparseable)



def flatten_votes(votes: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Per-example vote lists -> (flat float64 votes with NaN = unparseable, counts)."""
    parts = [_votes(v) for v in votes]
    counts = np.array([len(v) for v in parts], dtype=np.int64)
    return np.concatenate([np.zeros(0), *parts]), counts



def _segment_vote_average(
    v: np.ndarray, counts: np.ndarray, unparseable: str, empty: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value [B], unparseable per example [B], no-denominator mask [B])."""
    b = len(counts)
    ex = np.repeat(np.arange(b), counts)
    bad = np.isnan(v)
    supported = np.bincount(ex, weights=np.where(bad, 0.0, v), minlength=b)
    n_bad = np.bincount(ex[bad], minlength=b).astype(np.int64)
    denominator = counts if unparseable == "zero" else counts - n_bad
    none = denominator == 0
    value = supported / np.where(none, 1, denominator)
    value[none] = empty_value(empty)
    return value, n_bad, none



def st2exp_batch(
    votes_gen, n_gen, votes_ref, n_ref, *, unparseable: str = "zero", empty: str = "skip",
    population: str = "both",
) -> BatchScores:
    """St2Exp-P/R/F1 for B examples from flat votes (1, 0, NaN = unparseable).

    votes_gen holds example e's generated-statement votes at
    [cumsum(n_gen)[e] - n_gen[e], cumsum(n_gen)[e]), in statement order; votes_ref
    likewise with n_ref. Sums are segment reductions (bincount), no loop per example.

    counts: n_examples; n_empty_gen / n_empty_ref (no statements on that side);
    n_unparseable_gen / n_unparseable_ref (votes); n_undefined_p / n_undefined_r
    (examples with nothing to average on that side: empty, or all votes unparseable
    under unparseable="skip"; NaN under empty="skip", 0 under "zero"); n_skipped
    (examples whose St2Exp-F1 is NaN by the empty policy; 0 under "zero");
    n_one_side_empty (examples with statements on one side only: under
    population="both" their P and R are undefined too, see the module docstring).
    """
    check_policy(unparseable, UNPARSEABLE_POLICIES, "unparseable policy")
    check_policy(empty, EMPTY_POLICIES, "empty policy")
    check_policy(population, POPULATIONS, "St2Exp population")
    n, m = set_sizes(n_gen, n_ref)
    sides = []
    for name, votes, cnt in (("votes_gen", votes_gen, n), ("votes_ref", votes_ref, m)):
        v = np.asarray(votes, dtype=np.float64).reshape(-1)
        if len(v) != int(cnt.sum()):
            raise ValueError(f"{name} has {len(v)} votes, counts sum to {int(cnt.sum())}")
        _check_votes(v)
        sides.append(_segment_vote_average(v, cnt, unparseable, empty))
    (p, bad_g, none_p), (r, bad_r, none_r) = sides
    one_side = (n == 0) != (m == 0)
    if population == "both":
        none_p, none_r = none_p | one_side, none_r | one_side
        p[one_side] = r[one_side] = empty_value(empty)
    counts = {
        "n_examples": int(len(n)),
        "n_empty_gen": int((n == 0).sum()),
        "n_empty_ref": int((m == 0).sum()),
        "n_unparseable_gen": int(bad_g.sum()),
        "n_unparseable_ref": int(bad_r.sum()),
        "n_undefined_p": int(none_p.sum()),
        "n_undefined_r": int(none_r.sum()),
        "n_skipped": int((none_p | none_r).sum()) if empty == "skip" else 0,
        "n_one_side_empty": int(one_side.sum()),
    }
    values = {"st2exp_p": p, "st2exp_r": r, "st2exp_f1": f1(p, r)}
    return BatchScores(values, counts)
