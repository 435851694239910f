"""Training on Ray Tune: checkpoints every epoch, a crash mid-run, `Tuner.restore`, and
the same best configuration as an uninterrupted run; a sensitivity sweep's plot; several
seeds as trials, one run each."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.star.pipeline import evaluate_checkpoint, run_train
from rexeval.pipelines.star.config import EvalSettings, TrainJob
from rexeval.pipelines.star.train import TrainSettings, run_tune, star_trainable
from tests.doubles.planted_star import planted_star

pytestmark = pytest.mark.slow

SETTINGS = {"model": "expgcn", "epochs": 4, "dim": 16, "layers_us": 1, "layers_is": 1, "layers_ui": 1,
            "batch_size": 128, "patience": 10}
GRID = {"lr": [0.05, 0.002]}


def crash_once(config):
    """The real trainable, except that the lr=0.05 trial dies after epoch 2 the first time."""
    marker = Path(config["data_path"]) / "crashed.marker"

    def hook(epoch: int) -> None:
        if config["lr"] == 0.05 and epoch == 2 and not marker.exists():
            marker.touch()
            raise RuntimeError("simulated crash")

    star_trainable(config, after_epoch=hook)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return planted_star(seed=0).save(tmp_path_factory.mktemp("star") / "bench")


def _curve(result) -> list[float]:
    return result.metrics_dataframe["val_ndcg@10"].round(10).tolist()


def test_interrupted_tune_run_restores_to_the_same_best(ray_session, data_dir, tmp_path):
    settings = TrainSettings(**SETTINGS)
    # No automatic retries (max_failures=0): the crash ends the run, as when they are used up.
    common = {"grid": GRID, "asha": False, "progress": lambda m: None, "max_failures": 0}
    first = run_tune(settings, data_dir, tmp_path / "a", "exp", trainable=crash_once, **common)
    errored = [r for r in first if r.error is not None]
    assert len(errored) == 1 and errored[0].config["lr"] == 0.05
    assert errored[0].metrics_dataframe["epoch"].max() == 2  # two epochs reported before the crash
    restored = run_tune(settings, data_dir, tmp_path / "a", "exp", trainable=crash_once, **common)
    assert all(r.error is None for r in restored)
    clean = run_tune(settings, data_dir, tmp_path / "b", "exp", **common)

    def by_lr(results):
        return {r.config["lr"]: r for r in results}

    a, b = by_lr(restored), by_lr(clean)
    # The restored trial went on from its epoch-2 checkpoint (model, optimizer and sampler
    # state), so its whole validation curve equals the uninterrupted one.
    assert a[0.05].metrics_dataframe["epoch"].tolist()[-2:] == [3, 4]
    assert _curve(a[0.05])[-4:] == _curve(b[0.05])
    best_a = max(a.values(), key=lambda r: r.metrics_dataframe["val_ndcg@10"].max())
    best_b = max(b.values(), key=lambda r: r.metrics_dataframe["val_ndcg@10"].max())
    assert best_a.config["lr"] == best_b.config["lr"]
    # Other settings into the same experiment folder are refused, not silently restored.
    with pytest.raises(FileExistsError, match="other settings"):
        run_tune(TrainSettings(**{**SETTINGS, "epochs": 5}), data_dir, tmp_path / "a", "exp", **common)


def test_run_train_evaluates_the_best_checkpoint_and_plots_a_sweep(ray_session, data_dir, tmp_path):
    job = TrainJob(data=str(data_dir), out=str(tmp_path), settings={**SETTINGS, "model": "bper+", "epochs": 3},
                   grid={"mu": [0.0, 1.0]}, sweep="mu")
    report = run_train(job, progress=lambda m: None)  # features: the local profile's MiniLM
    assert {r["mu"] for r in report["trials"]} == {0.0, 1.0}
    assert [row["mu"] for row in report["sensitivity"]] == [0.0, 1.0]
    # mu = 1 uses the user side only: the planted user habits win at item level.
    item = {row["mu"]: row["item_ndcg"] for row in report["sensitivity"]}
    assert item[1.0] > item[0.0]
    assert (tmp_path / "sensitivity-bperplus-sweep-mu.png").stat().st_size > 0
    summary = json.loads((tmp_path / "results" / "BPER+" / "summary.json").read_text())
    assert set(summary["levels"]) == {"global", "item"}
    assert summary["settings"]["mu"] == report["best"]["config"]["mu"]
    # The checkpoint remembers its statement features: re-evaluation needs no --features.
    again = evaluate_checkpoint(EvalSettings(data=str(data_dir), out=str(tmp_path / "re")),
                                report["best"]["checkpoint"], "BPER+")
    assert again["item"]["ndcg@10"] == pytest.approx(summary["levels"]["item"]["ndcg@10"])


@pytest.mark.parametrize("gpus", [0, 1])
def test_gpu_trials_are_the_same_plan_with_a_gpu(ray_session, data_dir, tmp_path, gpus):
    """What a GPU cluster would run, checked on CPU: the trainable asks Tune for a GPU and
    trains on cuda; everything else (space, scheduler) is the CPU plan."""
    from rexeval.pipelines.star.train import build_tuner

    _, plan = build_tuner(TrainSettings(**SETTINGS), data_dir, tmp_path, "exp", grid=GRID,
                              gpus_per_trial=gpus, cpus_per_trial=2, progress=lambda m: None)
    assert plan["resources"] == {"cpu": 2, "gpu": gpus}
    assert plan["device"] == ("cuda" if gpus else "cpu") and plan["threads"] == 2
    assert plan["scheduler"] == "AsyncHyperBandScheduler" and not plan["restored"]
    assert plan["space"]["model"] == "expgcn" and plan["space"]["lr"] == {"grid_search": GRID["lr"]}


def _progress(trial: dict) -> pd.DataFrame:
    return pd.read_csv(Path(trial["path"]) / "progress.csv")[["epoch", "loss", "val_ndcg@10"]]


def test_seeds_are_trials_one_run_each_mean_and_resume(ray_session, data_dir, tmp_path):
    """--seeds 2 with a 2-value sweep: 4 trials (configurations x seeds), each seed's best
    checkpoint is a run evaluated on test, sweep points are means over the seeds; the same
    seed trained alone gives the same run; running again trains nothing new."""
    settings = {**SETTINGS, "epochs": 2}
    job = TrainJob(data=str(data_dir), out=str(tmp_path / "multi"), settings=settings, grid={"layers": [1, 2]},
                   sweep="layers", seeds=2)
    report = run_train(job, progress=lambda m: None)
    assert report["seeds"] == [0, 1]
    assert sorted((t["layers"], t["seed"]) for t in report["trials"]) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert [r["seed"] for r in report["runs"]] == [0, 1]
    rows = pq.read_table(tmp_path / "multi" / "results" / "EXPGCN" / "per_interaction.parquet").to_pandas()
    assert sorted(rows["run"].unique()) == [0, 1]
    glob = {seed: g[g.level == "global"].sort_values("interaction") for seed, g in rows.groupby("run")}
    for r in report["runs"]:  # each run's test summary is the mean of its own rows
        assert r["test"]["global"]["ndcg@10"] == pytest.approx(glob[r["seed"]]["ndcg@10"].mean())
    assert report["test"]["global"]["ndcg@10"] == pytest.approx(
        (glob[0]["ndcg@10"].mean() + glob[1]["ndcg@10"].mean()) / 2)
    summary = json.loads((tmp_path / "multi" / "results" / "EXPGCN" / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and [r["run"] for r in summary["runs"]] == [0, 1]
    # The seed changes the run: same configuration, other initial weights and negatives.
    curves = {(t["layers"], t["seed"]): _progress(t) for t in report["trials"]}
    assert not curves[(1, 0)]["loss"].equals(curves[(1, 1)]["loss"])
    # Sweep points: per value, the mean over the two seeds with their spread.
    assert [p["layers"] for p in report["sensitivity"]] == [1, 2]
    assert all(p["runs"] == 2 and p["global_ndcg_min"] <= p["global_ndcg"] <= p["global_ndcg_max"]
               for p in report["sensitivity"])
    assert (tmp_path / "multi" / "sensitivity-expgcn-sweep-layers.png").stat().st_size > 0

    # The same seed trained alone (its run's best configuration, seed 1) reproduces the run.
    best1 = report["runs"][1]["best"]
    alone = TrainJob(data=str(data_dir), out=str(tmp_path / "alone"), asha=False,
                     settings={**settings, "seed": 1, "layers": best1["config"]["layers"]})
    single = run_train(alone, progress=lambda m: None)
    assert "runs" not in single and "seeds" not in single  # one run: the usual layout
    one = pq.read_table(tmp_path / "alone" / "results" / "EXPGCN" / "per_interaction.parquet").to_pandas()
    assert "run" not in one.columns
    one = one[one.level == "global"].sort_values("interaction")
    assert np.array_equal(one["ndcg@10"].to_numpy(), glob[1]["ndcg@10"].to_numpy(), equal_nan=True)
    assert single["best"]["epoch"] == best1["epoch"]

    # Running the same command again restores the finished experiment: nothing new trains.
    again = run_train(job, progress=lambda m: None)
    for t in again["trials"]:
        assert _progress(t).equals(curves[(t["layers"], t["seed"])])
    assert [r["test"] for r in again["runs"]] == [r["test"] for r in report["runs"]]
