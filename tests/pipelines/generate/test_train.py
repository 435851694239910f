"""Training a generator on Ray Tune: the one trainer's checkpoints, a crash after two
epochs and `Tuner.restore` giving the uninterrupted run's validation curve, the
refusal of other settings, learning-rate decay on plateau, and the GPU plan."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexeval.pipelines.generate.config import TrainJob
from rexeval.pipelines.generate.data import GenData, prepare
from rexeval.pipelines.generate.pipeline import run_train
from rexeval.pipelines.generate.train import build_tuner, generator_trainable, resolve_settings
from tests.doubles.planted_split import planted_split

SMALL = {"emsize": 32, "nhid": 64, "nlayers": 1, "dropout": 0.2, "batch_size": 32, "epochs": 4, "patience": 10}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_split(tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="module")
def data_dir(planted, tmp_path_factory):
    split, truth = planted
    return prepare(split, tmp_path_factory.mktemp("gen"), target="explanation", truth=str(truth), vocab_size=100,
                   max_words=None, progress=lambda m: None)


def crash_once(config):
    """The real trainable, except that it dies after epoch 2 the first time."""
    marker = Path(config["data_path"]) / "crashed.marker"

    def hook(epoch: int) -> None:
        if epoch == 2 and not marker.exists():
            marker.touch()
            raise RuntimeError("simulated crash")

    generator_trainable(config, after_epoch=hook)


def _curve(results) -> list[float]:
    (r,) = list(results)
    return r.metrics_dataframe["val_loss"].round(8).tolist()


@pytest.mark.slow
def test_a_crashed_run_restores_and_its_curve_equals_an_uninterrupted_one(ray_session, data_dir, tmp_path):
    s = resolve_settings("peter", {**SMALL, "lr": 0.5})
    # No automatic retries (max_failures=0): the crash ends the run, as when they are used up.
    common = {"asha": False, "progress": lambda m: None, "cpus_per_trial": 1, "max_failures": 0}
    first, _ = build_tuner(s, data_dir, tmp_path / "a", "exp", trainable=crash_once, **common)
    res = first.fit()
    assert res[0].error is not None and res[0].metrics_dataframe["epoch"].max() == 2
    again, plan = build_tuner(s, data_dir, tmp_path / "a", "exp", trainable=crash_once, **common)
    assert plan["restored"]
    restored = again.fit()
    assert restored[0].error is None
    clean, _ = build_tuner(s, data_dir, tmp_path / "b", "exp", **common)
    clean = clean.fit()
    # Model, optimizer (its decayed learning rate included) and sampler state came back
    # from the epoch-2 checkpoint, so epochs 3-4 are the uninterrupted run's.
    assert restored[0].metrics_dataframe["epoch"].tolist()[-2:] == [3, 4]
    assert _curve(restored)[-4:] == _curve(clean)
    with pytest.raises(FileExistsError, match="other settings"):
        build_tuner(resolve_settings("peter", {**SMALL, "lr": 0.25}), data_dir, tmp_path / "a", "exp", **common)


def test_settings_are_the_papers_defaults_with_overrides_and_unknown_ones_are_refused():
    s = resolve_settings("peter", {"emsize": 64})
    assert s["emsize"] == 64 and s["nhead"] == 2 and s["lr"] == 1.0 and s["epochs"] == 100
    with pytest.raises(ValueError, match="unknown peter setting"):
        resolve_settings("peter", {"hidden": 3})
    with pytest.raises(ValueError, match="select"):
        resolve_settings("nrt", {"select": "bleu"})


@pytest.mark.parametrize("gpus", [0, 1])
def test_gpu_trials_are_the_same_plan_with_a_gpu(ray_session, data_dir, tmp_path, gpus):
    """What a GPU cluster would run, checked on CPU."""
    s = resolve_settings("cer", SMALL)
    _, plan = build_tuner(s, data_dir, tmp_path, "exp", grid={"lr": [1.0, 0.5]}, gpus_per_trial=gpus,
                          cpus_per_trial=2, progress=lambda m: None)
    assert plan["resources"] == {"cpu": 2, "gpu": gpus}
    assert plan["device"] == ("cuda" if gpus else "cpu") and plan["threads"] == 2
    assert plan["mode"] == "min" and plan["space"]["lr"] == {"grid_search": [1.0, 0.5]}
    assert plan["space"]["model"] == "cer"


@pytest.mark.slow
def test_run_train_keeps_the_best_epoch_and_refuses_a_data_setting_grid(ray_session, planted, tmp_path):
    split, truth = planted
    job = TrainJob(data=str(split), truth=str(truth), model="peter", out=str(tmp_path / "run"),
                   settings={**SMALL, "epochs": 3, "lr": 0.5, "select": "loss"})
    report = run_train(job, progress=lambda m: None)
    best = report["best"]
    saved = json.loads((tmp_path / "run" / "train.json").read_text())
    assert saved["best"] == best and (tmp_path / "run" / "best" / "state.pt").exists()
    # The best epoch is the one with the lowest validation loss of the trial.
    trial = report["trials"][0]
    assert best["val_loss"] == pytest.approx(trial["best_val_loss"])
    assert 1 <= best["epoch"] <= 3 and best["val_ppl"] > 1
    data = GenData.load(tmp_path / "run" / "data")
    assert report["settings"]["max_words"] == data.max_words
    with pytest.raises(ValueError, match="cannot search 'vocab_size'"):
        run_train(TrainJob(data=str(split), truth=str(truth), out=str(tmp_path / "x"), grid={"vocab_size": [5, 6]}))


def scripted_validation(config):
    """The real trainable with its validation values scripted (the plateaus are known)."""
    import rexeval.pipelines.generate.train as T

    values = iter(config["script"])
    T.validate = lambda *a, **k: {"val_loss": next(values), "val_ppl": 2.0, "val_text_rating": 1.0}
    T.generator_trainable({k: v for k, v in config.items() if k != "script"})


@pytest.mark.slow
def test_a_plateau_multiplies_the_learning_rate_by_a_quarter_once_per_stale_epoch(ray_session, data_dir, tmp_path):
    """PETER's schedule: lr x 0.25 after every epoch that does not beat the best so far,
    never after one that does; each epoch reports the rate it trained with."""
    script = [3.0, 2.0, 2.5, 2.0, 1.0, 1.5, 0.5]  # stale: epochs 3, 4 (ties do not improve), 6
    s = resolve_settings("peter", {**SMALL, "epochs": len(script), "patience": 99, "select": "loss"})
    tuner, _ = build_tuner({**s, "script": script}, data_dir, tmp_path, "exp", trainable=scripted_validation,
                           asha=False, progress=lambda m: None, cpus_per_trial=1)
    (r,) = list(tuner.fit())
    assert r.error is None
    lrs = r.metrics_dataframe.sort_values("epoch")["lr"].tolist()
    assert lrs == [1.0, 1.0, 1.0, 0.25, 0.0625, 0.0625, 0.015625]


def test_presets_set_every_value_and_settings_override_them():
    paper, seed = resolve_settings("pepler", {}), resolve_settings("pepler", {"lr": 5e-4}, "seed000")
    assert paper["preset"] == "paper" and paper["sequential"] and paper["batch_size"] == 128
    assert seed["preset"] == "seed000" and not seed["sequential"] and seed["rating_head"] == "mlp"
    assert seed["batch_size"] == 32 and seed["max_words"] == 128 and seed["lr"] == 5e-4
    assert resolve_settings("peter", {})["select"] == "text_rating"
    with pytest.raises(ValueError, match="unknown preset"):
        resolve_settings("peter", {}, "seed001")
