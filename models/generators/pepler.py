"""PEPLER (Li, Zhang & Chen, TOIS 2023): a pretrained causal LM that reads the user and
the item as two learned prompt vectors and continues with the explanation."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from rexeval.models.generators.base import Batch, register_generator
from rexeval.models.generators.lm import LMGenerator, Prompt

RATING_HEADS = ("mf", "mlp")


@register_generator("pepler")
class PEPLER(LMGenerator):
    """PErsonalized Prompt Learning for Explainable Recommendation (continuous prompts).

    What the original does: a user vector and an item vector (GPT-2's width, drawn
    uniformly from [-0.1, 0.1]) are put in front of the word embeddings of
    `<bos> explanation <eos>`, and GPT-2 is trained to predict the words (AdamW, lr 1e-3,
    batch 128, 20 tokens, 5 epochs of patience). It offers two ways to bridge the
    vectors and the pretrained LM: *sequential tuning* (main.py: train the prompt vectors
    with the LM frozen until validation stops improving, reload the best, then train
    everything) and *recommendation as regularisation* (reg.py: train everything at once
    with `rating_reg` x MSE of a rating predicted from the two vectors, by their dot
    product (MF, rating_reg 0.01) or an MLP (rating_reg 1; two sigmoid layers of 400)).
    Seed 000 ran the second: everything trained at once with the MLP head and rating_reg
    0.01, batch 32, 128 tokens (the `seed000` preset).

    Here: both are settings of one model. `sequential` (default true, the paper's main
    PEPLER) gives the trainer two phases: phase 1 trains only the prompt vectors (and the
    rating head when there is one) with every LM weight frozen, phase 2 everything;
    `rating_reg` > 0 adds the rating regulariser (`rating_head` mf or mlp) in whichever
    phases run, so `--set sequential=false --set rating_reg=0.01` is reg.py's MF run. The
    backbone is the profile's `generator_lm` role (GPT-2 in `paper`; the packaged
    SmolLM2-135M in `local`, which is not GPT-2). Differences from the original: we use
    the backbone's own start and end tokens instead of adding `<bos>`, `<eos>` and
    `<pad>` to its vocabulary (no embedding resize, so phase 1 really leaves every LM
    weight untouched); the <bos> token itself is given, not predicted; torch's AdamW
    (eps 1e-8) instead of transformers' (eps 1e-6); gradient clipping is off as in the
    original (`clip` 0).
    """

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "adamw", "lr": 1e-3, "lr_decay": 1.0, "weight_decay": 0.0, "clip": 0.0,
        "batch_size": 128, "vocab_size": 0, "max_words": 20,
        "lm": None, "dtype": "auto", "sequential": True, "rating_reg": 0.0, "rating_head": "mf",
        "text_reg": 1.0,
    }
    SOURCE = "see models/generators/presets.py (PAPER_SOURCES['pepler'], SEED000['pepler'])"
    ROLE = "generator_lm"

    def __init__(self, n_users: int, n_items: int, vocab_size: int, max_words: int = 20, lm: str | None = None,
                 dtype: str = "auto", sequential: bool = True, rating_reg: float = 0.0, rating_head: str = "mf",
                 text_reg: float = 1.0):
        super().__init__(n_users, n_items, vocab_size, max_words, lm=lm, dtype=dtype)
        if rating_head not in RATING_HEADS:
            raise ValueError(f"rating_head must be one of {', '.join(RATING_HEADS)}, got {rating_head!r}")
        self.sequential, self.rating_reg, self.text_reg = bool(sequential), float(rating_reg), float(text_reg)
        self.predicts_rating = self.rating_reg > 0
        self.user_emb = nn.Embedding(n_users, self.hidden)
        self.item_emb = nn.Embedding(n_items, self.hidden)
        for emb in (self.user_emb, self.item_emb):
            nn.init.uniform_(emb.weight, -0.1, 0.1)
        self.rating_head = rating_head
        if self.predicts_rating and rating_head == "mlp":
            layers: list[nn.Module] = [nn.Linear(2 * self.hidden, 400), nn.Sigmoid()]
            layers += [nn.Linear(400, 400), nn.Sigmoid()]  # the original's MLP: num_layers=2
            self.mlp = nn.Sequential(*layers, nn.Linear(400, 1))
            for m in self.mlp:
                if isinstance(m, nn.Linear):
                    nn.init.uniform_(m.weight, -0.1, 0.1)
                    nn.init.zeros_(m.bias)

    @classmethod
    def n_phases(cls, settings: dict[str, Any]) -> int:
        return 2 if settings.get("sequential", True) else 1

    def enter_phase(self, phase: int) -> None:
        """Phase 0 of sequential tuning trains the prompt vectors only; otherwise everything."""
        if self.sequential and phase == 0:
            self.freeze_lm()
        else:
            self.unfreeze_lm()

    def prompt(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> Prompt:
        vecs = torch.stack([self.user_emb(user), self.item_emb(item)], 1).to(self.lm_dtype)
        return Prompt(vecs, torch.ones(len(user), 2, dtype=torch.long, device=user.device))

    def _rate(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        u, i = self.user_emb(user), self.item_emb(item)
        if self.rating_head == "mf":
            return (u * i).sum(-1)
        return self.mlp(torch.cat([u, i], -1)).squeeze(-1)

    def combine(self, batch: Batch, text: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {"text": text, "loss": self.text_reg * text}
        if self.predicts_rating:
            out["rating"] = nn.functional.mse_loss(self._rate(batch.user, batch.item), batch.rating)
            out["loss"] = out["loss"] + self.rating_reg * out["rating"]
        return out

    def predict_rating(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor | None:
        return self._rate(user, item) if self.predicts_rating else None
