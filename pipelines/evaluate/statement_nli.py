"""Statement-level NLI metrics for many examples with one scoring call.

For each example (generated statements s'_1..s'_n, reference statements s_1..s_m) the
metrics of seed 000 eq. 9-11 need the NLI probabilities of every pair in both
directions: (premise s_l, hypothesis s'_k) for precision and (premise s'_k, hypothesis
s_l) for recall (`metrics.statement_level` explains the reading). This module lays the
pairs of all examples out flat, sends each distinct (premise, hypothesis) once to the
scorer (statements recur across examples, so many pairs repeat), and reduces the
probabilities with segment reductions. The scorer is anything with
`score(premises, hypotheses) -> [N, 3]` (entailment, neutral, contradiction): the
in-process `NLIScorer`, a Serve client (`serve.nli.ServeNLIClient`), or a test double.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rexeval.metrics.statement_level import BatchScores, statement_nli_batch
from rexeval.models.encoders.nli import score_unique


def nli_pairs(gen: Sequence[Sequence[str]], ref: Sequence[Sequence[str]]
              ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], np.ndarray, np.ndarray]:
    """Flat (premise, hypothesis) lists in the layout of `statement_nli_batch`:
    precision pairs of example e in (k, l) order, recall pairs in (l, k) order."""
    if len(gen) != len(ref):
        raise ValueError(f"{len(gen)} generated statement sets but {len(ref)} reference sets")
    prec, rec = [], []
    for g, r in zip(gen, ref):
        prec += [(rl, gk) for gk in g for rl in r]
        rec += [(gk, rl) for rl in r for gk in g]
    n = np.array([len(g) for g in gen], dtype=np.int64)
    m = np.array([len(r) for r in ref], dtype=np.int64)
    return prec, rec, n, m


def score_statement_nli(gen: Sequence[Sequence[str]], ref: Sequence[Sequence[str]], scorer,
                        empty: str = "skip") -> BatchScores:
    """StEnt / StEnt-bin / StCoh P, R (and F1) per example; counts include the pairs
    sent to the scorer."""
    prec, rec, n, m = nli_pairs(gen, ref)
    probs, unique = score_unique(prec + rec, scorer)
    out = statement_nli_batch(probs[:len(prec)], probs[len(prec):], n, m, empty=empty)
    out.counts.update({"nli_pairs": len(prec) + len(rec), "nli_unique_pairs": unique})
    return out
