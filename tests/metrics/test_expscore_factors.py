"""ExpScore's nine factors on hand-worked examples (values computed by hand in comments)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rexeval.metrics import expscore_factors as ef


class BagOfWords:
    """A fake sentence encoder: word counts over a fixed vocabulary; records its inputs."""

    vocab = ("guitar", "strings", "sound")

    def __init__(self):
        self.calls: list[list[str]] = []

    def encode(self, texts):
        self.calls.append(list(texts))
        return np.array([[ef.words(t).count(v) for v in self.vocab] for t in texts], dtype=np.float64)


class FakeChecker:
    """Counts the word "teh" as one error each time it appears."""

    def count_errors(self, texts):
        return [ef.words(t).count("teh") for t in texts]


def test_factor_codes_in_the_seed_order():
    assert ef.FACTORS == ("REL", "LEN", "REA", "WI", "REP", "SUB", "POL", "GC", "FA")
    assert set(ef.FACTOR_NAMES) == set(ef.FACTORS)


def test_words_lowercase_keep_inner_apostrophes():
    assert ef.words("It's GREAT, don't-worry! 120 pieces.") == ["it's", "great", "don't", "worry", "120", "pieces"]


def test_relevance_is_mean_cosine_to_the_item_reviews():
    enc = BagOfWords()
    # "guitar strings" -> (1,1,0)/sqrt2; reviews (1,0,0) and (0,0,1): cosines 1/sqrt2 and 0.
    # Second row: "sound" vs the single review "sound sound" -> 1.
    out = ef.relevance(["guitar strings", "sound"], [["guitar", "sound"], ["sound sound"]], enc)
    assert out == pytest.approx([(1 / math.sqrt(2) + 0) / 2, 1.0])


def test_relevance_empty_explanation_is_zero_and_no_reviews_is_nan():
    out = ef.relevance(["", "guitar"], [["guitar"], []], BagOfWords())
    assert out[0] == 0.0 and math.isnan(out[1])


def test_relevance_encodes_each_text_once_and_reuses_item_means():
    enc = BagOfWords()
    cache: dict = {}
    ef.relevance(["guitar", "guitar", "sound"], [["sound", "guitar"]] * 3, enc, cache)
    assert sorted(enc.calls[0]) == ["guitar", "sound"]
    ef.relevance(["strings"], [["sound", "guitar"]], enc, cache)
    assert enc.calls[1] == ["strings"]  # the item's review mean came from the cache


def test_length_counts_words_outside_the_stop_list():
    # the, and, the, are are stop words -> guitar sounds great strings bright = 5
    assert ef.length(["The guitar sounds great and the strings are bright", ""]).tolist() == [5, 0]


@pytest.mark.parametrize("word,expected", [("the", 1), ("make", 1), ("happy", 2), ("guitar", 2),
                                           ("beautiful", 3), ("table", 2), ("strings", 1), ("120", 1)])
def test_syllable_rule(word, expected):
    assert ef.syllables(word) == expected


def test_flesch_reading_ease_by_hand():
    # 6 words, 1 sentence, 6 syllables: 206.835 - 1.015*6 - 84.6*1
    # 7 words, 2 sentences (the second has no full stop), 10 syllables
    # (the 1, guitar 2, is 1, beautiful 3, i 1, love 1, it 1)
    out = ef.readability(["The cat sat on the mat.", "The guitar is beautiful. I love it", "..."])
    assert out[0] == pytest.approx(206.835 - 1.015 * 6 - 84.6)
    assert out[1] == pytest.approx(206.835 - 1.015 * 7 / 2 - 84.6 * 10 / 7)
    assert math.isnan(out[2])


def test_sentence_count_ignores_empty_pieces():
    assert ef.sentence_count("Great!!! Really great... ") == 2
    assert ef.sentence_count("no end punctuation") == 1


def test_word_importance_sums_smoothed_inverse_term_frequency():
    tf = ef.term_frequencies(["good strings good sound", "Good."])
    assert tf == {"good": 3, "strings": 1, "sound": 1}
    # good 1/4 + strings 1/2 + great (unseen) 1/1; repeats count again
    assert ef.word_importance(["Good strings, great", "good good"], tf).tolist() == pytest.approx([1.75, 0.5])


def test_repetition_counts_repeated_bigrams():
    # bigrams: the sound, sound is, is great, great and, and the, the sound, sound is, is great
    text = "the sound is great and the sound is great"
    assert ef.repetition([text, "no repeats here", "word"]).tolist() == [3, 0, 0]
    assert ef.repeated_ngrams(text, n=1) == 4  # the, sound, is, great once more each
    with pytest.raises(ValueError):
        ef.repeated_ngrams(text, n=0)


def test_subjectivity_and_polarity_from_textblob_lexicon():
    # "great" has four senses in TextBlob's lexicon: polarity 1.0, 1.0, 0.4, 0.8 (mean 0.8),
    # subjectivity 1.0, 1.0, 0.2, 0.8 (mean 0.75); "not" multiplies polarity by -0.5.
    texts = ["This is great.", "This is not great.", "It is a guitar."]
    assert ef.polarity(texts).tolist() == pytest.approx([0.8, -0.4, 0.0])
    assert ef.subjectivity(texts).tolist() == pytest.approx([0.75, 0.75, 0.0])


def test_sentiment_takes_any_analyser():
    def fake(t):
        return len(t) / 10, 0.5

    assert ef.polarity(["abcde"], fake).tolist() == [0.5]
    assert ef.subjectivity(["abcde"], fake).tolist() == [0.5]


def test_grammar_correctness_is_one_over_one_plus_errors():
    out = ef.grammar_correctness(["A fine sentence.", "teh strings and teh sound"], FakeChecker())
    assert out.tolist() == [1.0, 1 / 3]


def test_grammar_checker_must_answer_every_text():
    class Short:
        def count_errors(self, texts):
            return [0]

    with pytest.raises(ValueError, match="2 texts"):
        ef.grammar_correctness(["a", "b"], Short())


def test_feature_appearance_counts_distinct_features_as_word_runs():
    texts = ["The sound quality and the strings are great", "Nice strap", "Sound"]
    feats = [["sound quality", "strings", "Strings", "tuner"], ["straps"], None]
    # row 1: "sound quality" and "strings" (duplicate after lowercasing); row 2: no stemming
    assert ef.feature_appearance(texts, feats).tolist() == [2, 0, 0]
    # list cells read back from Parquet arrive as numpy arrays
    assert ef.feature_appearance(texts[:1], [np.array(feats[0], dtype=object)]).tolist() == [2]


def test_factor_table_marks_grammar_and_features_unavailable():
    frame = pd.DataFrame({"explanation": ["guitar strings are great.", "The sound is bad."],
                          "item_reviews": [["guitar"], ["sound"]]})
    table = ef.factor_table(frame, encoder=BagOfWords(), term_frequency={}, grammar=None,
                            grammar_note="LanguageTool is not installed")
    assert list(table.values.columns) == list(ef.FACTORS)
    assert table.unavailable == {"GC": "LanguageTool is not installed",
                                 "FA": "no features column 'features' in the input"}
    assert table.values["GC"].isna().all() and table.values["FA"].isna().all()
    assert table.available == ["REL", "LEN", "REA", "WI", "REP", "SUB", "POL"]
    assert table.values["LEN"].tolist() == [3, 2]
    assert table.values["WI"].tolist() == [4, 4]  # every word unseen: 1 each


def test_factor_table_with_checker_features_and_subset():
    frame = pd.DataFrame({"explanation": ["teh strings ring"], "item_reviews": [["strings"]],
                          "features": [["strings"]]})
    table = ef.factor_table(frame, encoder=None, term_frequency={"strings": 1}, grammar=FakeChecker(),
                            factors=("GC", "FA", "WI", "REL"))
    assert list(table.values.columns) == ["GC", "FA", "WI", "REL"]
    assert table.unavailable == {"REL": "no sentence encoder given"}
    assert table.values.iloc[0, :3].tolist() == [0.5, 1.0, 2.5]
    with pytest.raises(ValueError, match="unknown factor"):
        ef.factor_table(frame, encoder=None, term_frequency={}, factors=("XYZ",))
