"""Diversity and feature metrics for generated explanations (seed 000, II-C): the unique
sentence ratio (USR) and the feature metrics of the NETE/PETER line of work (FMR, FCR,
DIV). Pure functions on strings and sets; texts are tokenised as in
`metrics/text_overlap.py`.

USR: distinct explanations (equal token sequences count once) over all of them.

Feature metrics take feature sets as input (`extract_features` finds them in a text
by exact token match, as NETE/PETER do):
  * FMR: share of explanations that mention a ground-truth feature of their
    interaction (any one, when an interaction has several).
  * FCR: distinct vocabulary features mentioned over all explanations, divided by
    the vocabulary size.
  * DIV: mean over unordered pairs of explanations of |F_i & F_j|; lower is better
    (explanations reuse fewer of the same features).

Registered names: corpus "usr", "fcr", "div" (the only one where lower is better); per
example "fmr" (FMR is a mean of per-interaction 0/1 matches, so it is registered per
example and can enter paired tests; its corpus value is `feature_matching_ratio`).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from rexeval.metrics.registry import register_metric
from rexeval.metrics.text_overlap import Tokenizer, check_pairs, tokenize


@register_metric(
    "usr",
    group="corpus",
    kind="corpus",
    inputs=("generated_explanations",),
    description="unique sentence ratio: distinct generated explanations / all of them",
)
def unique_sentence_ratio(
    explanations: Sequence[str], *, tokenizer: Tokenizer = tokenize
) -> float:
    """Distinct explanations (equal token sequences count once) over the total; NaN if none.

    Two texts that differ only in case or spacing are the same sentence.
    """
    if len(explanations) == 0:
        return float("nan")
    return len({tuple(tokenizer(e)) for e in explanations}) / len(explanations)



def extract_features(
    text: str, features: Iterable[str], *, tokenizer: Tokenizer = tokenize
) -> set[str]:
    """The features (from `features`) whose tokens occur contiguously in `text`.

    Exact token match after `tokenizer`, so "battery" matches "Battery," but not
    "batteries"; multi-word features ("battery life") must appear as a phrase.
    """
    tokens = tokenizer(text)
    grams: dict[int, set[tuple[str, ...]]] = {}
    found = set()
    for feat in features:
        ftoks = tuple(tokenizer(feat))
        if not ftoks:
            continue
        n = len(ftoks)
        if n not in grams:
            grams[n] = {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}
        if ftoks in grams[n]:
            found.add(feat)
    return found



def _feature_set(x: str | Iterable[str] | None) -> set[str]:
    if x is None:
        return set()
    if isinstance(x, str):
        return {x}
    return set(x)


@register_metric(
    "fmr",
    group="overlap",
    inputs=("generated_features", "ground_truth_features"),
    description="feature matching ratio: 1 if the explanation mentions a ground-truth feature",
)
def feature_matches(
    generated_features: Sequence[Iterable[str]],
    ground_truth_features: Sequence[str | Iterable[str] | None],
) -> np.ndarray:
    """Per interaction: 1.0 if its explanation's features include any of its
    ground-truth features, else 0.0; NaN when it has no ground-truth feature.

    The mean of this (`feature_matching_ratio`) is FMR.
    """
    check_pairs(generated_features, ground_truth_features)
    out = np.empty(len(generated_features), dtype=np.float64)
    for i, (gen, gt) in enumerate(zip(generated_features, ground_truth_features)):
        gt = _feature_set(gt)
        out[i] = float(bool(gt & _feature_set(gen))) if gt else math.nan
    return out



def feature_matching_ratio(
    generated_features: Sequence[Iterable[str]],
    ground_truth_features: Sequence[str | Iterable[str] | None],
) -> float:
    """FMR: mean of `feature_matches` over interactions that have a ground-truth
    feature; NaN if none has."""
    m = feature_matches(generated_features, ground_truth_features)
    ok = ~np.isnan(m)
    return float(m[ok].mean()) if ok.any() else float("nan")


@register_metric(
    "fcr",
    group="corpus",
    kind="corpus",
    inputs=("generated_features", "feature_vocabulary"),
    description="feature coverage ratio: distinct features mentioned / all features",
)
def feature_coverage_ratio(
    generated_features: Iterable[Iterable[str]], all_features: Iterable[str]
) -> float:
    """FCR: |union of the explanations' features, within `all_features`| / |all_features|.

    NaN when `all_features` is empty.
    """
    vocab = set(all_features)
    if not vocab:
        return float("nan")
    seen: set[str] = set()
    for gen in generated_features:
        seen |= _feature_set(gen)
    return len(seen & vocab) / len(vocab)


@register_metric(
    "div",
    group="corpus",
    higher_is_better=False,
    kind="corpus",
    inputs=("generated_features",),
    description="feature diversity: mean features shared per pair of explanations; lower is better",
)
def feature_diversity(generated_features: Sequence[Iterable[str]]) -> float:
    """DIV = 2 / (N (N - 1)) * sum over pairs i < j of |F_i & F_j|; NaN when N < 2.

    Computed in one pass: a feature present in c explanations is shared by
    c (c - 1) / 2 pairs, so the pair sum is the sum of those over features.
    """
    n = len(generated_features)
    if n < 2:
        return float("nan")
    counts: Counter = Counter()
    for gen in generated_features:
        counts.update(_feature_set(gen))
    shared = sum(c * (c - 1) // 2 for c in counts.values())
    return shared / (n * (n - 1) / 2)
