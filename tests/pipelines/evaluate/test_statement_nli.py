"""Statement-level NLI over many examples: the pair layout, one call with distinct pairs,
and the seed's central finding as a property of our metric code (a sentiment-flipped
copy of the ground truth loses its entailment scores)."""
from __future__ import annotations

import numpy as np
import pytest

from rexeval.metrics.statement_level import statement_nli_metrics
from rexeval.pipelines.extract.ground_truth import statement_sentence
from rexeval.pipelines.evaluate.statement_nli import nli_pairs, score_statement_nli
from tests.doubles.nli import ScriptedNLI


def test_pair_layout():
    prec, rec, n, m = nli_pairs([["g1", "g2"], []], [["r1", "r2", "r3"], ["r4"]])
    # precision: (k, l) order, premise = reference, hypothesis = generated
    assert prec == [("r1", "g1"), ("r2", "g1"), ("r3", "g1"), ("r1", "g2"), ("r2", "g2"), ("r3", "g2")]
    # recall: (l, k) order, premise = generated, hypothesis = reference
    assert rec == [("g1", "r1"), ("g2", "r1"), ("g1", "r2"), ("g2", "r2"), ("g1", "r3"), ("g2", "r3")]
    assert n.tolist() == [2, 0] and m.tolist() == [3, 1]
    with pytest.raises(ValueError, match="reference sets"):
        nli_pairs([["a"]], [])


def test_batched_scores_equal_per_example_computation_and_pairs_go_once():
    gen = [["the case fits", "it is not cheap"], ["the case fits"], []]
    ref = [["the case fits well", "it is cheap"], ["the case fits well", "it is cheap"], ["x"]]
    scorer = ScriptedNLI()
    out = score_statement_nli(gen, ref, scorer)
    assert scorer.calls == [out.counts["nli_unique_pairs"]]
    assert out.counts["nli_pairs"] == 2 * (4 + 2)
    assert out.counts["nli_unique_pairs"] < out.counts["nli_pairs"]
    for e in range(2):
        pg = np.array([[scorer.score([r], [g])[0] for r in ref[e]] for g in gen[e]])
        pr = np.array([[scorer.score([g], [r])[0] for g in gen[e]] for r in ref[e]])
        want = statement_nli_metrics(pg, pr)
        for name, v in want.items():
            assert out.values[name][e] == pytest.approx(v), (e, name)
    assert np.isnan(out.values["stent_p"][2]) and out.counts["n_skipped"] == 1


def test_flipped_sentiments_lose_entailment():
    truth = [[("the product is loud", "negative"), ("the product is light", "positive")],
             [("the strings are bright", "positive")],
             [("the case cracks easily", "negative"), ("the buttons are firm", "positive")]]
    flip = {"positive": "negative", "negative": "positive"}
    ref = [[statement_sentence(s, p) for s, p in ex] for ex in truth]
    same = score_statement_nli(ref, ref, ScriptedNLI()).values
    flipped = [[statement_sentence(s, flip[p]) for s, p in ex] for ex in truth]
    bad = score_statement_nli(flipped, ref, ScriptedNLI()).values
    assert np.all(same["stent_p"] > 0.85) and np.all(same["stent_r"] > 0.85)
    assert np.all(bad["stent_p"] < 0.25) and np.all(bad["stent_bin_f1"] == 0)
    assert np.all(bad["stcoh_p"] < same["stcoh_p"])
