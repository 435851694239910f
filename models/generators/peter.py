"""PETER (Li, Zhang & Chen, ACL 2021): one small transformer that reads the user and
item ids as tokens, rates from the user position, predicts the explanation's words from
the item position and writes the explanation left to right."""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from rexeval.models.generators.base import (
    BOS,
    EOS,
    PAD,
    Batch,
    Generator,
    State,
    register_generator,
    text_nll,
)

N_CONTEXT = 2  # user, item


def peter_mask(n_context: int, n_words: int) -> torch.Tensor:
    """PETER's attention mask over `n_context` id positions then `n_words` word positions
    (True = may NOT attend): left to right, except that position 0 (the user) also sees
    position 1 (the item)."""
    n = n_context + n_words
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    if n > 1:
        mask[0, 1] = False
    return mask


def sinusoid(length: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The transformer's fixed sinusoidal position encodings [length, dim]."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    enc = torch.zeros(length, dim, device=device)
    enc[:, 0::2] = torch.sin(pos * freq)
    enc[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return enc.to(dtype)


@register_generator("peter")
class PETER(Generator):
    """PErsonalized Transformer for Explainable Recommendation.

    What the original does: the input is [user, item, BOS, w1, ...] (optionally with an
    item feature word after the item); ids and words are embedded, scaled by sqrt(d),
    given sinusoidal positions and read by a post-norm transformer encoder whose mask is
    left to right except that the user position also sees the item. Three heads share
    its output: a two-layer MLP (sigmoid in between) rates from the user position; the
    item position predicts, through the word softmax, every word of the explanation
    ("context prediction", a bag of words); the word positions predict the next word.
    Loss = rating_reg * MSE + context_reg * context NLL + text_reg * next-word NLL;
    SGD with lr 1.0, divided by 4 whenever validation loss does not improve. At
    generation it reruns the whole prefix for every new word.

    Here: the feature-word variant is not used; the context targets are the
    explanation's words without PAD, BOS and EOS (the original's also count the EOS of
    explanations shorter than the length cap); a key-padding mask hides PAD keys in
    training (the id positions never are, so no row is fully masked); decoding reruns
    the full prefix at every step, without a cache, like the original.
    """

    predicts_rating = True
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "sgd", "lr": 1.0, "lr_decay": 0.25, "weight_decay": 0.0, "clip": 1.0,
        "batch_size": 128, "vocab_size": 20000, "max_words": 15,
        "emsize": 512, "nhead": 2, "nhid": 2048, "nlayers": 2, "dropout": 0.2,
        "rating_reg": 0.1, "context_reg": 1.0, "text_reg": 1.0,
    }
    SOURCE = "see models/generators/presets.py (PAPER_SOURCES['peter'], SEED000['peter'])"

    def __init__(self, n_users: int, n_items: int, vocab_size: int = 20000, max_words: int = 15,
                 emsize: int = 512, nhead: int = 2, nhid: int = 2048, nlayers: int = 2,
                 dropout: float = 0.2, rating_reg: float = 0.1, context_reg: float = 1.0,
                 text_reg: float = 1.0):
        super().__init__(n_users, n_items, vocab_size, max_words)
        self.emsize = emsize
        self.rating_reg, self.context_reg, self.text_reg = rating_reg, context_reg, text_reg
        self.user_emb = nn.Embedding(n_users, emsize)
        self.item_emb = nn.Embedding(n_items, emsize)
        self.word_emb = nn.Embedding(vocab_size, emsize)
        layer = nn.TransformerEncoderLayer(emsize, nhead, nhid, dropout, batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.drop = nn.Dropout(dropout)
        self.hidden2token = nn.Linear(emsize, vocab_size)
        self.rating_mlp = nn.Sequential(nn.Linear(emsize, emsize), nn.Sigmoid(), nn.Linear(emsize, 1))
        for module in (self.user_emb, self.item_emb, self.word_emb, self.hidden2token, *self.rating_mlp[::2]):
            nn.init.uniform_(module.weight, -0.1, 0.1)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def encode(self, user: torch.Tensor, item: torch.Tensor, words: torch.Tensor,
               pad_mask: bool = False) -> torch.Tensor:
        """Hidden states [B, 2 + T, d] of [user, item, words] (`words` [B, T]); PAD keys
        hidden when `pad_mask`."""
        x = torch.cat([self.user_emb(user)[:, None], self.item_emb(item)[:, None], self.word_emb(words)], 1)
        x = x * math.sqrt(self.emsize) + sinusoid(x.size(1), self.emsize, x.device, x.dtype)
        mask = peter_mask(N_CONTEXT, words.size(1)).to(x.device)
        keys = None
        if pad_mask:
            ids = torch.zeros(len(words), N_CONTEXT, dtype=torch.bool, device=words.device)
            keys = torch.cat([ids, words == PAD], 1)
        return self.encoder(self.drop(x), mask=mask, src_key_padding_mask=keys)

    def rate(self, hidden: torch.Tensor) -> torch.Tensor:
        """The rating MLP on [..., d] vectors: [...]."""
        return self.rating_mlp(hidden).squeeze(-1)

    def forward_losses(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The objective and its parts, and the hidden states they came from."""
        hidden = self.encode(batch.user, batch.item, batch.tokens[:, :-1], pad_mask=True)
        targets = batch.tokens[:, 1:]
        text = text_nll(self.hidden2token(hidden[:, N_CONTEXT:]), targets)
        context_logp = self.hidden2token(hidden[:, 1]).log_softmax(-1)  # [B, V]
        is_word = (targets != PAD) & (targets != BOS) & (targets != EOS)
        picked = context_logp.gather(1, targets) * is_word
        context = -picked.sum() / is_word.sum().clamp(min=1)
        rating = nn.functional.mse_loss(self.rate(hidden[:, 0]), batch.rating)
        loss = self.rating_reg * rating + self.context_reg * context + self.text_reg * text
        return {"loss": loss, "text": text, "context": context, "rating": rating}, hidden

    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self.forward_losses(batch)[0]

    def begin(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        return {"user": user, "item": item}

    def step(self, state: State, prefix: torch.Tensor) -> tuple[torch.Tensor, State]:
        hidden = self.encode(state["user"], state["item"], prefix)
        return self.hidden2token(hidden[:, -1]).log_softmax(-1), state

    def predict_rating(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        # The user position sees only the user and the item, so no words are needed.
        return self.rate(self.encode(user, item, user.new_zeros(len(user), 0))[:, 0])
