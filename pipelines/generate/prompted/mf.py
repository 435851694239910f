"""The BiasedMF behind seed 004's user-based and item-based explanations, trained as a
Tune trial of rexeval's one trainer.

ALERT (seed 004, section 5.1) finds the users and items most similar to the ones being
explained with a BiasedMF (Koren et al., 2009) trained on the ratings. One trial here
trains `models.recommenders.biased_mf.BiasedMF` with Adam on shuffled mini-batches of
the training ratings (squared error + L2, mu fixed at the training mean); after every
epoch it reports the RMSE on the validation ratings, keeps the best epoch and stops after
`mf_patience` epochs without a lower one. The epoch is selected on ratings it never
trained on (`selection_rows`): a split folder's validation reviews, which leave its
training rows, or else a seeded share of the known ratings held out from training.
`train_biased_mf` indexes the users and items,
writes the ratings to one .npz under the storage folder (a local path or a URI: the
trial reads it through `rexeval/storage.py`, wherever it runs), runs (or restores) the
experiment through `pipelines/core/tune.py` and returns the best epoch's factors with
the ids they belong to (`MFResult`), whose rows `nearest` ranks by cosine.
"""
from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from rexeval.models.recommenders.biased_mf import BiasedMF, nearest
from rexeval.pipelines.core.inputs import resolved_text
from rexeval.pipelines.core.io import write_bytes_atomic
from rexeval.storage import PathLike, location
from rexeval.pipelines.core.tune import fit_epochs, fit_one, minibatch_epoch
from rexeval.threads import cpu_threads

KEYS = ("mf_dim", "mf_lr", "mf_reg", "mf_batch_size", "mf_epochs", "mf_patience", "seed")
DEFAULTS: dict[str, Any] = {"mf_dim": 32, "mf_lr": 0.01, "mf_reg": 0.02, "mf_batch_size": 256, "mf_epochs": 50,
                            "mf_patience": 5, "seed": 0}
METRIC = "val_rmse"  # lower is better (mode "min")
NAME = "biased_mf"
HOLDOUT_SHARE = 0.1  # of the training rows, held out when no validation split is given
HOLDOUT_MIN_ROWS = 20  # fewer training rows than this: no validation at all
ARRAYS = ("train_user", "train_item", "train_rating", "valid_user", "valid_item", "valid_rating",
          "n_users", "n_items")
COLUMNS = ("user_id", "item_id", "rating")


@dataclass
class MFResult:
    """The best epoch of a trained BiasedMF: factor row r of `user_factors` belongs to
    `user_ids[r]` (likewise items). `val_rmse` is the best validation RMSE and
    `baseline_rmse` the RMSE of predicting `global_mean` (the training mean) on the same
    rows; when there were no validation rows (`validated` False) both are measured on
    the training rows instead."""

    user_ids: list[str]
    item_ids: list[str]
    user_factors: np.ndarray  # float32 [n_users, dim]
    item_factors: np.ndarray  # float32 [n_items, dim]
    global_mean: float
    val_rmse: float
    baseline_rmse: float
    best_epoch: int
    user_bias: np.ndarray | None = None  # float32 [n_users]
    item_bias: np.ndarray | None = None  # float32 [n_items]
    validated: bool = True
    train_ratings: int | None = None  # rows it trained on
    selection_ratings: int | None = None  # rows that selected the epoch, none of them trained on
    _uidx: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    _iidx: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)

    def user_index(self) -> dict[str, int]:
        """user id -> factor row."""
        if self._uidx is None:
            self._uidx = {u: r for r, u in enumerate(self.user_ids)}
        return self._uidx

    def item_index(self) -> dict[str, int]:
        """item id -> factor row."""
        if self._iidx is None:
            self._iidx = {i: r for r, i in enumerate(self.item_ids)}
        return self._iidx

    def similar_users(self, user_id: str, k: int, candidates: Iterable[str] | None = None
                      ) -> list[tuple[str, float]]:
        """The `k` users (among `candidates`, default all) whose factors are most
        cosine-similar to `user_id`'s, as (user id, similarity); unknown ids raise KeyError."""
        return self._similar(self.user_factors, self.user_ids, self.user_index(), user_id, k, candidates)

    def similar_items(self, item_id: str, k: int, candidates: Iterable[str] | None = None
                      ) -> list[tuple[str, float]]:
        """As `similar_users`, for items (e.g. candidates = a user's purchase history)."""
        return self._similar(self.item_factors, self.item_ids, self.item_index(), item_id, k, candidates)

    @staticmethod
    def _similar(factors: np.ndarray, ids: list[str], index: dict[str, int], query: str, k: int,
                 candidates: Iterable[str] | None) -> list[tuple[str, float]]:
        rows = None if candidates is None else [index[c] for c in candidates]
        return [(ids[r], s) for r, s in nearest(factors, index[query], rows, k)]


def resolve_settings(settings: dict[str, Any] | None) -> dict[str, Any]:
    """DEFAULTS with `settings` on top; unknown keys and impossible values are refused."""
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown BiasedMF settings {unknown}; known: {', '.join(KEYS)}")
    s = {**DEFAULTS, **settings}
    for key in ("mf_dim", "mf_batch_size", "mf_epochs", "mf_patience"):
        if int(s[key]) < 1:
            raise ValueError(f"{key} must be >= 1, got {s[key]}")
        s[key] = int(s[key])
    for key in ("mf_lr", "mf_reg"):
        if not float(s[key]) >= 0:
            raise ValueError(f"{key} must be >= 0, got {s[key]}")
        s[key] = float(s[key])
    s["seed"] = int(s["seed"])
    return s


def _load(path: str) -> dict[str, np.ndarray]:
    """The arrays at `path`, read through storage: the trial may run on a node that
    shares no disk with the driver that wrote them."""
    with np.load(io.BytesIO(location(path).read_bytes())) as z:
        return {k: z[k] for k in ARRAYS}


@torch.no_grad()
def rmse(model: BiasedMF, users: torch.Tensor, items: torch.Tensor, ratings: torch.Tensor,
         chunk: int = 1 << 16) -> float:
    """Root mean squared error of the model's predictions on aligned index/rating rows
    (NaN when there are none)."""
    if len(users) == 0:
        return math.nan
    total = 0.0
    for s in range(0, len(users), chunk):
        pred = model(users[s:s + chunk], items[s:s + chunk])
        total += float((pred - ratings[s:s + chunk]).pow(2).sum())
    return math.sqrt(total / len(users))


def biased_mf_trainable(config: dict[str, Any]) -> None:
    """The Tune function trainable (see the module docstring). It reads the arrays
    `train_biased_mf` wrote to `config["data_path"]`. The reported `val_rmse` is the
    RMSE on the validation rows; when the file holds none, it is the RMSE on the
    training rows after the epoch (so the "best epoch" is then simply the best fit)."""
    torch.set_num_threads(cpu_threads(config.get("threads", 1)))
    a = _load(config["data_path"])
    dev = torch.device(config.get("device", "cpu"))

    def tensors(split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.as_tensor(a[f"{split}_user"], dtype=torch.long, device=dev),
                torch.as_tensor(a[f"{split}_item"], dtype=torch.long, device=dev),
                torch.as_tensor(a[f"{split}_rating"], dtype=torch.float32, device=dev))

    tu, ti, tr = tensors("train")
    vu, vi, vr = tensors("valid")
    n_users, n_items = int(a["n_users"]), int(a["n_items"])
    mu = float(a["train_rating"].astype(np.float64).mean()) if len(tr) else 0.0
    torch.manual_seed(config["seed"])
    model = BiasedMF(n_users, n_items, dim=config["mf_dim"], global_mean=mu, seed=config["seed"]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=config["mf_lr"])
    gen = torch.Generator().manual_seed(config["seed"])
    bs, reg = config["mf_batch_size"], config["mf_reg"]

    def train_epoch() -> float:
        order = torch.randperm(len(tr), generator=gen).to(dev)
        return minibatch_epoch(opt, len(order), bs,
                               lambda sl: model.loss(tu[order[sl]], ti[order[sl]], tr[order[sl]], reg))

    def validate() -> dict[str, float]:
        if len(vr) == 0:
            return {METRIC: rmse(model, tu, ti, tr)}
        return {METRIC: rmse(model, vu, vi, vr)}

    fit_epochs(model, opt, gen, epochs=config["mf_epochs"], patience=config["mf_patience"], metric_key=METRIC,
               train_epoch=train_epoch, validate=validate, mode="min",
               extra_state={"n_users": n_users, "n_items": n_items, "global_mean": mu,
                            "validated": bool(len(vr)), "settings": {k: config[k] for k in KEYS}})


def _frame(df: pd.DataFrame | None, name: str) -> pd.DataFrame:
    if df is None:
        return pd.DataFrame({"user_id": pd.Series(dtype=str), "item_id": pd.Series(dtype=str),
                             "rating": pd.Series(dtype=float)})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{name} lacks the columns {missing} (needs {', '.join(COLUMNS)})")
    out = pd.DataFrame({"user_id": df["user_id"].astype(str).to_numpy(),
                        "item_id": df["item_id"].astype(str).to_numpy(),
                        "rating": pd.to_numeric(df["rating"]).astype(float).to_numpy()})
    if out["rating"].isna().any() or not np.isfinite(out["rating"].to_numpy()).all():
        raise ValueError(f"{name} has missing or infinite ratings")
    return out


def hold_out(train: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rest, held out): a seeded HOLDOUT_SHARE of the rows (at least one) when there are
    at least HOLDOUT_MIN_ROWS, else (train, empty). Row order is kept on both sides."""
    n = len(train)
    if n < HOLDOUT_MIN_ROWS:
        return train, train.iloc[:0]
    n_out = max(1, round(HOLDOUT_SHARE * n))
    out = np.zeros(n, dtype=bool)
    out[np.random.default_rng(seed).permutation(n)[:n_out]] = True
    return train[~out].reset_index(drop=True), train[out].reset_index(drop=True)


def selection_rows(train: pd.DataFrame, valid: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows to train on, rows that select the epoch), never sharing a (user, item) pair.

    - `valid` has rows (a split folder's validation split): they select the epoch, and
      every row of `train` with the (user, item) pair of a `valid` row leaves training
      (`generate llm` passes train + valid as the known reviews when it explains test);
    - no `valid` rows (an ingest folder, or a split folder explained on valid): a seeded
      HOLDOUT_SHARE of `train` is held out (`hold_out`), and any other row of a held-out
      pair leaves training too;
    - fewer than HOLDOUT_MIN_ROWS training rows and no `valid`: nothing is held out and
      the selection frame is empty (the training RMSE then picks the epoch, and the
      result says `validated` False).
    """
    if not len(valid):
        train, valid = hold_out(train, seed)
    if len(valid):
        pairs = pd.MultiIndex.from_frame(valid[["user_id", "item_id"]])
        shared = pd.MultiIndex.from_frame(train[["user_id", "item_id"]]).isin(pairs)
        train = train[~shared].reset_index(drop=True)
    return train, valid.reset_index(drop=True)


def arrays_hash(arrays: dict[str, np.ndarray]) -> str:
    """A content hash of the arrays (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        v = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{v.dtype.str}|{v.shape}|".encode())
        h.update(v.tobytes())
    return h.hexdigest()[:16]


def write_arrays(arrays: dict[str, np.ndarray], storage: PathLike) -> str:
    """`<storage>/biased_mf-data-<content hash>.npz` (its path or URI), written whole or
    not at all; an existing file of that name (the same content) is reused."""
    path = location(resolved_text(storage)) / f"{NAME}-data-{arrays_hash(arrays)}.npz"
    if not path.exists():
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        write_bytes_atomic(path, buf.getvalue())
    return str(path)


def train_biased_mf(train: pd.DataFrame, valid: pd.DataFrame | None, storage: PathLike,
                    settings: dict[str, Any] | None = None, *, cpus: float = 1, gpus: float = 0,
                    progress: Callable[[str], None] = print) -> MFResult:
    """Train (or restore) BiasedMF on `train` (user_id, item_id, rating), selecting the
    epoch by RMSE on rows it does not train on; the best epoch's factors as an `MFResult`.

    Which rows select (`selection_rows`): `valid` when it has rows, and the rows of
    `train` that share a (user, item) pair with it are left out of training; when `valid`
    is None or empty, a seeded HOLDOUT_SHARE of the training rows is held out for
    selection if there are at least HOLDOUT_MIN_ROWS of them; with fewer, training RMSE
    selects the epoch. Users and items are indexed by the sorted ids of both sides
    together (a user or item seen only in the selection rows keeps its initial factors). The
    Tune experiment lives in `<storage>/biased_mf`: a second call with the same data and
    settings restores it and trains nothing; other data or settings in the same folder
    are refused (FileExistsError from `core.tune.build_tuner`).
    """
    s = resolve_settings(settings)
    tr, va = _frame(train, "train"), _frame(valid, "valid")
    if len(tr) == 0:
        raise ValueError("train has no ratings")
    given, known = len(va), len(tr)
    tr, va = selection_rows(tr, va, s["seed"])
    if len(tr) == 0:
        raise ValueError("no training rating is left once the validation ratings' (user, item) pairs leave it")
    if given:
        progress(f"  BiasedMF: {len(va)} validation ratings select the epoch; {known - len(tr)} of the {known} "
                 "known ratings share their (user, item) pairs and are left out of training")
    elif len(va):
        progress(f"  BiasedMF: no validation split given; holding out {len(va)} of {known} "
                 f"training ratings (seed {s['seed']})" + (
                     f", and {known - len(va) - len(tr)} more of the same (user, item) pairs"
                     if known - len(va) - len(tr) else ""))
    else:
        progress(f"  BiasedMF: no validation split and only {len(tr)} training ratings; "
                 "the training RMSE selects the epoch")
    user_ids = sorted(set(tr["user_id"]) | set(va["user_id"]))
    item_ids = sorted(set(tr["item_id"]) | set(va["item_id"]))
    uidx, iidx = {u: r for r, u in enumerate(user_ids)}, {i: r for r, i in enumerate(item_ids)}
    arrays: dict[str, np.ndarray] = {"n_users": np.int64(len(user_ids)), "n_items": np.int64(len(item_ids))}
    for split, df in (("train", tr), ("valid", va)):
        arrays[f"{split}_user"] = df["user_id"].map(uidx).to_numpy(np.int64)
        arrays[f"{split}_item"] = df["item_id"].map(iidx).to_numpy(np.int64)
        arrays[f"{split}_rating"] = df["rating"].to_numpy(np.float32)
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    data_path = write_arrays(arrays, storage)

    base = {k: s[k] for k in KEYS} | {"data_path": data_path}
    progress(f"  BiasedMF (similar users and items for the user- and item-based explanations): "
             f"{len(user_ids)} users, {len(item_ids)} items, {len(tr)} training ratings, d {base['mf_dim']}, "
             f"up to {base['mf_epochs']} epochs, best epoch by "
             f"{'validation' if len(va) else 'training'} RMSE")
    state = fit_one(biased_mf_trainable, base, resolved_text(storage), NAME, metric=METRIC, mode="min",
                    max_epochs=base["mf_epochs"], cpus=cpus, gpus=gpus, progress=progress)
    model = BiasedMF(len(user_ids), len(item_ids), dim=base["mf_dim"], global_mean=state["global_mean"],
                     seed=base["seed"])
    model.load_state_dict(state["model"])
    mu = float(state["global_mean"])
    scored = va if len(va) else tr
    baseline = float(np.sqrt(np.mean((scored["rating"].to_numpy(np.float64) - mu) ** 2)))
    val = -float(state["best"])  # fit_epochs keeps `best` signed, higher is better
    progress(f"  BiasedMF: best epoch {state['best_epoch']} ({'validation' if len(va) else 'training'} RMSE "
             f"{val:.4f}; predicting the global mean {mu:.3f}: {baseline:.4f})")
    w = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    return MFResult(user_ids=user_ids, item_ids=item_ids, user_factors=w["user_factors.weight"],
                    item_factors=w["item_factors.weight"], global_mean=mu, val_rmse=val, baseline_rmse=baseline,
                    best_epoch=int(state["best_epoch"]), user_bias=w["user_bias.weight"][:, 0].copy(),
                    item_bias=w["item_bias.weight"][:, 0].copy(), validated=bool(state["validated"]),
                    train_ratings=len(tr), selection_ratings=len(va))
