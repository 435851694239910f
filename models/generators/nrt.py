"""NRT (Li et al., SIGIR 2017): rating regression and a GRU tips generator sharing user
and item latent factors."""
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

N_RATINGS = 5  # rating levels 1..5, the one-hot the decoder's start state reads
RATING_LEVELS = ("round", "truncate")


@register_generator("nrt")
class NRT(Generator):
    """Neural Rating Regression with abstractive Tips generation.

    What the original does: every user and item has a latent vector; a multi-layer
    perceptron with sigmoid hidden layers maps the concatenated pair to a rating; a GRU
    writes the tip starting from a hidden state computed (tanh of a linear map) from the
    two latent vectors and the model's own rating prediction turned into a one-hot
    "sentiment" vector; a third head regresses the bag of words of the whole review. The
    tasks are trained jointly with AdaDelta and an L2 penalty.

    Here:
    - the review bag-of-words head is left out: our data has one target text per
      example, the explanation, and no separate review to reconstruct (PETER's authors
      re-implement NRT without it too);
    - the rating one-hot comes from the prediction clamped to 1..5 and then rounded to
      the nearest level (`rating_level` "round", our choice for `paper`: the paper does
      not say) or truncated ("truncate", PETER's authors' port and seed 000); it carries
      no gradient, as in the originals;
    - the L2 penalty is the optimizer's weight decay (seed 000 adds l2_reg * sum of
      squared parameters to the loss; its gradient is weight decay 2 * l2_reg, which is
      what the `seed000` preset sets); dropout (none in the originals) is applied to the
      GRU outputs when `dropout` > 0;
    - embeddings and every linear layer's weights start uniform in [-0.1, 0.1], biases
      at zero (the port's); the GRU keeps torch's initialisation;
    - loss = text NLL + rating_reg * MSE.
    """

    predicts_rating = True
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "adadelta", "lr": 1.0, "lr_decay": 1.0, "weight_decay": 1e-4, "clip": 1.0,
        "batch_size": 200, "vocab_size": 20000, "max_words": 20,
        "dim": 300, "hidden": 400, "layers": 1, "rating_layers": 4, "dropout": 0.0, "rating_reg": 1.0,
        "rating_level": "round",
    }
    SOURCE = "see models/generators/presets.py (PAPER_SOURCES['nrt'], SEED000['nrt'])"

    def __init__(self, n_users: int, n_items: int, vocab_size: int = 20000, max_words: int = 20,
                 dim: int = 300, hidden: int = 400, layers: int = 1, rating_layers: int = 4,
                 dropout: float = 0.0, rating_reg: float = 1.0, rating_level: str = "round"):
        super().__init__(n_users, n_items, vocab_size, max_words)
        if rating_level not in RATING_LEVELS:
            raise ValueError(f"rating_level must be one of {', '.join(RATING_LEVELS)}, got {rating_level!r}")
        self.hidden, self.layers, self.rating_reg, self.rating_level = hidden, layers, rating_reg, rating_level
        self.user_emb = nn.Embedding(n_users, dim)
        self.item_emb = nn.Embedding(n_items, dim)
        mlp: list[nn.Module] = [nn.Linear(2 * dim, hidden), nn.Sigmoid()]
        for _ in range(rating_layers):
            mlp += [nn.Linear(hidden, hidden), nn.Sigmoid()]
        self.rating_mlp = nn.Sequential(*mlp, nn.Linear(hidden, 1))
        self.start = nn.Linear(2 * dim + N_RATINGS, layers * hidden)
        self.word_emb = nn.Embedding(vocab_size, dim)
        self.gru = nn.GRU(dim, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, vocab_size)
        for module in (self.user_emb, self.item_emb, self.word_emb, self.start, self.out,
                       *(m for m in self.rating_mlp if isinstance(m, nn.Linear))):
            nn.init.uniform_(module.weight, -0.1, 0.1)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def _encode(self, user: torch.Tensor, item: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predicted ratings [B] and the GRU's start state [B, layers, hidden]."""
        ui = torch.cat([self.user_emb(user), self.item_emb(item)], -1)
        rating = self.rating_mlp(ui).squeeze(-1)
        clamped = rating.detach().clamp(1, N_RATINGS)
        level = (clamped.round() if self.rating_level == "round" else clamped.trunc()).long() - 1
        onehot = nn.functional.one_hot(level, N_RATINGS).to(ui.dtype)
        h0 = torch.tanh(self.start(torch.cat([ui, onehot], -1)))
        return rating, h0.view(-1, self.layers, self.hidden)

    def _decode(self, words: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, T, V] for `words` [B, T] from `hidden` [B, layers, H], and the new hidden."""
        out, h = self.gru(self.drop(self.word_emb(words)), hidden.transpose(0, 1).contiguous())
        return self.out(self.drop(out)), h.transpose(0, 1)

    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        rating, hidden = self._encode(batch.user, batch.item)
        logits, _ = self._decode(batch.tokens[:, :-1], hidden)
        text = text_nll(logits, batch.tokens[:, 1:])
        mse = nn.functional.mse_loss(rating, batch.rating)
        return {"loss": text + self.rating_reg * mse, "text": text, "rating": mse}

    def begin(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        return {"hidden": self._encode(user, item)[1]}

    def step(self, state: State, prefix: torch.Tensor) -> tuple[torch.Tensor, State]:
        logits, hidden = self._decode(prefix[:, -1:], state["hidden"])
        return logits[:, -1].log_softmax(-1), {"hidden": hidden}

    def predict_rating(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        return self._encode(user, item)[0]
