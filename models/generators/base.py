"""What every trained explanation generator is, the registry that builds one by name,
and the decoding both search strategies share.

A generator is a `torch.nn.Module` conditioned on a user and an item (Att2Seq's
rating-conditioned variant also on the true rating) that writes a word sequence, and
maybe predicts a rating:

- `losses(batch)` returns the training objective (`loss`, what is back-propagated) and
  its parts (`text`: mean next-word negative log-likelihood over the target's tokens,
  which is log-perplexity; `rating`: mean squared error when the model predicts ratings;
  model-specific terms such as PETER's `context`);
- decoding is `begin(user, item, rating)` once, then `step(state, prefix)` per word;
  `greedy` and `beam` below drive every model the same way, for a whole batch at once
  (every row of a batch has the same prefix length, so no padding enters a forward pass
  and a batch decodes exactly as its rows would one at a time);
- `predict_rating(user, item)` (None for models that do not predict one).

Sequences are word ids `[BOS, w1 .. wn, EOS, PAD ..]` (see `models.generators.vocab`).
A model's `DEFAULTS` hold its original paper's best hyperparameters (the `paper`
preset; `models/generators/presets.py` gives the source of each and the `seed000`
preset); the ones named in `TRAIN_KEYS` are the trainer's (optimizer, learning rate,
clipping, batch size, vocabulary and length; Att2Seq's `rmsprop_alpha` too), the rest
go to the constructor. No Ray here: the trainer is `pipelines/generate/train.py`.
"""
from __future__ import annotations

import abc
import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from rexeval.models.generators import NORMALIZE, SCAN
from rexeval.registry import Registry

PAD, BOS, EOS, UNK = 0, 1, 2, 3
"""Reserved word ids, the same in every vocabulary."""

GENERATORS: Registry[type] = Registry("generator", normalize=NORMALIZE, scan=SCAN)
"""Trained explanation generators by name; the modules of this folder that use
`@register_generator` load on first look-up (a new generator is one file here)."""

register_generator = GENERATORS.register
generator_class = GENERATORS.lookup

TRAIN_KEYS = ("optimizer", "lr", "lr_decay", "weight_decay", "clip", "batch_size", "vocab_size", "max_words")
"""Hyperparameters the trainer uses (every model's DEFAULTS has them); the others are
the model constructor's."""

State = dict[str, torch.Tensor]
"""Decoding state: tensors whose first dimension is the batch (so beams reorder it)."""


@dataclass
class Batch:
    """One training or validation batch, all on the model's device."""

    user: torch.Tensor  # [B] int64
    item: torch.Tensor  # [B] int64
    rating: torch.Tensor  # [B] float32
    tokens: torch.Tensor  # [B, T] int64: BOS w1..wn EOS PAD..

    def to(self, device: str | torch.device) -> Batch:
        return Batch(*(t.to(device) for t in (self.user, self.item, self.rating, self.tokens)))

    def __len__(self) -> int:
        return len(self.user)


def text_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the non-PAD `targets` ([B, T]) under `logits` ([B, T, V])."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                       ignore_index=PAD)


class Generator(nn.Module, abc.ABC):
    """The interface of a trained explanation generator (see the module docstring)."""

    name: ClassVar[str] = "generator"
    predicts_rating: ClassVar[bool] = False
    uses_rating: bool = False  # conditions on the example's true rating (Att2Seq with rating_input)
    DEFAULTS: ClassVar[dict[str, Any]] = {}
    SOURCE: ClassVar[str] = ""
    ROLE: ClassVar[str | None] = None  # profile role of a pretrained backbone (PEPLER, XRec)
    DATA_KEYS: ClassVar[tuple[str, ...]] = ()  # settings the prepared data depends on (not sweepable)
    INPUTS: ClassVar[tuple[str, ...]] = ()  # inputs the pipeline prepares beside the text (XRec: collab, profiles)

    def __init__(self, n_users: int, n_items: int, vocab_size: int, max_words: int):
        super().__init__()
        self.n_users, self.n_items, self.vocab_size, self.max_words = n_users, n_items, vocab_size, max_words

    @classmethod
    def system_name(cls, settings: dict[str, Any]) -> str:
        """The system name of its explanations (a variant that reads a label says so)."""
        return cls.name

    @classmethod
    def model_kwargs(cls, settings: dict[str, Any]) -> dict[str, Any]:
        """The constructor's hyperparameters out of a full settings dict."""
        takes = inspect.signature(cls.__init__).parameters
        return {k: settings[k] for k in cls.DEFAULTS if k not in TRAIN_KEYS and k in settings and k in takes}

    @classmethod
    def build(cls, data, settings: dict[str, Any]) -> Generator:
        """The model for prepared `data` (`pipelines.generate.data.GenData`) and settings;
        a model that needs more of the data than its sizes overrides this."""
        return cls(data.n_users, data.n_items, len(data.vocab), data.max_words, **cls.model_kwargs(settings))

    @classmethod
    def n_phases(cls, settings: dict[str, Any]) -> int:
        """Training phases (PEPLER's sequential tuning has two); the trainer moves to the
        next one when validation stops improving."""
        return 1

    def enter_phase(self, phase: int) -> None:
        """Make the parameters of `phase` trainable (the trainer optimises those with
        requires_grad); one phase: all of them."""

    @abc.abstractmethod
    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        """{"loss": objective, "text": mean next-word NLL, ...} for teacher-forced `batch`."""

    @abc.abstractmethod
    def begin(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        """The decoding state before the first word."""

    @abc.abstractmethod
    def step(self, state: State, prefix: torch.Tensor) -> tuple[torch.Tensor, State]:
        """Log-probabilities [B, V] of the next word after `prefix` ([B, t], starting with
        BOS; recurrent models read only its last column) and the updated state."""

    def predict_rating(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor | None:
        """Predicted ratings [B], or None for a model that does not predict them."""
        return None


def _reorder(state: State, index: torch.Tensor) -> State:
    return {k: v.index_select(0, index) for k, v in state.items()}


@torch.no_grad()
def greedy(model: Generator, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor,
           max_words: int) -> list[list[int]]:
    """The most likely next word at every step, for a batch; word ids without BOS/EOS."""
    model.eval()
    b = len(user)
    state = model.begin(user, item, rating)
    prefix = torch.full((b, 1), BOS, dtype=torch.long, device=user.device)
    done = torch.zeros(b, dtype=torch.bool, device=user.device)
    for _ in range(max_words + 1):
        logp, state = model.step(state, prefix)
        word = logp.argmax(-1)
        word = torch.where(done, torch.full_like(word, PAD), word)
        prefix = torch.cat([prefix, word[:, None]], 1)
        done |= word == EOS
        if bool(done.all()):
            break
    return [_words(row)[:max_words] for row in prefix[:, 1:].tolist()]


@torch.no_grad()
def beam(model: Generator, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor,
         max_words: int, beam_size: int = 4, length_norm: bool = True) -> list[list[int]]:
    """Beam search (`beam_size` hypotheses per row, finished ones kept until every beam of
    the row has ended); the best by mean log-probability per word (`length_norm`, so short
    outputs are not favoured) or by total log-probability."""
    model.eval()
    b, k = len(user), beam_size
    dev = user.device
    rep = torch.arange(b, device=dev).repeat_interleave(k)
    state = model.begin(user[rep], item[rep], rating[rep])
    prefix = torch.full((b * k, 1), BOS, dtype=torch.long, device=dev)
    score = torch.full((b, k), -float("inf"), device=dev)
    score[:, 0] = 0.0  # all beams start equal: keep one so the first step does not repeat it k times
    score = score.reshape(-1)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    alive = torch.ones(b * k, dtype=torch.bool, device=dev)
    for t in range(max_words + 1):
        logp, state = model.step(state, prefix)
        if t == max_words:  # last position: only EOS may follow
            forced = torch.full_like(logp, -float("inf"))
            forced[:, EOS] = logp[:, EOS]
            logp = forced
        cand = (score[:, None] + logp).masked_fill(~alive[:, None], -float("inf")).reshape(b, -1)
        top, idx = cand.topk(2 * k, dim=1)  # 2k so k live ones remain after removing the ended
        src = (idx // logp.size(1)) + torch.arange(b, device=dev)[:, None] * k
        word = idx % logp.size(1)
        new_src, new_word, new_score = [], [], []
        for r in range(b):
            keep = []
            for j in range(2 * k):
                s = float(top[r, j])
                if s == -float("inf"):
                    break
                w, sr = int(word[r, j]), int(src[r, j])
                if w == EOS:
                    words = _words(prefix[sr, 1:].tolist())
                    norm = (len(words) + 1) if length_norm else 1
                    finished[r].append((s / norm, words))
                elif len(keep) < k:
                    keep.append((sr, w, s))
                if len(keep) == k:
                    break
            while len(keep) < k:  # fill with dead beams
                keep.append((r * k, PAD, -float("inf")))
            for sr, w, s in keep:
                new_src.append(sr)
                new_word.append(w)
                new_score.append(s)
        index = torch.tensor(new_src, device=dev)
        state = _reorder(state, index)
        prefix = torch.cat([prefix.index_select(0, index), torch.tensor(new_word, device=dev)[:, None]], 1)
        score = torch.tensor(new_score, device=dev)
        alive = torch.isfinite(score)
        best_done = [max((f[0] for f in fin), default=-float("inf")) for fin in finished]
        # A row is done when no live beam can beat its best finished one any more
        # (scores only fall as words are added); stop when every row is done.
        live_best = score.reshape(b, k).max(1).values
        if all(not bool(torch.isfinite(live_best[r])) or (finished[r] and not length_norm
                                                          and best_done[r] >= float(live_best[r]))
               for r in range(b)):
            break
    return [max(fin, key=lambda f: f[0])[1] if fin else [] for fin in finished]


def _words(ids: list[int]) -> list[int]:
    """Word ids up to the first EOS (PAD and BOS dropped)."""
    out = []
    for i in ids:
        if i == EOS:
            break
        if i not in (PAD, BOS):
            out.append(i)
    return out


def build_optimizer(name: str, params, lr: float, weight_decay: float = 0.0,
                    rmsprop_alpha: float = 0.99) -> torch.optim.Optimizer:
    """The optimizer a model's settings name; `rmsprop_alpha` is RMSprop's smoothing
    constant (torch's default 0.99, Att2Seq's paper 0.95)."""
    name = name.lower()
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, weight_decay=weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=rmsprop_alpha, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}: use sgd, adam, adamw, adadelta or rmsprop")
