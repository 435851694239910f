"""A sweep whose trials lose their node mid-training (a spot GPU taken back) finishes by
itself, with the best trial, config and metric, of a sweep nothing interrupted.

How the node is taken away, and why this way. What a lost node does to a Tune sweep is
kill the trial's actor process without warning: Tune then sees the trial's pending
`train()` call fail with an actor-died error, exactly as Ray's own Tune tests simulate a
lost node (they `ray.kill` the trial actor). Here each trial's worker process SIGKILLs
itself right after its epoch-2 checkpoint was reported: no exception, no exit handler,
no flush, as when the machine disappears. The moment is exact, not polled: Tune's
function trainables report synchronously, so by the time `tune.report` returns, the
driver has registered the checkpoint and asked for the next epoch; the kill then lands
while that epoch is outstanding. A real multi-node cluster (kill a worker's raylet, add
a fresh node) would add only Ray's node-death detection and rescheduling, tens of
seconds and a timing window on a shared two-core machine, for the same Tune path.

What a real lost node adds is that its disk goes with it, so the sweep keeps its
experiment and checkpoints under a URI (the suite's S3 endpoint, tests/doubles/s3.py):
the restarted trial, in a new process that may be on any node, must read its
checkpoint from there. The trainable records where `tune.get_checkpoint()` found it.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from rexeval.pipelines.core.tune import MAX_FAILURES, best_checkpoint, build_tuner, fit_epochs

GRID = {"lr": [0.003, 0.03]}
EPOCHS = 5
LOSE_NODE_AFTER = 2  # epochs checkpointed before each trial's node goes
COLUMNS = ["epoch", "val", "loss", "best", "best_epoch"]


def tiny_trainable(config):
    """A two-layer regressor with dropout (so torch's global RNG matters as well as the
    sampler's) trained by the one trainer; with `lose_node`, each trial's process is
    killed once after its epoch-2 checkpoint."""
    from ray import tune

    torch.set_num_threads(1)
    data = torch.Generator().manual_seed(7)
    x = torch.randn(96, 4, generator=data)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.1 * torch.randn(96, generator=data)
    (xt, yt), (xv, yv) = (x[:64], y[:64]), (x[64:], y[64:])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    rng = torch.Generator().manual_seed(0)
    found = tune.get_checkpoint()
    resumed_from = "" if found is None else found.filesystem.type_name

    def train_epoch() -> float:
        model.train()
        order, losses = torch.randperm(len(xt), generator=rng), []
        for start in range(0, len(order), 16):
            b = order[start:start + 16]
            loss = nn.functional.mse_loss(model(xt[b]).squeeze(-1), yt[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return sum(losses) / len(losses)

    def validate() -> dict:
        model.eval()
        with torch.no_grad():
            val = float(nn.functional.mse_loss(model(xv).squeeze(-1), yv))
        return {"val": val, "pid": os.getpid(), "resumed_from": resumed_from}

    def after_epoch(epoch: int) -> None:
        marker = Path(config["marker_dir"]) / f"node-lost-{config['lr']}"
        if config["lose_node"] and epoch == LOSE_NODE_AFTER and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

    fit_epochs(model, opt, rng, epochs=EPOCHS, patience=EPOCHS, metric_key="val", mode="min",
               train_epoch=train_epoch, validate=validate, after_epoch=after_epoch)


def sweep(storage, marker_dir: Path, lose_node: bool):
    """The grid over `lr`, both trials at once, with the trainer's default failure
    settings; the results and the plan."""
    base = {"lose_node": lose_node, "marker_dir": str(marker_dir)}
    tuner, plan = build_tuner(tiny_trainable, base, storage, "sweep", metric="val", mode="min",
                              max_epochs=EPOCHS, sweepable=["lr"], grid=GRID, asha=False, cpus_per_trial=1,
                              progress=lambda m: None)
    return list(tuner.fit()), plan


def curve(result) -> list[dict]:
    return result.metrics_dataframe[COLUMNS].sort_values("epoch").to_dict("records")


def best(results) -> tuple[float, float, int]:
    """The best trial's lr, its best validation value and the epoch it came from."""
    result, _ = best_checkpoint(results, "val", mode="min")
    df = result.metrics_dataframe
    row = df.loc[df["val"].idxmin()]
    return result.config["lr"], float(row["val"]), int(row["epoch"])


@pytest.mark.slow
def test_a_sweep_whose_trials_lose_their_node_finishes_with_the_uninterrupted_best(ray_session, s3_root,
                                                                                 tmp_path):
    lost, plan = sweep(s3_root, tmp_path, lose_node=True)
    assert plan["max_failures"] == MAX_FAILURES > 0
    clean, _ = sweep(tmp_path / "clean", tmp_path, lose_node=False)
    # Both trials lost their process once and the sweep still finished, with no error.
    assert sorted(p.name for p in tmp_path.glob("node-lost-*")) == [f"node-lost-{lr}" for lr in GRID["lr"]]
    assert [r.error for r in lost] == [None, None]
    by_lr = {r.config["lr"]: r for r in clean}
    for r in lost:
        df = r.metrics_dataframe.sort_values("epoch")
        # Restored, not restarted: each epoch reported once, epochs 3-5 by a new process
        # that found the epoch-2 checkpoint on S3 (the lost node's disk is not needed).
        assert df["epoch"].tolist() == list(range(1, EPOCHS + 1))
        before, after = df[df["epoch"] <= LOSE_NODE_AFTER], df[df["epoch"] > LOSE_NODE_AFTER]
        assert before["pid"].nunique() == after["pid"].nunique() == 1
        assert set(before["pid"]).isdisjoint(after["pid"])
        assert set(before["resumed_from"]) == {""} and set(after["resumed_from"]) == {"s3"}
        # Model, optimizer and both RNG states came back: the curve is the uninterrupted one.
        assert curve(r) == curve(by_lr[r.config["lr"]])
    assert best(lost) == best(clean)


def test_max_failures_reaches_the_run_and_defaults_above_zero(ray_session, tmp_path):
    """Tune's FailureConfig takes the setting; the sweep jobs declare it with the default."""
    from rexeval.pipelines.generate.config import TrainJob as GenerateTrainJob
    from rexeval.pipelines.star.config import TrainJob as StarTrainJob

    common = {"metric": "val", "max_epochs": 1, "sweepable": [], "progress": lambda m: None}
    _, plan = build_tuner(tiny_trainable, {}, tmp_path, "a", **common)
    assert plan["max_failures"] == MAX_FAILURES >= 1
    _, plan = build_tuner(tiny_trainable, {}, tmp_path, "b", max_failures=-1, **common)
    assert plan["max_failures"] == -1
    assert StarTrainJob(data=str(tmp_path), out=str(tmp_path)).max_failures == MAX_FAILURES
    assert GenerateTrainJob(data=str(tmp_path), out=str(tmp_path)).max_failures == MAX_FAILURES
