"""Att2Seq (Dong et al., EACL 2017): a review generator conditioned on attributes
(user and item; the rating only when asked) through the decoder's start state and
attention."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from rexeval.models.generators.base import (
    Batch,
    Generator,
    State,
    register_generator,
    text_nll,
)

N_RATINGS = 5
CELL_STARTS = ("encoder", "zeros")


def rating_index(rating: torch.Tensor) -> torch.Tensor:
    """A float rating as a discrete attribute: rounded, clamped to 1..5, as index 0..4."""
    return rating.round().clamp(1, N_RATINGS).long() - 1


@register_generator("att2seq")
class Att2Seq(Generator):
    """Attribute-to-sequence review generation.

    What the original does: each attribute (user, product, rating) is a one-hot vector
    embedded in 64 dimensions; the concatenated embeddings go through a linear map and a
    tanh to give the start state of every layer of a stacked LSTM decoder (2 layers of
    512). At each step the top layer's hidden state attends over the attribute vectors,
    and the attended vector and the hidden state are combined by a tanh layer before the
    softmax over words. Parameters start uniform in [-0.08, 0.08]; RMSProp, dropout and
    gradient clipping train it. The implementation seed 000 ran (PETER's authors' port)
    reads only the user and the item, has no attention (the top LSTM state goes straight
    to the softmax) and starts the cells at zero.

    Here: `rating_input` false (the default, both presets) writes from the user and the
    item only, so nothing of the test example's true rating reaches the output; true
    adds the paper's rating attribute (rounded and clamped to 1..5), which the model then
    needs when it writes: a label a recommender does not have at test time, so
    `system_name` says "att2seq+rating" and its scores are not comparable with models
    that write without it. `attention` true (paper) is the attribute attention (scores
    bilinear: attribute . W h) and the tanh combination; false (seed 000) is the port's
    plain decoder. `cell_start` "encoder" gives the cells the same start as the hidden
    states (the paper speaks of the hidden vectors only), "zeros" is the port's.
    Differences that remain: word embeddings have the LSTM's hidden size (as in the port);
    dropout is only between LSTM layers (as in the port); every parameter starts uniform
    in [-0.08, 0.08] (the port draws the encoder's from [-0.1, 0.1] and leaves the LSTM's
    at torch's default); the paper's learning-rate schedule is not reproduced (our
    trainer only decays on a validation plateau, and lr_decay 1.0 leaves that off).
    """

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "rmsprop", "lr": 0.002, "rmsprop_alpha": 0.95, "lr_decay": 1.0, "weight_decay": 0.0,
        "clip": 5.0, "batch_size": 50, "vocab_size": 20000, "max_words": 15,
        "dim": 64, "hidden": 512, "layers": 2, "dropout": 0.2,
        "rating_input": False, "attention": True, "cell_start": "encoder",
    }
    SOURCE = "see models/generators/presets.py (PAPER_SOURCES['att2seq'], SEED000['att2seq'])"

    def __init__(self, n_users: int, n_items: int, vocab_size: int = 20000, max_words: int = 15,
                 dim: int = 64, hidden: int = 512, layers: int = 2, dropout: float = 0.2,
                 rating_input: bool = False, attention: bool = True, cell_start: str = "encoder"):
        super().__init__(n_users, n_items, vocab_size, max_words)
        if cell_start not in CELL_STARTS:
            raise ValueError(f"cell_start must be one of {', '.join(CELL_STARTS)}, got {cell_start!r}")
        self.hidden, self.layers = hidden, layers
        self.uses_rating, self.attention, self.cell_start = bool(rating_input), bool(attention), cell_start
        n_attrs = 3 if self.uses_rating else 2
        self.user_emb = nn.Embedding(n_users, dim)
        self.item_emb = nn.Embedding(n_items, dim)
        self.rating_emb = nn.Embedding(N_RATINGS, dim) if self.uses_rating else None
        starts = 2 if cell_start == "encoder" else 1
        self.start = nn.Linear(n_attrs * dim, starts * layers * hidden)
        self.word_emb = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        if self.attention:
            self.attend = nn.Linear(hidden, dim, bias=False)
            self.combine = nn.Linear(hidden + dim, hidden)
        self.out = nn.Linear(hidden, vocab_size)
        for p in self.parameters():
            nn.init.uniform_(p, -0.08, 0.08)

    @classmethod
    def system_name(cls, settings: dict[str, Any]) -> str:
        return "att2seq+rating" if settings.get("rating_input") else cls.name

    def _encode(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        parts = [self.user_emb(user), self.item_emb(item)]
        if self.uses_rating:
            parts.append(self.rating_emb(rating_index(rating)))
        attrs = torch.stack(parts, 1)
        start = torch.tanh(self.start(attrs.flatten(1)))
        if self.cell_start == "encoder":
            start = start.view(-1, 2, self.layers, self.hidden)
            h, c = start[:, 0], start[:, 1]
        else:
            h = start.view(-1, self.layers, self.hidden)
            c = torch.zeros_like(h)
        return {"attrs": attrs, "h": h, "c": c}

    def _decode(self, words: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Logits [B, T, V] for `words` [B, T] and the state after them."""
        hc = (state["h"].transpose(0, 1).contiguous(), state["c"].transpose(0, 1).contiguous())
        top, (h, c) = self.lstm(self.word_emb(words), hc)  # top: [B, T, H]
        attrs = state["attrs"]  # [B, n_attrs, dim]
        if self.attention:
            weights = torch.einsum("btd,bkd->btk", self.attend(top), attrs).softmax(-1)
            context = torch.einsum("btk,bkd->btd", weights, attrs)
            top = torch.tanh(self.combine(torch.cat([top, context], -1)))
        return self.out(top), {"attrs": attrs, "h": h.transpose(0, 1), "c": c.transpose(0, 1)}

    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        logits, _ = self._decode(batch.tokens[:, :-1], self._encode(batch.user, batch.item, batch.rating))
        text = text_nll(logits, batch.tokens[:, 1:])
        return {"loss": text, "text": text}

    def begin(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        return self._encode(user, item, rating)

    def step(self, state: State, prefix: torch.Tensor) -> tuple[torch.Tensor, State]:
        logits, state = self._decode(prefix[:, -1:], state)
        return logits[:, -1].log_softmax(-1), state
