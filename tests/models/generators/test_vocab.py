"""The generators' word vocabulary: tokenising, selection, encoding, decoding, files."""
from __future__ import annotations

from rexeval.models.generators.base import BOS, EOS, PAD, UNK
from rexeval.models.generators.vocab import SPECIALS, Vocabulary, detokenize, tokenize


def test_tokenize_keeps_case_and_splits_off_punctuation():
    assert tokenize("Great GUITAR, isn't it?!") == ["Great", "GUITAR", ",", "isn't", "it", "?", "!"]
    assert tokenize("The café's strings cost $5 (each).") == [
        "The", "café's", "strings", "cost", "$", "5", "(", "each", ")", "."]


def test_a_cased_reference_round_trips_through_the_vocabulary():
    """What a case-sensitive metric compares: a generation of the vocabulary's words
    reads back with the reference's case ("iPhone" and "Sony" stay as written)."""
    ref = "The Sony headphones pair with my iPhone, and the NFC works."
    vocab = Vocabulary.build([ref, "the sony case"], size=50)
    assert {"Sony", "sony", "iPhone", "NFC"} <= set(vocab.words)
    assert vocab.decode(vocab.encode(ref, 30)) == ref
    assert tokenize("") == [] and tokenize(None) == []


def test_detokenize_puts_punctuation_back():
    assert detokenize(["great", "guitar", ",", "isn't", "it", "?"]) == "great guitar, isn't it?"
    assert detokenize(["costs", "$", "5", "(", "each", ")", "."]) == "costs $5 (each)."


def test_build_keeps_the_most_frequent_words_ties_alphabetical():
    texts = ["b a c", "a b d", "e d"]  # a:2 b:2 d:2 c:1 e:1
    vocab = Vocabulary.build(texts, size=4)
    assert vocab.words == [*SPECIALS, "a", "b", "d", "c"]
    assert (vocab.index["<pad>"], vocab.index["<bos>"], vocab.index["<eos>"], vocab.index["<unk>"]) == (
        PAD, BOS, EOS, UNK)
    assert len(vocab) == 8
    assert Vocabulary.build(reversed(texts), size=4).words == vocab.words  # order-free
    assert len(Vocabulary.build(texts, size=100)) == 4 + 5


def test_encode_marks_unknown_words_and_cuts_to_max_words():
    vocab = Vocabulary.build(["the guitar is great", "the strap is great"], size=3)
    assert vocab.words[len(SPECIALS):] == ["great", "is", "the"]
    g, i, t = (vocab.index[w] for w in ("great", "is", "the"))
    assert vocab.encode("the guitar is great", 10) == [BOS, t, UNK, i, g, EOS]
    assert vocab.encode("The guitar is great", 10) == [BOS, UNK, UNK, i, g, EOS]  # case kept: "The" is unknown
    assert vocab.encode("the guitar is great", 2) == [BOS, t, UNK, EOS]
    assert vocab.encode("", 5) == [BOS, EOS]


def test_decode_round_trip():
    text = "the pedal hums, really loudly!"
    vocab = Vocabulary.build([text], size=50)
    ids = vocab.encode(text, 20)
    assert vocab.decode(ids) == text
    assert vocab.decode([PAD, *ids, PAD, PAD]) == text
    assert vocab.decode(vocab.encode("the pedal   hums ,really loudly !", 20)) == text
    assert vocab.decode(vocab.encode("the cable hums", 20)) == "the <unk> hums"


def test_save_and_load(tmp_path):
    vocab = Vocabulary.build(["naïve café sounds", "café sounds great"], size=10)
    path = tmp_path / "vocab.json"
    vocab.save(path)
    again = Vocabulary.load(path)
    assert again.words == vocab.words and again.index == vocab.index
    assert again.encode("café sounds", 5) == vocab.encode("café sounds", 5)
    assert vocab.decode(vocab.encode("naïve café", 5)) == "naïve café"
