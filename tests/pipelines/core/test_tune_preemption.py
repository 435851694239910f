"""A sweep whose trials lose their node mid-training (a spot GPU taken back) finishes by
itself, with the best trial, config and metric, of a sweep nothing interrupted.

The node really goes. A cluster on this machine (tests/doubles/local_cluster.py): a head
with 0 CPUs, where the sweep's driver runs, and one worker node of 2 CPUs, where both
trials run. Once both trials have reported their epoch-2 checkpoint, the worker node's
raylet is killed with SIGKILL, as when a machine disappears: both trial processes go with
it, mid-way through epoch 3. A fresh worker node then joins, as an autoscaler would add
one; the GCS declares the old node dead (health checks tightened to 1 s x 3 only to make
that quick), Tune sees both trials fail and, with the trainer's default `max_failures`,
restarts them on the new node from their last checkpoint.

The lost node's disk goes with it, so the sweep keeps its experiment and checkpoints
under a URI (the suite's S3 endpoint, tests/doubles/s3.py): each restarted trial, in a
new process on another node, reads its checkpoint from there. The trainable records
where `tune.get_checkpoint()` found it, its process and its node. The reference sweep
runs on the session's one-node Ray, never interrupted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from rexeval.pipelines.core.tune import MAX_FAILURES, best_checkpoint, build_tuner, fit_epochs
from tests.doubles.local_cluster import local_cluster, wait_for

REPO = Path(__file__).resolve().parents[3]

GRID = {"lr": [0.003, 0.03]}
EPOCHS = 5
LOSE_NODE_AFTER = 2  # epochs checkpointed before each trial's node goes
COLUMNS = ["epoch", "val", "loss", "best", "best_epoch"]
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
SWEEP_TIMEOUT_S = 240


def tiny_trainable(config):
    """A two-layer regressor with dropout (so torch's global RNG matters as well as the
    sampler's) trained by the one trainer; with `lose_node`, each trial says once that its
    epoch-2 checkpoint is reported, then waits for its node to be taken away."""
    import ray
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
        return {"val": val, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "resumed_from": resumed_from}

    def after_epoch(epoch: int) -> None:
        marker = Path(config["marker_dir"]) / f"checkpointed-{config['lr']}"
        if config["lose_node"] and epoch == LOSE_NODE_AFTER and not marker.exists():
            marker.touch()  # tune.report has returned: the driver holds the epoch-2 checkpoint
            time.sleep(SWEEP_TIMEOUT_S)  # the node goes meanwhile, and this process with it

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


def drive(storage: str, marker_dir: str, result_file: str) -> None:
    """The interrupted sweep's driver, run in a process of its own joined to the cluster
    (`RAY_ADDRESS`): each trial's curve, error and the best trial, as JSON."""
    results, plan = sweep(storage, Path(marker_dir), lose_node=True)
    Path(result_file).write_text(json.dumps({
        "max_failures": plan["max_failures"], "best": list(best(results)),
        "trials": [{"lr": r.config["lr"], "error": None if r.error is None else str(r.error),
                    "rows": r.metrics_dataframe[COLUMNS + ["pid", "node", "resumed_from"]].to_dict("records")}
                   for r in results]}))


@pytest.mark.slow
def test_a_sweep_whose_trials_lose_their_node_finishes_with_the_uninterrupted_best(ray_session, s3_env, s3_root,
                                                                                 tmp_path):
    markers, result_file = tmp_path / "markers", tmp_path / "lost.json"
    markers.mkdir()
    clean, _ = sweep(tmp_path / "clean", markers, lose_node=False)
    env = {**s3_env, "PYTHONPATH": str(REPO)}  # the trainable is this module: every node imports it
    with local_cluster(head_cpus=0, worker_cpus=(2,), system_config=FAST_HEALTH_CHECKS, env=env) as cluster:
        [_, spot] = cluster.nodes
        spot_id = cluster.node_id(spot)
        driver = subprocess.Popen(
            [sys.executable, "-c", "import sys; from tests.pipelines.core.test_tune_preemption import drive; "
                                   "drive(*sys.argv[1:])", f"{s3_root}/tune", str(markers), str(result_file)],
            cwd=REPO, env={**cluster.env, "RAY_ADDRESS": cluster.gcs_address},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: len(list(markers.glob("checkpointed-*"))) == len(GRID["lr"]) or driver.poll() is not None,
                     SWEEP_TIMEOUT_S, "both trials' epoch-2 checkpoints")
            assert driver.poll() is None, "the sweep ended before its node was taken away"
            cluster.kill_raylet(spot)  # the spot node is taken back, both trials with it
            wait_for(lambda: len(cluster.alive_nodes()) == 1, 30, "the GCS to declare the spot node dead")
            cluster.add_node(2)  # another joins, as the autoscaler would add one
            output, _ = driver.communicate(timeout=SWEEP_TIMEOUT_S)
        finally:
            if driver.poll() is None:
                driver.kill()
        assert driver.returncode == 0, output[-4000:]
        new_id = cluster.node_id(cluster.nodes[-1])
    lost = json.loads(result_file.read_text())
    # Both trials lost their node and the sweep still finished, with no error.
    assert [t["error"] for t in lost["trials"]] == [None, None]
    assert lost["max_failures"] == MAX_FAILURES > 0
    by_lr = {r.config["lr"]: r for r in clean}
    for trial in lost["trials"]:
        rows = sorted(trial["rows"], key=lambda r: r["epoch"])
        # Restored, not restarted: each epoch reported once; epochs 1-2 on the spot node,
        # 3-5 by a new process on the new node that found the epoch-2 checkpoint on S3.
        assert [r["epoch"] for r in rows] == list(range(1, EPOCHS + 1))
        before, after = rows[:LOSE_NODE_AFTER], rows[LOSE_NODE_AFTER:]
        assert {r["node"] for r in before} == {spot_id} and {r["node"] for r in after} == {new_id}
        assert len({r["pid"] for r in before}) == len({r["pid"] for r in after}) == 1
        assert {r["resumed_from"] for r in before} == {""} and {r["resumed_from"] for r in after} == {"s3"}
        # Model, optimizer and both RNG states came back: the curve is the uninterrupted one.
        assert [{c: r[c] for c in COLUMNS} for r in rows] == curve(by_lr[trial["lr"]])
    assert tuple(lost["best"]) == best(clean)


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
