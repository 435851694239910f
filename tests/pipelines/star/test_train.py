"""Training on Ray Tune: checkpoints every epoch, a crash mid-run, `Tuner.restore`, and
the same best configuration as an uninterrupted run; a sensitivity sweep's plot."""
from __future__ import annotations

import json
from pathlib import Path

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
    common = {"grid": GRID, "asha": False, "progress": lambda m: None}
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
