"""XRec's collaborative backbone: rexeval's one LightGCN trained on the training
interactions as a Tune trial of the one trainer, and its embeddings handed to XRec.

XRec trains LightGCN to convergence first and freezes it (seed 000 does the same). Here
one trial trains `models.recommenders.lightgcn.LightGCN` with BPR on the distinct (user,
item) pairs of the prepared training examples (a uniformly sampled negative item per
pair, Adam, the paper's 64 dimensions and 4 layers by default; XRec's layer sum and
Xavier-uniform start through `gcn_combine` and `gcn_init`); after every epoch it
reports the validation AUC (each validation interaction's item against the items the user
has no interaction with), keeps the best epoch and stops after
`gcn_patience` epochs without improvement. A split without validation interactions is
selected by the (negated) training loss instead. `train_collab` returns the propagated
user and item embeddings of the best epoch. The trial finds the prepared data by its
path or URI (`data_path`), so it may run on any node.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rexeval.models.recommenders.lightgcn import LightGCN
from rexeval.pipelines.core.inputs import resolved_text
from rexeval.storage import PathLike
from rexeval.pipelines.core.tune import fit_epochs, fit_one, minibatch_epoch
from rexeval.pipelines.generate.data import GenData
from rexeval.threads import cpu_threads

KEYS = ("gcn_dim", "gcn_layers", "gcn_lr", "gcn_reg", "gcn_combine", "gcn_init", "gcn_reg_mode", "gcn_batch_size",
        "gcn_epochs", "gcn_patience", "seed")
METRIC = "val_auc"


def interactions(data: GenData, split: str) -> np.ndarray:
    """Distinct (user, item) index pairs of a split, [2, E]."""
    a = data.arrays[split]
    pairs = np.unique(np.stack([a["user"], a["item"]], 1), axis=0) if len(a["user"]) else np.zeros((0, 2), int)
    return pairs.T.astype(np.int64)


def lightgcn(data: GenData, train: np.ndarray, settings: dict[str, Any]) -> LightGCN:
    """The LightGCN of `settings` (the `KEYS`) on the training pairs."""
    return LightGCN(data.n_users, data.n_items, train, dim=settings["gcn_dim"], layers=settings["gcn_layers"],
                    reg=settings["gcn_reg"], seed=settings["seed"], combine=settings["gcn_combine"],
                    init=settings["gcn_init"], reg_mode=settings["gcn_reg_mode"])


@torch.no_grad()
def validation_auc(model: LightGCN, train: np.ndarray, valid: np.ndarray) -> float:
    """Mean over validation pairs (u, i) of the share of u's unseen items (neither in
    training nor in validation) that score below i: AUC, smooth even when there are
    fewer items than a top-k list is long."""
    hu, hi = model.embeddings()
    n_items = hi.shape[0]
    known: dict[int, set[int]] = {}
    for u, i in np.concatenate([train, valid], 1).T:
        known.setdefault(int(u), set()).add(int(i))
    total, n = 0.0, 0
    for start in range(0, valid.shape[1], 1024):
        us, its = valid[0, start:start + 1024], valid[1, start:start + 1024]
        scores = hu[torch.as_tensor(us)] @ hi.T
        pos = scores[torch.arange(len(us)), torch.as_tensor(its)]
        below = scores < pos[:, None]
        for r, u in enumerate(us.tolist()):
            neg = np.setdiff1d(np.arange(n_items), list(known[u]))
            if len(neg):
                total += float(below[r, torch.as_tensor(neg)].float().mean())
                n += 1
    return total / n if n else float("nan")


def lightgcn_trainable(config: dict[str, Any]) -> None:
    """The Tune function trainable (see the module docstring)."""
    torch.set_num_threads(cpu_threads(config.get("threads", 1)))
    data = GenData.load(config["data_path"])
    train, valid = interactions(data, "train"), interactions(data, "valid")
    torch.manual_seed(config["seed"])
    model = lightgcn(data, train, config).to(config.get("device", "cpu"))
    opt = torch.optim.Adam(model.parameters(), lr=config["gcn_lr"])
    gen = torch.Generator().manual_seed(config["seed"])
    dev = model.user_emb.device

    def train_epoch() -> float:
        order = torch.randperm(train.shape[1], generator=gen)
        users, pos = torch.as_tensor(train[0])[order], torch.as_tensor(train[1])[order]
        neg = torch.randint(data.n_items, (len(order),), generator=gen)
        return minibatch_epoch(opt, len(order), config["gcn_batch_size"],
                               lambda sl: model.loss(users[sl].to(dev), pos[sl].to(dev), neg[sl].to(dev)))

    last = {"loss": math.nan}

    def epoch() -> float:
        last["loss"] = train_epoch()
        return last["loss"]

    def validate() -> dict[str, float]:
        if valid.shape[1] == 0:
            return {METRIC: -last["loss"]}
        auc = validation_auc(model, train, valid)
        return {METRIC: -last["loss"] if math.isnan(auc) else auc}

    fit_epochs(model, opt, gen, epochs=config["gcn_epochs"], patience=config["gcn_patience"], metric_key=METRIC,
               train_epoch=epoch, validate=validate, mode="max",
               extra_state={"n_users": data.n_users, "n_items": data.n_items,
                            "settings": {k: config[k] for k in KEYS}})


def train_collab(data_path: PathLike, settings: dict[str, Any], storage: PathLike, *, cpus: float = 1,
                 gpus: float = 0, progress: Callable[[str], None] = print) -> tuple[np.ndarray, np.ndarray]:
    """Train (or restore) LightGCN on the prepared data; the best epoch's propagated
    (user, item) embeddings as float32 arrays."""
    base = {k: settings[k] for k in KEYS} | {"data_path": resolved_text(data_path)}
    progress(f"  LightGCN (XRec's collaborative backbone): d {base['gcn_dim']}, {base['gcn_layers']} layers "
             f"({base['gcn_combine']}), {base['gcn_init']} init, up to {base['gcn_epochs']} epochs, best epoch by "
             "validation AUC")
    state = fit_one(lightgcn_trainable, base, storage, "lightgcn", metric=METRIC, mode="max",
                    max_epochs=base["gcn_epochs"], cpus=cpus, gpus=gpus, progress=progress)
    data = GenData.load(data_path)
    model = lightgcn(data, interactions(data, "train"), base)
    model.load_state_dict(state["model"])
    with torch.no_grad():
        hu, hi = model.embeddings()
    progress(f"  LightGCN: best epoch {state['best_epoch']} (validation AUC {state['best']:.4f})")
    return hu.numpy().astype(np.float32), hi.numpy().astype(np.float32)
