"""Train BPER+ / ExpGCN on a STAR benchmark with Ray Tune (seed 002 section 5.1.2).

One Tune trial = one model configuration trained with BPR on sampled negatives:
- every epoch walks the training triplets (user, item, statement) in a seeded random
  order, pairs each with a uniformly sampled negative statement (and a negative item
  for ExpGCN's recommendation term), and steps Adam;
- after every epoch the model ranks the validation interactions at `select_level`
  (global by default) and reports `val_<metric>` (NDCG@10 by default) with a checkpoint
  holding the model, the optimizer and the sampler's RNG state, so a restored trial
  continues exactly where it stopped;
- a trial stops at `epochs` (the seed's 500), after `patience` epochs without a better
  validation score, or earlier when ASHA cuts it.
The epoch loop, checkpoints, early stopping and the Tune experiment are the one
trainer's (`pipelines/core/tune.py`). The experiment lives in `<out>/tune/<name>`;
running the same command again restores it with `Tuner.restore` (finished trials are
kept, errored or interrupted ones resume from their last checkpoint). The best
checkpoint over all trials and epochs, by the validation metric, is then evaluated on
the test split at every level. With several seeds (`star train --seeds N`) the seed is
one more grid dimension and each seed's best checkpoint is one run (seed 002 reports
the mean of 3); the seed sets the initial weights and the negative-sampling order.

CPU trials locally and GPU trials on a cluster differ only in `gpus_per_trial`.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rexeval.models.recommenders.base import ranker_class
from rexeval.pipelines.core.tune import build_tuner as core_build_tuner
from rexeval.storage import Location, is_uri, location
from rexeval.pipelines.core.tune import fit_epochs, read_checkpoint
from rexeval.pipelines.star.config import TrainSettings
from rexeval.pipelines.star.data import StarData
from rexeval.threads import cpu_threads

def model_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    if s["model"] == "bper+":
        return {"dim": s["dim"], "mu": s["mu"], "reg": s["reg"], "seed": s["seed"]}
    return {"dim": s["dim"], "layers_us": s["layers_us"], "layers_is": s["layers_is"],
            "layers_ui": s["layers_ui"], "reg": s["reg"], "rec_weight": s["rec_weight"],
            "seed": s["seed"]}


def build_model(s: dict[str, Any], data: StarData, features: np.ndarray | None, device: str):
    """The torch model of a resolved settings dict, on `device`."""
    import rexeval.models.recommenders.bper
    import rexeval.models.recommenders.expgcn  # noqa: F401  (registers "expgcn")

    cls = ranker_class(s["model"])
    model = cls(data.n_users, data.n_items, data.n_statements, graph=data.train_graph(),
                statement_features=features, **model_kwargs(s))
    return model.to(device)


def train_epoch(model, opt, triplets: torch.Tensor, n_statements: int, n_items: int,
                batch_size: int, gen: torch.Generator) -> float:
    """One pass over the training triplets with fresh negatives; mean batch loss."""
    model.train()
    dev = next(model.parameters()).device
    order = torch.randperm(len(triplets), generator=gen)
    total, batches = 0.0, 0
    for start in range(0, len(order), batch_size):
        b = triplets[order[start:start + batch_size]]
        neg = torch.randint(n_statements, (len(b),), generator=gen)
        neg_items = torch.randint(n_items, (len(b),), generator=gen)
        loss = model.loss(b[:, 0].to(dev), b[:, 1].to(dev), b[:, 2].to(dev), neg.to(dev), neg_items.to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += float(loss.detach())
        batches += 1
    model.eval()
    return total / max(1, batches)


_DATA_CACHE: dict[str, StarData] = {}


def _data(path: str) -> StarData:
    if path not in _DATA_CACHE:
        _DATA_CACHE[path] = StarData.load(path)
    return _DATA_CACHE[path]


def _metric_ks(metric: str) -> tuple[int, ...]:
    try:
        return (int(metric.split("@")[1]),)
    except (IndexError, ValueError):
        raise ValueError(f"select_metric must look like ndcg@10, got {metric!r}") from None


def star_trainable(config: dict[str, Any], after_epoch: Callable[[int], None] | None = None) -> None:
    """The Tune function trainable (see the module docstring): BPR epochs and validation
    ranking, run by the one trainer's epoch loop (`pipelines.core.tune.fit_epochs`)."""
    from rexeval.pipelines.star.evaluate import evaluate

    settings = TrainSettings(**{k: v for k, v in config.items() if k in TrainSettings.model_fields})
    s = settings.resolved()
    torch.set_num_threads(cpu_threads(config.get("threads", 1)))
    device = config.get("device", "cpu")
    data = _data(config["data_path"])
    features = load_features(config["features_path"]) if s["model"] == "bper+" and config.get("features_path") \
        else None
    torch.manual_seed(s["seed"])
    model = build_model(s, data, features, device)
    opt = torch.optim.Adam(model.parameters(), lr=s["lr"])
    gen = torch.Generator().manual_seed(s["seed"])
    triplets = torch.from_numpy(data.triplet_arrays())
    valid = data.rows("valid")
    if s["valid_rows"] and len(valid) > s["valid_rows"]:
        valid = np.sort(np.random.default_rng(s["seed"]).choice(valid, s["valid_rows"], replace=False))
    ks = _metric_ks(s["select_metric"])

    def validate() -> float:
        res = evaluate(model, data, rows=valid, levels=(s["select_level"],), ks=ks, device=device)
        return res[s["select_level"]].summary.get(s["select_metric"], float("nan"))

    fit_epochs(model, opt, gen, epochs=s["epochs"], patience=s["patience"], metric_key=settings.metric_key,
               train_epoch=lambda: train_epoch(model, opt, triplets, data.n_statements, data.n_items,
                                               s["batch_size"], gen),
               validate=validate, extra_state={"settings": s, "features_path": config.get("features_path")},
               after_epoch=after_epoch)


def load_checkpoint_model(checkpoint_dir: str | Path, data: StarData, features: np.ndarray | None,
                          device: str = "cpu", state: dict | None = None):
    """Rebuild the model saved by `star_trainable` in an epoch checkpoint (from `state`
    when it was already read)."""
    state = read_checkpoint(checkpoint_dir, device) if state is None else state
    model = build_model(state["settings"], data, features, device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, state


def load_features(path: str | Path | Location) -> np.ndarray:
    """BPER+'s statement features (.npy), from the local disk or a URI (a trial on any
    node reads them where the driver wrote them)."""
    import io

    loc = location(path)
    return np.load(loc.local_path()) if loc.is_local else np.load(io.BytesIO(loc.read_bytes()))


def _data_text(data_path: str | Path | Location) -> str:
    """The benchmark as the trials' config names it: a URI as given, a local folder
    absolute with its links resolved (the trials may run in another working folder)."""
    loc = location(data_path)
    return str(loc.local_path().resolve()) if loc.is_local else str(loc)


def build_tuner(settings: TrainSettings, data_path: str | Path, storage: str | Path, name: str,
                grid: dict[str, list] | None = None, features_path: str | None = None,
                trainable: Callable | None = None, **kwargs):
    """The Tuner of `<storage>/<name>` for these settings and its plan (see
    `pipelines.core.tune.build_tuner`; `kwargs` are its scheduling and resource options)."""
    base = {**settings.model_dump(), "data_path": _data_text(data_path), "features_path": features_path}
    return core_build_tuner(trainable or star_trainable, base, storage, name, metric=settings.metric_key,
                            max_epochs=settings.epochs, sweepable=TrainSettings.model_fields, grid=grid,
                            **kwargs)


def run_tune(settings: TrainSettings, data_path: str | Path, storage: str | Path, name: str, **kwargs):
    """Fit (or restore and finish) the Tune experiment `<storage>/<name>`; its ResultGrid."""
    return build_tuner(settings, data_path, storage, name, **kwargs)[0].fit()


def statement_features(data: StarData, encoder_ref: str, path: str | Path, device: str = "auto",
                       progress: Callable[[str], None] = print) -> str:
    """Encode the candidate statements once (BPER+'s frozen features), cached by content
    in the folder `path` (local or a URI); the .npy file's path, as `path` was given."""
    import hashlib
    import io

    from rexeval.models.encoders.embedder import build_embedder

    h = hashlib.blake2b(digest_size=8)
    h.update(encoder_ref.encode())
    for t in data.statement_texts:
        h.update(str(t).encode() + b"\x1e")
    name = f"statement-features-{h.hexdigest()}.npy"
    text = f"{str(path).rstrip('/')}/{name}" if is_uri(path) else str(Path(path) / name)
    target = location(text)
    if target.exists():
        return text
    progress(f"  encoding {data.n_statements:,} statements with {encoder_ref} (BPER+ features)")
    emb = build_embedder(encoder_ref, device=device).encode([str(t) for t in data.statement_texts])
    buf = io.BytesIO()
    np.save(buf, emb.astype(np.float32))
    target.write_bytes(buf.getvalue())  # whole or nothing: a temporary name locally, one PUT on a store
    return text
