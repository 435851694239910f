"""Preparing a split for the generators: targets joined by review id, a vocabulary of the
most frequent training words, a fixed length, and an error row for every review without
a target."""
from __future__ import annotations

import numpy as np
import pytest

from rexeval.models.generators.base import BOS, EOS, PAD, UNK
from rexeval.pipelines.generate.data import GenData, default_max_words, prepare
from tests.doubles.planted_split import NO_TRUTH, planted_split
from tests.doubles.planted_text import planted_rows


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_split(tmp_path_factory.mktemp("planted"))


def test_explanation_targets_come_from_the_ground_truth_by_review_id(planted, tmp_path):
    split, truth = planted
    folder = prepare(split, tmp_path, target="explanation", truth=str(truth), vocab_size=1000, max_words=None,
                     progress=lambda m: None)
    data = GenData.load(folder)
    rows = planted_rows()
    assert data.size("train") == sum(not r["held_out"] for r in rows)
    assert data.size("valid") + data.size("test") == sum(r["held_out"] for r in rows)
    ex = data.examples("train").to_pylist()[0]
    u, i = int(ex["user_id"][1:]), int(ex["item_id"][1:])
    planted_text = next(r["text"] for r in rows if (r["user"], r["item"]) == (u, i))
    assert ex["reference"] == planted_text and ex["example_id"] == f"r{u}-{i}"
    # The arrays hold the same example: its ids, BOS + its words + EOS, then padding.
    a = data.arrays["train"]
    assert data.index["users"][a["user"][0]] == ex["user_id"] and data.index["items"][a["item"][0]] == ex["item_id"]
    toks = a["tokens"][0]
    words = [t for t in toks if t != PAD]
    assert words[0] == BOS and words[-1] == EOS and UNK not in words
    assert data.vocab.decode(words) == planted_text
    # The test review without a ground-truth explanation is an error row, not dropped.
    err = data.errors().to_pylist()
    assert [e["row_id"] for e in err] == [NO_TRUTH] and err[0]["error_type"] == "no_target"
    assert "test split" in err[0]["message"]


def test_review_targets_vocabulary_and_length(planted, tmp_path):
    split, _ = planted
    folder = prepare(split, tmp_path, target="review", truth=None, vocab_size=3, max_words=2, progress=lambda m: None)
    data = GenData.load(folder)
    # Noise texts "noise words N and M": the three most frequent words are kept.
    assert data.vocab.words[4:] == ["and", "noise", "words"]
    assert data.max_words == 2 and data.arrays["train"]["tokens"].shape[1] == 4
    assert data.arrays["train"]["tokens"][0].tolist() == [BOS, data.vocab.index["noise"], data.vocab.index["words"], EOS]
    assert data.size("test") == sum(r["held_out"] for r in planted_rows()) // 2 + 1  # the no-truth review has text


def test_default_length_is_a_high_quantile_of_training_lengths():
    texts = ["a " * n for n in range(1, 101)]
    assert default_max_words(texts) == int(np.ceil(np.quantile(np.arange(1, 101), 0.95)))


def test_settings_are_checked(planted, tmp_path):
    split, truth = planted
    with pytest.raises(ValueError, match="--truth"):
        prepare(split, tmp_path, target="explanation", truth=None, vocab_size=10, max_words=5)
    with pytest.raises(FileNotFoundError, match="not a `rexeval ground-truth` output"):
        prepare(split, tmp_path, target="explanation", truth=str(split), vocab_size=10, max_words=5)
    with pytest.raises(FileNotFoundError, match="not a `rexeval split` output"):
        prepare(truth, tmp_path, target="review", truth=None, vocab_size=10, max_words=5)
    prepare(split, tmp_path, target="review", truth=None, vocab_size=10, max_words=5, progress=lambda m: None)
    with pytest.raises(FileExistsError, match="other settings"):
        prepare(split, tmp_path, target="review", truth=None, vocab_size=11, max_words=5)
