"""The one trainer: every trained model of rexeval is a Ray Tune trial run by this module.

A capability brings its model, its optimizer, one epoch of training and one validation
number; `fit_epochs` does the rest the same way for all of them: a checkpoint after every
epoch holding the model, the optimizer, the sampler's RNG state, torch's global RNG
state (dropout draws from it) and the early-stopping state (so a trial restored after a crash continues exactly where it stopped and its
curve equals an uninterrupted run's), a Tune report per epoch, and early stopping after
`patience` epochs without a better validation value (higher or lower is better, as the
capability says: NDCG for the rankers, validation loss for the explanation generators).

`build_tuner` makes the experiment around a trainable: the param space (a grid over
declared settings), ASHA or FIFO scheduling, trial resources (`gpus_per_trial` trains on
"cuda"; the plan is inspectable on a CPU machine), `Tuner.restore` of an experiment
folder that holds the same settings, and refusal of one that holds other settings.
A trial that fails (its node lost, a spot GPU taken back, a crash) is retried up to
`max_failures` times from its last checkpoint, in the same run, on whatever node has
room; with the experiment under a URI, that checkpoint is reachable from every node.
`best_checkpoint` and `trial_table` read the results; `fit_one` runs a single fixed
trial to its best state, and `minibatch_epoch` is the plain epoch of optimizer steps.
Used by `rexeval star train` (`pipelines/star/train.py`), `rexeval generate train`
(`pipelines/generate/train.py`) and the collaborative backbones (`generate/collab.py`,
`generate/prompted/mf.py`).
"""
from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rexeval.storage import location

if TYPE_CHECKING:  # torch is imported where it runs: the CLI and study plans import this module
    import torch

STATE_FILE = "state.pt"
MAX_FAILURES = 3
"""Retries of a failed trial from its last checkpoint (Tune's FailureConfig): enough for
a few spot preemptions in one sweep; -1 retries without limit."""


def fit_epochs(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rng: torch.Generator, *,
               epochs: int, patience: int, metric_key: str, train_epoch: Callable[[], float],
               validate: Callable[[], float | dict[str, float]], extra_state: dict[str, Any] | None = None,
               after_epoch: Callable[[int], None] | None = None, mode: str = "max",
               on_stale: Callable[[], None] | None = None, phases: int = 1,
               next_phase: Callable[[int], torch.optim.Optimizer] | None = None) -> None:
    """Train one Tune trial for up to `epochs` epochs (see the module docstring).

    `train_epoch()` runs one epoch (drawing its randomness from `rng`) and returns its
    mean loss; `validate()` returns the validation value reported as `metric_key` (NaN
    counts as the worst), or a dict of values reported together, `metric_key` among
    them. `mode` says whether higher ("max") or lower ("min", a loss or perplexity) is
    better. `on_stale()` runs after an epoch that did not improve, before its checkpoint
    (a learning-rate decay on plateau, as PETER's training does: the optimizer's state,
    learning rate included, is in the checkpoint). `extra_state` is saved in every
    checkpoint beside the training state (settings the model is rebuilt from).
    `after_epoch(epoch)` runs after each checkpoint (tests use it to crash a trial).

    `phases` > 1 trains in phases (PEPLER: prompt vectors only, then everything): when a
    phase runs out of patience or reaches `epochs` epochs, the trainable parameters of its
    best epoch are put back (they are kept in memory and in the checkpoints while a next
    phase is pending: only the phase's trainable ones, so a frozen backbone is not
    copied), `next_phase(k)` makes phase k's parameters trainable and returns its
    optimizer, and training goes on with patience counted afresh; the best value is kept
    across phases, so a later phase must beat the earlier ones. Each phase runs at most
    `epochs` epochs.
    """
    import torch
    from ray import tune

    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    sign = 1.0 if mode == "max" else -1.0
    if phases > 1 and next_phase is None:
        raise ValueError("phases > 1 needs next_phase")
    start, best, best_epoch, stale = 0, -math.inf, 0, 0
    phase, phase_epoch, phase_best = 0, 0, None
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(Path(d) / STATE_FILE, weights_only=False)
        phase, phase_epoch, phase_best = state.get("phase", 0), state.get("phase_epoch", 0), state.get("phase_best")
        if phase > 0:
            optimizer = next_phase(phase)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.set_state(state["rng"])
        if "torch_rng" in state:  # dropout and other draws from torch's global generator
            torch.set_rng_state(state["torch_rng"])
            if state.get("cuda_rng") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(state["cuda_rng"])
        start, best, best_epoch, stale = state["epoch"], state["best"], state["best_epoch"], state["stale"]
    for epoch in range(start + 1, epochs * phases + 1):
        t = time.time()
        phase_epoch += 1
        loss = train_epoch()
        got = validate()
        values = dict(got) if isinstance(got, dict) else {metric_key: got}
        val = values.get(metric_key)
        # `best` is kept signed (higher is better) so checkpoints of either mode compare alike.
        val = -math.inf if val is None or math.isnan(val) else sign * float(val)
        values[metric_key] = sign * val
        if val > best:
            best, best_epoch, stale = val, epoch, 0
            if phase < phases - 1:
                phase_best = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
        else:
            stale += 1
            if on_stale is not None:
                on_stale()
        values["phase"] = phase
        if phase < phases - 1 and (stale >= patience or phase_epoch >= epochs):
            if phase_best is not None:  # the phase's best epoch is where the next one starts
                params = dict(model.named_parameters())
                with torch.no_grad():
                    for k, v in phase_best.items():
                        params[k].copy_(v)
            phase, phase_epoch, phase_best, stale = phase + 1, 0, None, 0
            optimizer = next_phase(phase)
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.get_state(),
                        "torch_rng": torch.get_rng_state(),
                        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                        "epoch": epoch, "best": best, "best_epoch": best_epoch, "stale": stale,
                        "phase": phase, "phase_epoch": phase_epoch, "phase_best": phase_best,
                        **(extra_state or {})}, Path(d) / STATE_FILE)
            tune.report({"epoch": epoch, "loss": loss, **values, "best": sign * best,
                         "best_epoch": best_epoch, "epoch_s": time.time() - t},
                        checkpoint=tune.Checkpoint.from_directory(d))
        if after_epoch is not None:
            after_epoch(epoch)
        if stale >= patience or (phase == phases - 1 and phase_epoch >= epochs):
            break


def minibatch_epoch(optimizer: torch.optim.Optimizer, n_rows: int, batch_size: int,
                    loss_of: Callable[[slice], torch.Tensor]) -> float:
    """One epoch of optimizer steps over rows 0..n_rows in batches of `batch_size` (the
    caller has shuffled them): `loss_of(rows)` is a batch's loss; the mean batch loss."""
    total, n = 0.0, 0
    for start in range(0, n_rows, batch_size):
        loss = loss_of(slice(start, start + batch_size))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total, n = total + float(loss.detach()), n + 1
    return total / max(1, n)


def fit_one(trainable: Callable, base: dict[str, Any], storage: str | Path, name: str, *, metric: str, mode: str,
            max_epochs: int, cpus: float = 1, gpus: float = 0, progress: Callable[[str], None] = print) -> dict:
    """Train (or restore) one trial of a model whose settings are fixed (no sweep, no
    ASHA: the collaborative backbones that a job trains on the way), and return the state
    of its best epoch's checkpoint (`read_checkpoint`)."""
    tuner, _ = build_tuner(trainable, base, storage, name, metric=metric, mode=mode, max_epochs=max_epochs,
                           sweepable=(), asha=False, cpus_per_trial=cpus, gpus_per_trial=gpus, progress=progress)
    _, ck = best_checkpoint(tuner.fit(), metric, mode=mode)
    with ck.as_directory() as d:
        return read_checkpoint(d)


def read_checkpoint(checkpoint_dir: str | Path, device: str = "cpu") -> dict:
    """The state `fit_epochs` saved in an epoch checkpoint (weights, epoch, extra state)."""
    import torch

    return torch.load(Path(checkpoint_dir) / STATE_FILE, weights_only=False, map_location=device)


def progress_callback(progress: Callable[[str], None], metric: str, every_s: float = 5.0):
    """A Tune callback printing one short line per trial result, at most every few
    seconds (Tune's own tables are turned off)."""
    from ray.tune import Callback

    class Printer(Callback):
        def __init__(self):
            self.last = 0.0

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if time.time() - self.last < every_s:
                return
            self.last = time.time()
            progress(f"  trial {trial.trial_id}: epoch {result.get('epoch')}, loss "
                     f"{result.get('loss', float('nan')):.4f}, {metric} {result.get(metric, float('nan')):.4f}"
                     f" (best {result.get('best', float('nan')):.4f})")

        def on_trial_recover(self, iteration, trials, trial, **info):
            progress(f"  trial {trial.trial_id} failed (failure {trial.num_failures}; its node lost, or "
                     "an error): it is retried from its last checkpoint")

        def on_trial_error(self, iteration, trials, trial, **info):
            progress(f"  trial {trial.trial_id} failed after {trial.num_failures} tries; it resumes from its "
                     "last checkpoint when the same command is run again")

    return Printer()


def build_tuner(trainable: Callable, base: dict[str, Any], storage: str | Path, name: str, *, metric: str,
                max_epochs: int, sweepable: Collection[str], grid: dict[str, list] | None = None,
                mode: str = "max",
                num_samples: int = 1, asha: bool = True, grace_period: int = 5, cpus_per_trial: float = 1,
                gpus_per_trial: float = 0, max_concurrent: int | None = None,
                max_failures: int = MAX_FAILURES, progress: Callable[[str], None] = print):
    """The Tuner of `<storage>/<name>` (a new one, or the saved one restored) and the plan
    it runs: trial resources, the device trials train on, scheduler and param space. The
    plan is what a GPU cluster would run, so it can be checked on a CPU machine.

    `base` is the trials' config (every setting); `grid` sweeps some of the `sweepable`
    ones; each trial also gets "threads" (its CPUs) and "device" ("cuda" with a GPU).
    `mode` says whether a higher or lower `metric` is better (as in `fit_epochs`).
    `max_failures`: how often Tune retries a failed trial from its last checkpoint
    (-1: always). A restored experiment keeps the value it was created with (Tune
    restores its run settings and trials as saved), so the plan then says None.
    """
    import os

    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from rexeval.pipelines.core.io import config_hash, write_json_atomic

    # Tune warns when it snapshots often; with a checkpoint per short epoch that is by design.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Our callback prints progress; the legacy reporter at verbose=0 prints nothing else.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # A local folder or a URI (s3://, gs://): Tune keeps its experiment state and the
    # trials' checkpoints there, so a trial on any node, and a restore from any node,
    # finds them. The filesystem is the storage module's (credentials and endpoint from
    # the environment), handed to Tune with the path inside it.
    storage = location(storage)
    path = storage / name
    tune_fs = {} if storage.is_local else {"storage_filesystem": storage.fs}
    tune_path = str(path) if storage.is_local else path.path
    base = {**base, "threads": max(1, int(cpus_per_trial)), "device": "cuda" if gpus_per_trial else "cpu"}
    space = dict(base)
    for key, values in (grid or {}).items():
        if key not in sweepable:
            raise ValueError(f"cannot sweep {key!r}: not a training setting ({', '.join(sweepable)})")
        space[key] = tune.grid_search(list(values))
    resources = {"cpu": cpus_per_trial, "gpu": gpus_per_trial}
    fn = tune.with_resources(trainable, resources)
    grace_period = max(1, min(grace_period, max_epochs))
    scheduler = (ASHAScheduler(time_attr="epoch", max_t=max_epochs, grace_period=grace_period,
                               reduction_factor=3) if asha else FIFOScheduler())
    plan = {"resources": resources, "device": base["device"], "threads": base["threads"],
            "scheduler": type(scheduler).__name__, "mode": mode, "space": space, "path": str(path),
            "max_failures": max_failures}
    stamp = storage / f"{name}.rexeval.json"
    want = config_hash({"space": {k: v for k, v in base.items() if k not in ("threads", "device")},
                        "grid": grid or {}, "num_samples": num_samples, "asha": asha,
                        "grace_period": grace_period})
    if stamp.exists() and stamp.read_json().get("config_hash") != want:
        raise FileExistsError(f"{path} holds a Tune experiment with other settings; use another --out "
                              f"folder or delete {path} and {stamp}")
    if tune.Tuner.can_restore(tune_path, **tune_fs):
        progress(f"  restoring the Tune experiment in {path} (finished trials are kept)")
        plan["restored"] = True
        plan["max_failures"] = None  # the experiment's own: Tune restores its trials as they were made
        return tune.Tuner.restore(tune_path, trainable=fn, resume_errored=True, param_space=space, **tune_fs), plan
    run_config = tune.RunConfig(
        name=name, storage_path=str(storage) if storage.is_local else storage.path, verbose=0, **tune_fs,
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute=metric,
                                                checkpoint_score_order=mode),
        failure_config=tune.FailureConfig(max_failures=max_failures),
        callbacks=[progress_callback(progress, metric)])
    storage.mkdir()
    write_json_atomic(stamp, json.loads(json.dumps({"config_hash": want, "grid": grid or {}, "settings": base},
                                                   default=str)))
    plan["restored"] = False
    tuner = tune.Tuner(fn, param_space=space, run_config=run_config,
                       tune_config=tune.TuneConfig(metric=metric, mode=mode, scheduler=scheduler,
                                                   num_samples=num_samples,
                                                   max_concurrent_trials=max_concurrent))
    return tuner, plan


def best_checkpoint(results, metric: str, mode: str = "max"):
    """(Result, Checkpoint) with the best validation metric over all trials and epochs."""
    best = None
    for r in results:
        if r.metrics_dataframe is None or metric not in r.metrics_dataframe:
            continue
        ck = r.get_best_checkpoint(metric, mode) if r.best_checkpoints else None
        if ck is None:
            continue
        score = r.metrics_dataframe[metric].max() if mode == "max" else -r.metrics_dataframe[metric].min()
        if best is None or score > best[0]:
            best = (score, r, ck)
    if best is None:
        raise RuntimeError("no trial reported a checkpoint; see the trial errors above")
    return best[1], best[2]


def trial_table(results, metric: str, keys: list[str], mode: str = "max") -> list[dict]:
    """One row per trial: its varied settings, best validation value, epochs run, status."""
    rows = []
    for r in results:
        df = r.metrics_dataframe
        rows.append({**{k: r.config.get(k) for k in keys},
                     "best_" + metric: None if df is None or metric not in df
                     else float(df[metric].max() if mode == "max" else df[metric].min()),
                     "epochs": None if df is None or "epoch" not in df else int(df["epoch"].max()),
                     "error": None if r.error is None else type(r.error).__name__,
                     "path": r.path})
    return rows
