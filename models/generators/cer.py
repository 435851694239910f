"""CER (Raczyński, Lango & Stefanowski, ECAI 2023): PETER trained so that the rating its
explanation implies agrees with the rating."""
from __future__ import annotations

import torch
from torch import nn

from rexeval.models.generators.base import PAD, Batch, register_generator
from rexeval.models.generators.peter import N_CONTEXT, PETER


@register_generator("cer")
class CER(PETER):
    """Coherent Explainable Recommender: PETER plus a rating-explanation coherence term.

    What the original does (the authors' code, JMRaczynski/CER, which seed 000 runs as
    its baselines/CER): it keeps PETER's architecture and objectives and adds a second
    rating read off the explanation part of the transformer's output, so that what the
    text says (positive or negative) fits the rating. The user position is rated by a
    recommender MLP; the hidden states of every word position (the ones reading BOS,
    w1 .. wn and the PAD after them) are max-pooled and rated by a second MLP of the same
    shape (sigmoid hidden layer); that "explanation rating" is fitted to the *predicted*
    rating (gradient flowing into both), and the term is added inside the rating loss:
    loss = text_reg * NLL + context_reg * context NLL
           + rating_reg * (MSE(rating, true) + MSE(explanation rating, rating)).

    Here: the same, on our PETER (whose own differences its docstring names), with one
    difference: the original pools every position up to its fixed length (128 words + 2),
    PAD ones included; we pool the explanation's own positions (BOS, w1 .. wn), because
    our batches are only as wide as their longest target and a row's explanation rating
    should not depend on which rows share its batch. The coherence term is reported as
    `coherence` and `rating` stays the MSE against the true rating; the `text_rating`
    selection counts both in the rating part, as the original's validation loss does.
    """

    def __init__(self, n_users: int, n_items: int, vocab_size: int = 20000, max_words: int = 15,
                 emsize: int = 512, nhead: int = 2, nhid: int = 2048, nlayers: int = 2,
                 dropout: float = 0.2, rating_reg: float = 0.1, context_reg: float = 1.0,
                 text_reg: float = 1.0):
        super().__init__(n_users, n_items, vocab_size, max_words, emsize=emsize, nhead=nhead, nhid=nhid,
                         nlayers=nlayers, dropout=dropout, rating_reg=rating_reg,
                         context_reg=context_reg, text_reg=text_reg)
        self.explanation_mlp = nn.Sequential(nn.Linear(emsize, emsize), nn.Sigmoid(), nn.Linear(emsize, 1))
        for module in self.explanation_mlp[::2]:
            nn.init.uniform_(module.weight, -0.1, 0.1)
            nn.init.zeros_(module.bias)

    def explanation_rating(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The explanation MLP on the max over the explanation positions' hidden states
        ([B]; `tokens` [B, T+1] the BOS .. EOS PAD .. rows the hidden states read)."""
        keep = (tokens[:, :-1] != PAD)[..., None]  # the positions reading BOS, w1 .. wn
        words = hidden[:, N_CONTEXT:].masked_fill(~keep, -torch.inf)
        return self.explanation_mlp(words.max(1).values).squeeze(-1)

    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        out, hidden = self.forward_losses(batch)
        coherence = nn.functional.mse_loss(self.explanation_rating(hidden, batch.tokens), self.rate(hidden[:, 0]))
        return {**out, "loss": out["loss"] + self.rating_reg * coherence, "coherence": coherence}
