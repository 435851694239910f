"""ExpScore's learned heads (seed 003, section 3.1): factors in, one quality score out.

Three heads map the normalised factor vector to a score on the rating scale:
- `linear`: one linear layer, mean squared error. Its weights (per z-scored factor) are
  the seed's Table 3.
- `logistic`: multinomial logistic regression over the rating classes (1..5 by default),
  cross-entropy. The class of a label is the label rounded half up (labels may be
  means of several ratings). The score is the *expected class value* sum_k p_k * k,
  not the argmax: it is continuous (fewer ties for Kendall's tau), uses the whole
  distribution, and lives on the same scale as a mean label, which is what the
  seed's ±0.5 accuracy compares against.
- `nn`: two hidden layers of 6 and 3 units with tanh (smooth, no dead units in such
  small layers), then one output, mean squared error.

Training follows the seed: Adam, learning rate 0.01, L2 regularisation 0.01, until the
loss stops decreasing. L2 is an explicit penalty l2 * sum(W^2) over the weight matrices
(biases excluded) added to the loss, not Adam's `weight_decay`: Adam rescales the
decay term per parameter, so it would not be the L2-penalised objective. Training is
full-batch (RecoExp-sized data fits in one batch, and "the loss" is then the loss on
the whole training set, with no shuffling to seed); it stops when the penalised loss
has not improved by more than `min_delta` for `patience` epochs, or at `max_epochs`,
and keeps the best weights seen. Factors are z-scored with the training mean and
standard deviation (a constant factor gets std 1), stored with the model.

Everything is deterministic for a seed: weights are initialised under a forked,
seeded torch RNG (the caller's RNG state is untouched), and the math is float64.
A model folder holds `weights.pt` (the state dict) and `expscore.json` (head, factor
names, normaliser, which factors were unavailable and why, settings, training history,
and any settings the caller attaches under `extra`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

HEADS: tuple[str, ...] = ("linear", "logistic", "nn")
Head = Literal["linear", "logistic", "nn"]
HIDDEN = (6, 3)
MODEL_JSON = "expscore.json"
WEIGHTS = "weights.pt"
FORMAT_VERSION = 1


class TrainSettings(BaseModel):
    """How a head is trained (defaults: the seed's values)."""

    model_config = ConfigDict(extra="forbid")

    l2: float = Field(0.01, ge=0, description="L2 penalty on the weight matrices")
    lr: float = Field(0.01, gt=0, description="Adam learning rate")
    max_epochs: int = Field(5000, ge=1, description="cap on full-batch epochs")
    patience: int = Field(50, ge=1, description="epochs without improvement before stopping")
    min_delta: float = Field(1e-7, ge=0, description="smallest decrease that counts as one")
    seed: int = 0
    rating_min: int = Field(1, description="lowest rating class")
    rating_max: int = Field(5, description="highest rating class")

    @model_validator(mode="after")
    def _scale(self) -> TrainSettings:
        if self.rating_max <= self.rating_min:
            raise ValueError(f"rating_max ({self.rating_max}) must exceed rating_min ({self.rating_min})")
        return self

    @property
    def classes(self) -> np.ndarray:
        return np.arange(self.rating_min, self.rating_max + 1, dtype=np.float64)


@dataclass
class Normaliser:
    """z-score per factor, fitted on the training rows."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Normaliser:
        x = np.asarray(x, dtype=np.float64)
        std = x.std(axis=0)
        return cls(mean=x.mean(axis=0), std=np.where(std > 0, std, 1.0))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean) / self.std


def build_net(head: str, n_factors: int, n_classes: int = 5):
    """The torch module of a head (float64)."""
    import torch
    from torch import nn

    if head == "linear":
        net = nn.Linear(n_factors, 1)
    elif head == "logistic":
        net = nn.Linear(n_factors, n_classes)
    elif head == "nn":
        net = nn.Sequential(nn.Linear(n_factors, HIDDEN[0]), nn.Tanh(),
                            nn.Linear(HIDDEN[0], HIDDEN[1]), nn.Tanh(), nn.Linear(HIDDEN[1], 1))
    else:
        raise ValueError(f"unknown head {head!r}; heads: {', '.join(HEADS)}")
    return net.to(torch.float64)


def l2_penalty(net) -> Any:
    """sum of squared weight-matrix entries (biases are not penalised)."""
    return sum((p ** 2).sum() for name, p in net.named_parameters() if name.endswith("weight"))


def label_classes(y: np.ndarray, settings: TrainSettings) -> np.ndarray:
    """Class index (0-based) of each label: rounded half up, clipped to the scale."""
    rounded = np.floor(np.asarray(y, dtype=np.float64) + 0.5)
    return (np.clip(rounded, settings.rating_min, settings.rating_max) - settings.rating_min).astype(np.int64)


@dataclass
class ExpScoreModel:
    """A trained head with its normaliser and the factor names it expects, in order."""

    head: str
    factors: tuple[str, ...]
    normaliser: Normaliser
    net: Any
    settings: TrainSettings
    unavailable: dict[str, str] = field(default_factory=dict)
    history: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def _outputs(self, x: np.ndarray):
        import torch

        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.factors):
            raise ValueError(f"expected a [n, {len(self.factors)}] factor matrix "
                             f"({', '.join(self.factors)}), got shape {x.shape}")
        if not np.isfinite(x).all():
            raise ValueError("factor matrix holds NaN or infinite values")
        self.net.eval()
        with torch.no_grad():
            return self.net(torch.from_numpy(self.normaliser(x)))

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities (logistic head only)."""
        import torch

        if self.head != "logistic":
            raise ValueError("predict_proba is for the logistic head")
        return torch.softmax(self._outputs(x), dim=1).numpy()

    def predict(self, x: np.ndarray) -> np.ndarray:
        """ExpScore per row: the regression output, or the expected class value."""
        if self.head == "logistic":
            return self.predict_proba(x) @ self.settings.classes
        return self._outputs(x)[:, 0].numpy().copy()

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        """The head's data loss without the penalty: MSE, or mean cross-entropy."""
        y = np.asarray(y, dtype=np.float64)
        if self.head == "logistic":
            p = self.predict_proba(x)
            idx = label_classes(y, self.settings)
            return float(-np.mean(np.log(np.maximum(p[np.arange(len(idx)), idx], 1e-300))))
        return float(np.mean((self.predict(x) - y) ** 2))

    def weights(self) -> dict[str, float]:
        """Per-factor weights of the linear head (on z-scored factors), plus its bias."""
        if self.head != "linear":
            raise ValueError("factor weights are defined for the linear head")
        w = self.net.weight.detach().numpy()[0]
        return {**{f: float(v) for f, v in zip(self.factors, w)}, "bias": float(self.net.bias.detach()[0])}

    def n_hidden(self) -> tuple[int, ...]:
        """Widths of the hidden layers (empty for the linear and logistic heads)."""
        from torch import nn

        if self.head != "nn":
            return ()
        linears = [m for m in self.net if isinstance(m, nn.Linear)]
        return tuple(m.out_features for m in linears[:-1])

    # -- persistence --------------------------------------------------------------------

    def save(self, folder: str | Path) -> Path:
        import torch

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.net.state_dict(), folder / WEIGHTS)
        meta = {"format": FORMAT_VERSION, "head": self.head, "factors": list(self.factors),
                "normaliser": {"mean": self.normaliser.mean.tolist(), "std": self.normaliser.std.tolist()},
                "unavailable": self.unavailable, "settings": self.settings.model_dump(),
                "hidden": list(HIDDEN) if self.head == "nn" else [],
                "history": self.history, "extra": self.extra}
        (folder / MODEL_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> ExpScoreModel:
        import torch

        from rexeval.models.refs import resolve

        # A URI (a model in a bucket) is copied to this node once (`models/fetch.py`).
        folder = Path(resolve(str(folder)).location) if "://" in str(folder) else Path(folder)
        meta_path = folder / MODEL_JSON
        if not meta_path.exists():
            raise FileNotFoundError(f"{folder} is not an ExpScore model folder (no {MODEL_JSON})")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"{meta_path}: unsupported model format {meta.get('format')!r}")
        settings = TrainSettings(**meta["settings"])
        net = build_net(meta["head"], len(meta["factors"]), len(settings.classes))
        net.load_state_dict(torch.load(folder / WEIGHTS, weights_only=True))
        norm = Normaliser(np.asarray(meta["normaliser"]["mean"], dtype=np.float64),
                          np.asarray(meta["normaliser"]["std"], dtype=np.float64))
        return cls(head=meta["head"], factors=tuple(meta["factors"]), normaliser=norm, net=net,
                   settings=settings, unavailable=dict(meta.get("unavailable") or {}),
                   history=dict(meta.get("history") or {}), extra=dict(meta.get("extra") or {}))


def train_head(x: np.ndarray, y: np.ndarray, head: str, factors: list[str] | tuple[str, ...],
               settings: TrainSettings | None = None, unavailable: dict[str, str] | None = None,
               extra: dict[str, Any] | None = None) -> ExpScoreModel:
    """Fit one head on factor matrix `x` ([n, len(factors)]) and labels `y`."""
    import torch

    settings = settings or TrainSettings()
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(factors):
        raise ValueError(f"x must be [n, {len(factors)}], got {x.shape}")
    if len(y) != len(x) or len(x) == 0:
        raise ValueError(f"need as many labels as rows (>0): {len(x)} rows, {len(y)} labels")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("factors and labels must be finite")
    norm = Normaliser.fit(x)
    xt = torch.from_numpy(norm(x))
    if head == "logistic":
        target = torch.from_numpy(label_classes(y, settings))
        data_loss = torch.nn.CrossEntropyLoss()
    else:
        target = torch.from_numpy(y)[:, None]
        data_loss = torch.nn.MSELoss()

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        net = build_net(head, len(factors), len(settings.classes))
    opt = torch.optim.Adam(net.parameters(), lr=settings.lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: thread hand-offs cost more than the math
    try:
        best, best_epoch, epoch, stopped = _fit(net, opt, xt, target, data_loss, settings)
    finally:
        torch.set_num_threads(threads)
    model = ExpScoreModel(head=head, factors=tuple(factors), normaliser=norm, net=net, settings=settings,
                          unavailable=dict(unavailable or {}), extra=dict(extra or {}))
    model.history = {"epochs": epoch, "best_epoch": best_epoch, "objective": best,
                     "train_loss": model.loss(x, y), "stopped": stopped}
    return model


def _fit(net, opt, xt, target, data_loss, settings: TrainSettings) -> tuple[float, int, int, str]:
    """Full-batch Adam until the penalised loss stops decreasing; keeps the best weights.
    Returns (best objective, its epoch, epochs run, why it stopped)."""
    best, best_state, best_epoch, stale, epoch = math.inf, None, 0, 0, 0
    for epoch in range(1, settings.max_epochs + 1):
        opt.zero_grad()
        loss = data_loss(net(xt), target) + settings.l2 * l2_penalty(net)
        value = float(loss.detach())
        if value < best - settings.min_delta:
            # Snapshot before the step: these are the weights that scored `value`.
            best, best_epoch, stale = value, epoch, 0
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        else:
            stale += 1
            if stale >= settings.patience:
                break
        loss.backward()
        opt.step()
    if best_state is not None:
        net.load_state_dict(best_state)
    return best, best_epoch, epoch, "max_epochs" if stale < settings.patience else "no_improvement"
