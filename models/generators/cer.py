"""CER (Raczyński, Lango & Stefanowski, ECAI 2023): PETER trained so that the rating its
explanation implies agrees with the rating."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from rexeval.models.generators.base import PAD, Batch, register_generator
from rexeval.models.generators.peter import N_CONTEXT, PETER


@register_generator("cer")
class CER(PETER):
    """Coherent Explainable Recommender: PETER plus a rating-explanation coherence term.

    What the original does: it keeps PETER's architecture and objectives and adds a
    second rating read off the explanation part of the transformer's output, trained to
    agree with the recommender's rating, so that what the text says (positive or
    negative) fits the predicted rating.

    Our reading (written from the paper's description, not the authors' code): the
    explanation's representation is the mean of the hidden states at the positions
    that predict the target's words and EOS (the ones reading BOS, w1 .. wn; PAD
    positions excluded); PETER's own rating MLP maps it to an "explanation rating"; the
    extra loss term is coherence_reg * MSE(explanation rating, true rating), reported as
    `coherence`. Where the authors' code may differ: the first author's public fork of
    PETER (JMRaczynski/PETER, its "additional recommender" option, which we take to be
    CER's code) uses a separate MLP for the explanation rating, max-pools the
    hidden states over all word positions (PAD ones included), fits the explanation
    rating to the recommender's predicted rating rather than to the true one, and adds
    the term inside the rating loss (so it is weighted by rating_reg). Everything else,
    decoding and hyperparameters included, is PETER's.
    """

    DEFAULTS: ClassVar[dict[str, Any]] = {**PETER.DEFAULTS, "coherence_reg": 1.0}
    SOURCE = (PETER.SOURCE + " CER (Raczynski et al. ECAI 2023) trains with PETER's settings; "
              "coherence_reg 1.0 is our choice (the authors' code weights the term with "
              "rating_reg instead).")

    def __init__(self, n_users: int, n_items: int, vocab_size: int = 20000, max_words: int = 15,
                 emsize: int = 512, nhead: int = 2, nhid: int = 2048, nlayers: int = 2,
                 dropout: float = 0.2, rating_reg: float = 0.1, context_reg: float = 1.0,
                 text_reg: float = 1.0, coherence_reg: float = 1.0):
        super().__init__(n_users, n_items, vocab_size, max_words, emsize=emsize, nhead=nhead, nhid=nhid,
                         nlayers=nlayers, dropout=dropout, rating_reg=rating_reg,
                         context_reg=context_reg, text_reg=text_reg)
        self.coherence_reg = coherence_reg

    def explanation_rating(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The rating MLP on the mean hidden state of the explanation's positions ([B])."""
        keep = (tokens[:, 1:] != PAD).to(hidden.dtype)[..., None]  # [B, T, 1]
        mean = (hidden[:, N_CONTEXT:] * keep).sum(1) / keep.sum(1).clamp(min=1)
        return self.rate(mean)

    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        out, hidden = self.forward_losses(batch)
        coherence = nn.functional.mse_loss(self.explanation_rating(hidden, batch.tokens), batch.rating)
        return {**out, "loss": out["loss"] + self.coherence_reg * coherence, "coherence": coherence}
