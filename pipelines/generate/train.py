"""Train seed 000's explanation generators with Ray Tune (NRT, Att2Seq, PETER, CER, PEPLER, XRec).

One Tune trial = one model configuration trained on the prepared data
(`pipelines/generate/data.py`) with teacher forcing:
- every epoch walks the training examples in a seeded random order, in batches of
  `batch_size`, steps the model's own optimizer (its paper's: SGD for PETER and CER,
  RMSprop for Att2Seq, AdaDelta for NRT) with gradient-norm clipping at `clip`;
- after every epoch the validation examples give the model's objective (`val_loss`),
  the text perplexity (`val_ppl`), text NLL + rating MSE unweighted (`val_text_rating`,
  the value PETER's, NRT's and PEPLER-reg's originals stop and select on) and the
  rating RMSE (`val_rmse`); `select` names the one that chooses the best epoch and stops
  a trial `patience` epochs after its last improvement;
- an epoch that does not improve multiplies the learning rate by `lr_decay` once (PETER's
  and CER's 0.25, as PETER's scheduler steps after every such epoch; 1 = no decay); each
  epoch reports the rate it trained with (`lr`), and the optimizer's state (learning rate
  included) is in the checkpoint, so a restored trial continues with the same rate;
- the optimizer sees only the parameters the model's current phase trains (a frozen
  backbone's are left out); a model with phases (PEPLER's sequential tuning) moves to
  the next when one stops improving (`fit_epochs(phases=...)`), with a new optimizer;
- on a GPU an LM backbone with dtype "auto" is loaded in bfloat16.
The epoch loop, checkpoints (model, optimizer, RNG, early-stopping state), `Tuner.restore`
and the refusal of other settings are the one trainer's (`pipelines/core/tune.py`),
shared with the statement rankers.
The settings themselves (each model's under a preset, the objectives, what a grid may
vary) are `pipelines/generate/settings.py`'s, which the config checks without torch.

A trial may run on any node: it loads the prepared data from the path or URI in its
config (`data_path`), and Tune keeps its checkpoints in the experiment's storage. A
checkpoint folder under a URI is copied down before torch reads it (`read_state`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from rexeval.models.generators.base import PAD, build_optimizer, generator_class
from rexeval.models.generators.presets import DEFAULT_PRESET
from rexeval.pipelines.core.inputs import resolved_text
from rexeval.storage import PathLike, local_copy, location
from rexeval.pipelines.core.tune import STATE_FILE, fit_epochs, read_checkpoint
from rexeval.pipelines.core.tune import build_tuner as core_build_tuner
from rexeval.pipelines.generate.data import GenData
from rexeval.pipelines.generate.settings import METRICS, resolve_settings, sweepable
from rexeval.threads import cpu_threads


def build_model(s: dict[str, Any], data: GenData, device: str = "cpu"):
    """The generator of a resolved settings dict, sized for `data`, on `device`."""
    cls = generator_class(s["model"])
    if s.get("dtype") == "auto" and torch.device(device).type == "cuda":
        s = {**s, "dtype": "bfloat16"}
    return cls.build(data, s).to(device)


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def train_epoch(model, opt, data: GenData, batch_size: int, clip: float, gen: torch.Generator) -> float:
    """One teacher-forced pass over the training examples; mean batch loss."""
    model.train()
    dev = next(model.parameters()).device
    total, batches = 0.0, 0
    for b in data.batches("train", batch_size, gen):
        loss = model.losses(b.to(dev))["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        total += float(loss.detach())
        batches += 1
    model.eval()
    return total / max(1, batches)


@torch.no_grad()
def validate(model, data: GenData, batch_size: int, split: str = "valid") -> dict[str, float]:
    """Mean objective, text perplexity (per target token, EOS included), text NLL +
    rating MSE (batch means averaged over examples, as the originals do; a coherence term
    counts in the rating part, as CER's does) and rating RMSE."""
    model.eval()
    dev = next(model.parameters()).device
    loss = nll = sq = text_rating = 0.0
    n = tokens = 0
    for b in data.batches(split, batch_size):
        b = b.to(dev)
        parts = model.losses(b)
        k = int((b.tokens[:, 1:] != PAD).sum())
        loss += float(parts["loss"]) * len(b)
        text_rating += sum(float(parts[p]) for p in ("text", "rating", "coherence") if p in parts) * len(b)
        nll += float(parts["text"]) * k
        tokens += k
        n += len(b)
        if "rating" in parts:
            sq += float(parts["rating"]) * len(b)
    if n == 0:
        return {"val_loss": float("nan"), "val_ppl": float("nan"), "val_text_rating": float("nan")}
    out = {"val_loss": loss / n, "val_ppl": math.exp(min(nll / max(tokens, 1), 50.0)),
           "val_text_rating": text_rating / n}
    if model.predicts_rating:
        out["val_rmse"] = math.sqrt(sq / n)
    return out


_DATA_CACHE: dict[str, GenData] = {}


def _data(path: str) -> GenData:
    if path not in _DATA_CACHE:
        _DATA_CACHE[path] = GenData.load(path)
    return _DATA_CACHE[path]


def generator_trainable(config: dict[str, Any], after_epoch: Callable[[int], None] | None = None) -> None:
    """The Tune function trainable (see the module docstring)."""
    s = resolve_settings(config["model"], {k: v for k, v in config.items()
                                           if k not in ("model", "data_path", "threads", "device", "preset")},
                         config.get("preset", DEFAULT_PRESET))
    torch.set_num_threads(cpu_threads(config.get("threads", 1)))
    device = config.get("device", "cpu")
    data = _data(config["data_path"])
    torch.manual_seed(s["seed"])
    model = build_model(s, data, device)
    opts: list[torch.optim.Optimizer] = []

    def optimizer_for(phase: int) -> torch.optim.Optimizer:
        model.enter_phase(phase)
        opts[:] = [build_optimizer(s["optimizer"], trainable_parameters(model), s["lr"], s["weight_decay"],
                                   s.get("rmsprop_alpha", 0.99))]
        return opts[0]

    optimizer_for(0)
    gen = torch.Generator().manual_seed(s["seed"])

    def decay() -> None:
        for group in opts[0].param_groups:
            group["lr"] *= s["lr_decay"]

    fit_epochs(model, opts[0], gen, epochs=s["epochs"], patience=s["patience"], metric_key=METRICS[s["select"]],
               train_epoch=lambda: train_epoch(model, opts[0], data, s["batch_size"], s["clip"], gen),
               validate=lambda: {**validate(model, data, s["batch_size"]), "lr": opts[0].param_groups[0]["lr"]},
               mode="min",
               on_stale=decay if s["lr_decay"] != 1 else None,
               phases=generator_class(s["model"]).n_phases(s), next_phase=optimizer_for,
               extra_state={"settings": s, "data": str(data.folder), "vocab": data.vocab.words,
                            "fingerprint": data.fingerprint()}, after_epoch=after_epoch)


def read_state(checkpoint_dir: PathLike, device: str = "cpu") -> dict:
    """The state saved in an epoch checkpoint folder, a local one or one under a URI
    (its state file is copied down first: torch reads local files)."""
    with local_copy(location(checkpoint_dir) / STATE_FILE) as path:
        return read_checkpoint(path.parent, device)


def load_checkpoint_model(checkpoint_dir: PathLike, device: str = "cpu", data: GenData | None = None):
    """(model, settings, data) rebuilt from an epoch checkpoint of `generator_trainable`
    (local or under a URI, as is the data folder it names)."""
    state = read_state(checkpoint_dir, device)
    data = data if data is not None else GenData.load(state["data"])
    if state.get("fingerprint") not in (None, data.fingerprint()):
        raise ValueError(f"{data.folder} is not the data {checkpoint_dir} was trained on (its vocabulary or "
                         "user and item index differ: it was prepared again since); train again, or restore "
                         "the data folder the checkpoint names")
    model = build_model(state["settings"], data, device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, state["settings"], data


def build_tuner(settings: dict[str, Any], data_path: PathLike, storage: PathLike, name: str,
                grid: dict[str, list] | None = None, trainable: Callable | None = None, **kwargs):
    """The Tuner of `<storage>/<name>` and its plan (`pipelines.core.tune.build_tuner`).
    The trials find the data by `data_path` (a URI kept, a local path made absolute)."""
    base = {**settings, "data_path": resolved_text(data_path)}
    phases = generator_class(settings["model"]).n_phases(settings)
    return core_build_tuner(trainable or generator_trainable, base, storage, name,
                            metric=METRICS[settings["select"]], mode="min", max_epochs=settings["epochs"] * phases,
                            sweepable=sweepable(settings["model"]), grid=grid, **kwargs)

