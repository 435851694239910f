"""Diversity and feature metrics: hand-worked USR, FMR, FCR and DIV."""
from __future__ import annotations

import math
import random

import pytest

from rexeval.metrics import features as F

# --------------------------------------------------------------------------- USR


def test_unique_sentence_ratio():
    # Tokens: (great phone .) twice (case and spacing ignored), (bad battery .),
    # (great phone !) -> 3 distinct of 4 = 0.75.
    texts = ["Great phone.", "great  phone .", "Bad battery.", "Great phone!"]
    assert F.unique_sentence_ratio(texts) == pytest.approx(0.75)
    assert F.unique_sentence_ratio(["a"] * 5) == pytest.approx(0.2)
    assert math.isnan(F.unique_sentence_ratio([]))


# ----------------------------------------------------------------- FMR, FCR, DIV

VOCAB = ["battery", "screen", "price", "camera", "sound"]
EXPLANATIONS = [
    "The battery and the screen are great.",  # {battery, screen}
    "Screen is sharp, but the batteries die.",  # {screen}: "batteries" is not "battery"
    "Battery, screen and price: all good.",  # {battery, screen, price}
]
GROUND_TRUTH = ["battery", "camera", {"price", "sound"}]


def test_extract_features_exact_tokens_and_phrases():
    found = [F.extract_features(e, VOCAB) for e in EXPLANATIONS]
    assert found == [{"battery", "screen"}, {"screen"}, {"battery", "screen", "price"}]
    assert F.extract_features("Long battery life.", ["battery life", "life battery"]) == {
        "battery life"
    }


def test_fmr_fcr_div_on_three_explanations():
    feats = [F.extract_features(e, VOCAB) for e in EXPLANATIONS]
    # FMR: battery in F1 -> 1; camera not in F2 -> 0; price in F3 -> 1.  2/3.
    assert F.feature_matches(feats, GROUND_TRUTH).tolist() == [1.0, 0.0, 1.0]
    assert F.feature_matching_ratio(feats, GROUND_TRUTH) == pytest.approx(2 / 3)
    # FCR: union {battery, screen, price} = 3 of 5 vocabulary features = 0.6.
    assert F.feature_coverage_ratio(feats, VOCAB) == pytest.approx(0.6)
    # DIV: |F1&F2| = |{screen}| = 1, |F1&F3| = |{battery, screen}| = 2,
    #      |F2&F3| = |{screen}| = 1 -> (1 + 2 + 1) / 3 pairs = 4/3.
    assert F.feature_diversity(feats) == pytest.approx(4 / 3)


def test_feature_metrics_edge_cases():
    # No ground truth for an interaction: NaN there, left out of the mean.
    m = F.feature_matches([{"a"}, {"b"}], [None, "b"])
    assert math.isnan(m[0]) and m[1] == 1.0
    assert F.feature_matching_ratio([{"a"}, {"b"}], [None, "b"]) == 1.0
    assert math.isnan(F.feature_matching_ratio([{"a"}], [set()]))
    # Features outside the vocabulary do not count towards coverage.
    assert F.feature_coverage_ratio([{"a", "zzz"}], ["a", "b"]) == 0.5
    assert math.isnan(F.feature_coverage_ratio([{"a"}], []))
    assert math.isnan(F.feature_diversity([{"a"}]))
    assert F.feature_diversity([set(), set()]) == 0.0
    assert F.feature_diversity([{"a"}] * 4) == 1.0  # every pair shares exactly "a"


def test_div_pair_sum_matches_explicit_pairs():
    rng = random.Random(3)
    sets = [set(rng.sample("abcdefgh", rng.randint(0, 5))) for _ in range(30)]
    pairs = [(i, j) for i in range(30) for j in range(i + 1, 30)]
    want = sum(len(sets[i] & sets[j]) for i, j in pairs) / len(pairs)
    assert F.feature_diversity(sets) == pytest.approx(want)
