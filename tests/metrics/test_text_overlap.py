"""Text-overlap metrics: hand-worked BLEU/ROUGE and METEOR availability."""
from __future__ import annotations

import math
import random
import sys
import types

import numpy as np
import pytest

from rexeval.metrics import text_overlap as T
from rexeval.metrics.registry import get_metric

# ---------------------------------------------------------------------- tokenize


def test_tokenize_lowercases_and_splits_punctuation():
    assert T.tokenize("It's GREAT, isn't it?") == [
        "it", "'", "s", "great", ",", "isn", "'", "t", "it", "?",
    ]
    assert T.tokenize("  ") == []


# -------------------------------------------------------------------------- BLEU


def test_bleu1_clipped_unigram_precision_times_brevity_penalty():
    # hyp "the the the cat" (c = 4), ref "the cat sat on the mat" (r = 6).
    # Hyp counts: the 3, cat 1; ref counts: the 2, cat 1.
    # Clipped matches: min(3, 2) + min(1, 1) = 3 -> p1 = 3 / 4.
    # c <= r -> BP = exp(1 - 6/4) = exp(-0.5).  BLEU-1 = 0.75 * exp(-0.5) = 0.45490
    hyp, ref = "the the the cat", "the cat sat on the mat"
    want = 0.75 * math.exp(-0.5)
    assert T.sentence_bleu(hyp, ref, max_n=1) == pytest.approx(want, abs=1e-12)
    assert T.bleu_1([hyp], [ref]) == pytest.approx(want, abs=1e-12)
    assert T.sentence_bleu_1([hyp], [ref])[0] == pytest.approx(want, abs=1e-12)


def test_corpus_bleu1_pools_counts_before_dividing():
    # Pair A as above: matches 3 / total 4, c 4, r 6.
    # Pair B: hyp "good battery life" (3) vs ref "battery life" (2): matches 2 / 3, c 3, r 2.
    # Pooled: p1 = 5/7, c = 7, r = 8 -> BP = exp(1 - 8/7) = exp(-1/7).
    hyps = ["the the the cat", "good battery life"]
    refs = ["the cat sat on the mat", "battery life"]
    want = 5 / 7 * math.exp(-1 / 7)  # 0.62003
    assert T.bleu_1(hyps, refs) == pytest.approx(want, abs=1e-12)
    # Not the mean of the sentence values (0.45490 and 2/3 with BP = 1 since c > r).
    sent = T.sentence_bleu_1(hyps, refs)
    assert sent == pytest.approx([0.75 * math.exp(-0.5), 2 / 3], abs=1e-12)
    assert sent.mean() != pytest.approx(want)


def test_bleu4_smoothing_method1_and_none():
    # hyp "the screen is very bright" (c = 5), ref "the screen is bright" (r = 4).
    # 1-grams: the screen is bright match, very not         -> 4/5
    # 2-grams: "the screen", "screen is" match of 4          -> 2/4
    # 3-grams: "the screen is" matches of 3                  -> 1/3
    # 4-grams: none of 2                                     -> 0/2
    # c > r -> BP = 1.  No smoothing: BLEU-4 = 0.
    # Method 1: p4 = 0.1 / 2 = 0.05 -> (0.8 * 0.5 * 1/3 * 0.05) ** (1/4) = 0.0066667 ** 0.25
    hyp, ref = "the screen is very bright", "the screen is bright"
    want = (0.8 * 0.5 * (1 / 3) * 0.05) ** 0.25  # 0.28574
    assert T.sentence_bleu(hyp, ref) == pytest.approx(want, abs=1e-12)
    assert T.sentence_bleu_4([hyp], [ref])[0] == pytest.approx(want, abs=1e-12)
    assert T.sentence_bleu(hyp, ref, smoothing="none") == 0.0
    assert T.bleu_4([hyp], [ref]) == 0.0  # corpus default: no smoothing
    assert T.bleu_4([hyp], [ref], smoothing="method1") == pytest.approx(want, abs=1e-12)


def test_bleu_multiple_references_clip_and_closest_length():
    # hyp "the the cat" (c = 3); refs "the cat" (2) and "the the dog sat" (4).
    # Clip at the largest count in any one reference: the -> 2, cat -> 1: 3/3.
    # |2 - 3| = |4 - 3|: the tie goes to the shorter, r = 2 < c -> BP = 1.
    assert T.sentence_bleu("the the cat", ["the cat", "the the dog sat"], max_n=1) == 1.0


def test_bleu_edge_cases():
    assert T.sentence_bleu("", "a b c") == 0.0
    assert T.sentence_bleu("x y", "a b c", smoothing="method1") == 0.0  # no unigram match
    assert T.sentence_bleu("a b c d", "a b c d") == pytest.approx(1.0)
    assert math.isnan(T.bleu_4([], []))
    with pytest.raises(ValueError, match="smoothing"):
        T.sentence_bleu("a", "a", smoothing="method7")
    with pytest.raises(ValueError, match="reference"):
        T.sentence_bleu("a", [])
    with pytest.raises(ValueError, match="2 hypotheses but 1"):
        T.bleu_4(["a", "b"], ["a"])


# ------------------------------------------------------------------------- ROUGE


def test_rouge_on_hand_worked_pair():
    # hyp: the battery is great          (4 tokens, bigrams: the-battery, battery-is, is-great)
    # ref: the battery life is good      (5 tokens, bigrams: the-battery, battery-life,
    #                                               life-is, is-good)
    # ROUGE-1: overlap {the, battery, is} = 3 -> P 3/4, R 3/5, F 2*.75*.6/1.35 = 2/3
    # ROUGE-2: overlap {the-battery} = 1     -> P 1/3, R 1/4, F 2*(1/12)/(7/12) = 2/7
    # ROUGE-L: LCS "the battery is" = 3      -> P 3/4, R 3/5, F 2/3
    hyp, ref = "The battery is great", "the battery life is good"
    assert T.rouge_n(hyp, ref, 1) == pytest.approx((3 / 4, 3 / 5, 2 / 3))
    assert T.rouge_n(hyp, ref, 2) == pytest.approx((1 / 3, 1 / 4, 2 / 7))
    assert T.rouge_l(hyp, ref) == pytest.approx((3 / 4, 3 / 5, 2 / 3))
    got = T.rouge_scores([hyp], [ref])
    assert sorted(got) == sorted(T.rouge_metric_names())
    assert got["rouge-1-f"][0] == pytest.approx(2 / 3)
    assert got["rouge-2-p"][0] == pytest.approx(1 / 3)
    assert got["rouge-2-r"][0] == pytest.approx(1 / 4)
    assert got["rouge-l-r"][0] == pytest.approx(3 / 5)
    assert T.rouge_2_f([hyp], [ref])[0] == pytest.approx(2 / 7)


def test_rouge_l_depends_on_order_rouge1_does_not():
    # hyp "life battery the" vs ref "the battery life": same bag of words -> ROUGE-1 = 1.
    # Bigrams: (life battery), (battery the) vs (the battery), (battery life): none shared.
    # LCS: any single token, e.g. "battery" -> 1 -> P = R = F = 1/3.
    hyp, ref = "life battery the", "the battery life"
    assert T.rouge_1_f([hyp], [ref])[0] == pytest.approx(1.0)
    assert T.rouge_2_f([hyp], [ref])[0] == 0.0
    assert T.rouge_l_f([hyp], [ref])[0] == pytest.approx(1 / 3)
    assert T.rouge_l_p([hyp], [ref])[0] == pytest.approx(1 / 3)


def test_rouge_counts_repeats_with_multiplicity():
    # "good good good" vs "good product good": min(3, 2) = 2 -> P 2/3, R 2/3, F 2/3.
    assert T.rouge_n("good good good", "good product good", 1) == pytest.approx((2 / 3,) * 3)
    assert T.rouge_1_r(["good good good"], ["good product good"])[0] == pytest.approx(2 / 3)


def test_rouge_empty_side_is_zero():
    assert T.rouge_l("", "a b") == (0.0, 0.0, 0.0)
    assert T.rouge_n("a b", "", 1) == (0.0, 0.0, 0.0)
    assert T.rouge_n("a", "a", 2) == (0.0, 0.0, 0.0)  # no bigram on either side
    with pytest.raises(ValueError, match="variant"):
        T.rouge_scores(["a"], ["a"], variants=("x",))


def _lcs_table(a, b):
    """Textbook O(len(a) * len(b)) dynamic programme, as the independent check."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_lcs_hand_example_and_against_dynamic_programme():
    # CLRS 15.4: X = ABCBDAB, Y = BDCABA, an LCS is BCBA (length 4).
    assert T.lcs_length(list("ABCBDAB"), list("BDCABA")) == 4
    assert T.lcs_length([], ["a"]) == 0
    rng = random.Random(7)
    for _ in range(500):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 80))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 80))]
        assert T.lcs_length(a, b) == _lcs_table(a, b)


def test_against_nltk_and_rouge_score_when_installed():
    """Optional cross-check with the reference packages (skipped where not installed)."""
    bleu = pytest.importorskip("nltk.translate.bleu_score")
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    hyp, ref = "the screen is very bright", "the screen is bright"
    smooth = bleu.SmoothingFunction().method1
    want = bleu.sentence_bleu([T.tokenize(ref)], T.tokenize(hyp), smoothing_function=smooth)
    assert T.sentence_bleu(hyp, ref) == pytest.approx(want, abs=1e-12)

    class _Tok:
        def tokenize(self, text):
            return T.tokenize(text)

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=_Tok())
    hyp, ref = "The battery is great", "the battery life is good"
    s = scorer.score(ref, hyp)
    assert T.rouge_l(hyp, ref) == pytest.approx(tuple(s["rougeL"]))
    assert T.rouge_n(hyp, ref, 2) == pytest.approx(tuple(s["rouge2"]))


# ------------------------------------------------------------------------ METEOR


@pytest.fixture
def fresh_probe(monkeypatch):
    """An empty METEOR availability cache for this test only."""
    monkeypatch.setattr(T, "_METEOR_PROBE", {})


_NLTK_MODULES = ("nltk", "nltk.corpus", "nltk.translate", "nltk.translate.meteor_score")


def _fake_nltk(monkeypatch, synsets, meteor_score):
    mods = {name: types.ModuleType(name) for name in _NLTK_MODULES}
    mods["nltk.corpus"].wordnet = types.SimpleNamespace(synsets=synsets)
    mods["nltk.translate.meteor_score"].meteor_score = meteor_score
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


def test_meteor_without_nltk_is_unavailable_not_zero(monkeypatch, fresh_probe):
    for name in _NLTK_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # import of it raises ImportError
    reason = T.meteor_unavailable_reason()
    assert reason is not None and "nltk" in reason
    assert not T.meteor_available()
    with pytest.raises(T.MetricUnavailable, match=r"^unavailable: .*nltk") as err:
        T.meteor_scores(["a b"], ["a b"])
    assert err.value.metric == "meteor" and err.value.reason == reason


def test_meteor_without_wordnet_data_is_unavailable(monkeypatch, fresh_probe):
    def synsets(word):
        raise LookupError("Resource wordnet not found.")

    def never(refs, hyp):
        raise AssertionError("must not be called")

    _fake_nltk(monkeypatch, synsets, never)
    reason = T.meteor_unavailable_reason()
    assert reason is not None and "WordNet" in reason
    with pytest.raises(T.MetricUnavailable, match=r"^unavailable: .*WordNet"):
        T.meteor("good screen", "the screen is good")


def test_meteor_when_available_scores_our_tokens(monkeypatch, fresh_probe):
    seen = []

    def fake_meteor(refs, hyp):
        seen.append((refs, hyp))
        return 0.25

    _fake_nltk(monkeypatch, lambda word: ["synset"], fake_meteor)
    assert T.meteor_unavailable_reason() is None
    got = T.meteor_scores(["Good screen!", "ok"], ["The screen is good.", ["fine", "ok"]])
    assert got.dtype == np.float64 and got.tolist() == [0.25, 0.25]
    assert seen[0] == ([["the", "screen", "is", "good", "."]], ["good", "screen", "!"])
    assert seen[1] == ([["fine"], ["ok"]], ["ok"])


def test_meteor_in_this_environment(fresh_probe):
    """Whatever is installed here: a score for a perfect match, or a clear skip."""
    reason = T.meteor_unavailable_reason()
    if reason is None:
        assert T.meteor("the screen is good", "the screen is good") > 0.9
    else:
        with pytest.raises(T.MetricUnavailable, match="^unavailable: "):
            T.meteor("the screen is good", "the screen is good")


# ---------------------------------------------------------------------- registry


def test_registered_directions_and_kinds():
    corpus_up = ["bleu-1", "bleu-4", "usr", "fcr"]
    per_example_up = [
        "sentence-bleu-1", "sentence-bleu-4", "meteor", "fmr", *T.rouge_metric_names(),
    ]
    for name in corpus_up:
        info = get_metric(name)
        assert (info.kind, info.higher_is_better) == ("corpus", True), name
    for name in per_example_up:
        info = get_metric(name)
        assert (info.kind, info.higher_is_better) == ("per_example", True), name
    div = get_metric("div")
    assert (div.kind, div.higher_is_better) == ("corpus", False)
    assert T.rouge_l_f.metric_info.name == "rouge-l-f"
    assert T.rouge_l_f.__name__ == "rouge_l_f"
