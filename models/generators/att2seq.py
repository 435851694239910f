"""Att2Seq (Dong et al., EACL 2017): a review generator conditioned on attributes
(user, item, rating) through the decoder's start state and attention."""
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
    gradient clipping train it.

    Here: the attributes are user, item and the example's rating (rounded and clamped to
    1..5), so the model needs the true rating when it writes (`uses_rating`) and predicts
    none; both the hidden and the cell states of each layer come from the attribute
    encoder (the paper speaks of the hidden vectors; we give the cells the same start);
    attention scores are bilinear (attribute . W h); word embeddings have the LSTM's
    hidden size. No learning-rate schedule of the original is reproduced: our trainer
    only decays on a validation plateau, and lr_decay 1.0 leaves that off.
    """

    uses_rating = True
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "rmsprop", "lr": 0.002, "lr_decay": 1.0, "weight_decay": 0.0, "clip": 5.0,
        "batch_size": 50, "vocab_size": 20000, "max_words": 15,
        "dim": 64, "hidden": 512, "layers": 2, "dropout": 0.2,
    }
    SOURCE = ("Dong et al. EACL 2017, experimental setup, as we recall it: attribute embeddings "
              "64, 2-layer LSTM of 512, dropout 0.2, RMSProp lr 0.002 (alpha 0.95, see "
              "build_optimizer), gradient clipping 5, uniform init 0.08. Batch 50 is the "
              "default of PETER's authors' re-implementation (lileipisces/Att2Seq), not checked "
              "against the paper. Our choice: vocabulary 20000 and 15 words (PETER's "
              "setting, so all models see the same targets), no weight decay, no lr decay.")

    def __init__(self, n_users: int, n_items: int, vocab_size: int = 20000, max_words: int = 15,
                 dim: int = 64, hidden: int = 512, layers: int = 2, dropout: float = 0.2):
        super().__init__(n_users, n_items, vocab_size, max_words)
        self.hidden, self.layers = hidden, layers
        self.user_emb = nn.Embedding(n_users, dim)
        self.item_emb = nn.Embedding(n_items, dim)
        self.rating_emb = nn.Embedding(N_RATINGS, dim)
        self.start = nn.Linear(3 * dim, 2 * layers * hidden)
        self.word_emb = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.attend = nn.Linear(hidden, dim, bias=False)
        self.combine = nn.Linear(hidden + dim, hidden)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, vocab_size)
        for p in self.parameters():
            nn.init.uniform_(p, -0.08, 0.08)

    def _encode(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        attrs = torch.stack([self.user_emb(user), self.item_emb(item), self.rating_emb(rating_index(rating))], 1)
        start = torch.tanh(self.start(attrs.flatten(1))).view(-1, 2, self.layers, self.hidden)
        return {"attrs": attrs, "h": start[:, 0], "c": start[:, 1]}

    def _decode(self, words: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Logits [B, T, V] for `words` [B, T] and the state after them."""
        hc = (state["h"].transpose(0, 1).contiguous(), state["c"].transpose(0, 1).contiguous())
        top, (h, c) = self.lstm(self.drop(self.word_emb(words)), hc)  # top: [B, T, H]
        attrs = state["attrs"]  # [B, 3, dim]
        weights = torch.einsum("btd,bkd->btk", self.attend(top), attrs).softmax(-1)
        context = torch.einsum("btk,bkd->btd", weights, attrs)
        mixed = torch.tanh(self.combine(torch.cat([top, context], -1)))
        return self.out(self.drop(mixed)), {"attrs": attrs, "h": h.transpose(0, 1), "c": c.transpose(0, 1)}

    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        logits, _ = self._decode(batch.tokens[:, :-1], self._encode(batch.user, batch.item, batch.rating))
        text = text_nll(logits, batch.tokens[:, 1:])
        return {"loss": text, "text": text}

    def begin(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        return self._encode(user, item, rating)

    def step(self, state: State, prefix: torch.Tensor) -> tuple[torch.Tensor, State]:
        logits, state = self._decode(prefix[:, -1:], state)
        return logits[:, -1].log_softmax(-1), state
