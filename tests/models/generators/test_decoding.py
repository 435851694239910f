"""Greedy and beam decoding (base.py), on a hand-made generator whose probabilities are
known and on the planted models."""
from __future__ import annotations

import pytest
import torch

from rexeval.models.generators.base import BOS, EOS, PAD, Generator, beam, greedy
from tests.doubles import planted_text as pt

NAMES = ["nrt", "att2seq", "peter", "cer"]
A, B_, C = 4, 5, 6  # word ids of the scripted generator


class Scripted(Generator):
    """Next-word distributions fixed by the prefix. User 0: greedy takes A (0.55) then
    EOS (0.4), mean log-prob per token -0.76, while B (0.45) then EOS (0.95) is better
    (-0.43), also in total (0.43 > 0.22). User 1 first writes C for sure, then the same."""

    def __init__(self):
        super().__init__(2, 1, 8, 5)

    def losses(self, batch):  # pragma: no cover - not trained
        raise NotImplementedError

    def begin(self, user, item, rating):
        return {"user": user}

    def step(self, state, prefix):
        probs = torch.full((len(prefix), self.vocab_size), 1e-6)
        for r, row in enumerate(prefix.tolist()):
            words = [w for w in row if w not in (BOS, PAD)]
            if int(state["user"][r]) == 1:
                words = words[1:] if words and words[0] == C else [-1]
                if words == [-1]:
                    probs[r, C] = 1.0
                    continue
            if not words:
                probs[r, A], probs[r, B_] = 0.55, 0.45
            elif words == [A]:
                probs[r, EOS], probs[r, A], probs[r, B_] = 0.4, 0.3, 0.3
            elif words == [B_]:
                probs[r, EOS], probs[r, C] = 0.95, 0.05
            else:
                probs[r, EOS] = 1.0
        return (probs / probs.sum(-1, keepdim=True)).log(), state


def test_greedy_and_beam_on_known_probabilities():
    model = Scripted()
    user = torch.tensor([0, 1])
    z = torch.zeros(2, dtype=torch.long)
    assert greedy(model, user, z, z.float(), 5) == [[A], [C, A]]
    assert beam(model, user, z, z.float(), 5, beam_size=2) == [[B_], [C, B_]]
    assert beam(model, user, z, z.float(), 5, beam_size=1, length_norm=False) == [[A], [C, A]]
    # without length normalisation the short [A] (0.55 * 0.4 = 0.22) loses to [B] (0.43)
    assert beam(model, user, z, z.float(), 5, beam_size=2, length_norm=False) == [[B_], [C, B_]]


def test_outputs_respect_max_words():
    model = Scripted()
    user, z = torch.tensor([0, 1]), torch.zeros(2, dtype=torch.long)
    assert greedy(model, user, z, z.float(), 1) == [[A], [C]]
    # at the cap only EOS may follow: [B] EOS (mean log-prob -0.43) beats [A] EOS (-0.76)
    assert beam(model, user, z, z.float(), 1, beam_size=3) == [[B_], [C]]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_greedy_batch_equals_one_row_at_a_time(name):
    model, _, _, valid, _ = pt.trained_planted(name)
    together = greedy(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS)
    alone = [greedy(model, valid.user[r:r + 1], valid.item[r:r + 1], valid.rating[r:r + 1], pt.MAX_WORDS)[0]
             for r in range(len(valid))]
    assert together == alone


@pytest.mark.parametrize("name", NAMES)
def test_beam_of_one_equals_greedy(name):
    model, _, _, valid, _ = pt.trained_planted(name)
    want = greedy(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS)
    assert beam(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS, beam_size=1,
                length_norm=False) == want
    assert beam(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS, beam_size=1) == want


@pytest.mark.parametrize("name", NAMES)
def test_beam_batch_equals_one_row_at_a_time_and_writes_planted_text(name):
    model, vocab, _, valid, held = pt.trained_planted(name)
    out = beam(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS, beam_size=3)
    some = range(0, len(valid), 7)
    assert [out[r] for r in some] == [
        beam(model, valid.user[r:r + 1], valid.item[r:r + 1], valid.rating[r:r + 1], pt.MAX_WORDS,
             beam_size=3)[0] for r in some]
    exact = sum(o == pt.words_of(vocab, r["text"]) for o, r in zip(out, held)) / len(held)
    assert exact >= 0.7, exact
    assert all(vocab.decode(o) == r["text"] for o, r in zip(out, held) if o == pt.words_of(vocab, r["text"]))
