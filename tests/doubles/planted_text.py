"""A planted explanation data set: every (user, item) pair has a short text that is a
fixed function of the pair, so a generator that really reads the user and the item can
write the text of a pair it never saw, and one that ignores either cannot.

The text names the user through two words (an adjective from u % 4, a verb from
(u // 4) % 3) and the item through two more (a noun from i % 4, an adverb from
(i // 4) % 3), so with 12 users and 12 items every pair has its own sentence and each
word is learnable from the pair's other rows. The rating, 1 + u % 3 + i % 3 (1..5), is
additive too. About 20% of the pairs are held out, every user and item keeping rows in
training. Also here: batches, a small training loop and the unigram baseline that the
generator tests share.
"""
from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np
import torch

from rexeval.models.generators.base import EOS, PAD, Batch, generator_class
from rexeval.models.generators.vocab import Vocabulary
from tests.doubles.seeds import SEED

ADJ = ("warm", "bright", "heavy", "cheap")
VERB = ("sings", "rattles", "hums")
NOUN = ("guitar", "pedal", "strap", "cable")
ADV = ("loudly", "softly", "sweetly")
HELD_OUT_SHARE = 0.2


def planted_text(u: int, i: int) -> str:
    return f"the {ADJ[u % 4]} {NOUN[i % 4]} {VERB[(u // 4) % 3]} {ADV[(i // 4) % 3]}."


def planted_rating(u: int, i: int) -> float:
    return float(1 + u % 3 + i % 3)


def planted_rows(n_users: int = 12, n_items: int = 12, seed: int = 0) -> list[dict]:
    """Every (user, item) pair: {"user", "item", "rating", "text", "held_out"}."""
    pairs = [(u, i) for u in range(n_users) for i in range(n_items)]
    order = np.random.default_rng(seed).permutation(len(pairs))
    n_out = round(HELD_OUT_SHARE * len(pairs))
    left_u, left_i = Counter(u for u, _ in pairs), Counter(i for _, i in pairs)
    held: set[tuple[int, int]] = set()
    for k in order:
        u, i = pairs[k]
        if len(held) < n_out and left_u[u] > 1 and left_i[i] > 1:
            held.add((u, i))
            left_u[u] -= 1
            left_i[i] -= 1
    return [{"user": u, "item": i, "rating": planted_rating(u, i), "text": planted_text(u, i),
             "held_out": (u, i) in held} for u, i in pairs]


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    return [r for r in rows if not r["held_out"]], [r for r in rows if r["held_out"]]


def make_batch(rows: list[dict], vocab: Vocabulary, max_words: int) -> Batch:
    seqs = [vocab.encode(r["text"], max_words) for r in rows]
    width = max(len(s) for s in seqs)
    tokens = torch.full((len(rows), width), PAD, dtype=torch.long)
    for k, s in enumerate(seqs):
        tokens[k, :len(s)] = torch.tensor(s)
    return Batch(torch.tensor([r["user"] for r in rows]), torch.tensor([r["item"] for r in rows]),
                 torch.tensor([r["rating"] for r in rows], dtype=torch.float32), tokens)


def unigram_perplexity(train: Batch, valid: Batch) -> float:
    """Perplexity of `valid`'s words and EOS under the training words' frequencies."""
    counts = Counter(t for t in train.tokens[:, 1:].flatten().tolist() if t != PAD)
    total = sum(counts.values())
    words = [t for t in valid.tokens[:, 1:].flatten().tolist() if t != PAD]
    return math.exp(-sum(math.log(max(counts[t], 1) / total) for t in words) / len(words))


def train(model: torch.nn.Module, batch: Batch, steps: int, lr: float, seed: int = 0) -> list[float]:
    """Full-batch Adam steps; the loss before each step."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    history = []
    for _ in range(steps):
        loss = model.losses(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        history.append(loss.item())
    model.eval()
    return history


MAX_WORDS = 10
SMALL = {  # sizes and training budgets for the planted tests (a few seconds on a CPU)
    "nrt": ({"dim": 32, "hidden": 64, "rating_layers": 1, "dropout": 0.0}, 200, 1e-2),
    "att2seq": ({"dim": 16, "hidden": 64, "layers": 2, "dropout": 0.0}, 200, 1e-2),
    "peter": ({"emsize": 64, "nhead": 2, "nhid": 128, "nlayers": 2, "dropout": 0.0}, 200, 3e-3),
    "cer": ({"emsize": 64, "nhead": 2, "nhid": 128, "nlayers": 2, "dropout": 0.0}, 200, 3e-3),
}


@functools.cache
def trained_planted(name: str, seed: int = SEED):
    """(model, vocab, train batch, held-out batch, held-out rows): a small `name`
    generator trained on the planted pairs (cached: tests share one per session); the
    seed draws the held-out pairs, the weights and the batches' order."""
    rows = planted_rows(seed=seed)
    train_rows, held = split(rows)
    vocab = Vocabulary.build([r["text"] for r in train_rows], size=100)
    kwargs, steps, lr = SMALL[name]
    torch.manual_seed(seed)
    model = generator_class(name)(12, 12, len(vocab), MAX_WORDS, **kwargs)
    batch = make_batch(train_rows, vocab, MAX_WORDS)
    train(model, batch, steps, lr, seed)
    return model, vocab, batch, make_batch(held, vocab, MAX_WORDS), held


def words_of(vocab: Vocabulary, text: str) -> list[int]:
    """The word ids a decoder should write for `text` (no BOS/EOS)."""
    return [t for t in vocab.encode(text, MAX_WORDS)[1:] if t != EOS]
