"""ExpScore heads: they learn known relations, persist exactly, and follow the seed's setup."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rexeval.models.expscore import (
    HEADS,
    ExpScoreModel,
    Normaliser,
    TrainSettings,
    build_net,
    l2_penalty,
    label_classes,
    train_head,
)
from tests.doubles.seeds import SEED, seeded

FACTORS = ("REL", "LEN", "POL")


def linear_data(n=400, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)) * [1.0, 5.0, 0.2] + [0.0, 10.0, 0.0]
    z = (x - x.mean(0)) / x.std(0)
    y = 3.0 + 0.6 * z[:, 0] - 0.4 * z[:, 1] + rng.normal(scale=0.05, size=n)
    return x, y


def ordinal_data(n=500, seed=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    latent = 1.5 * x[:, 0] + 0.1 * rng.normal(size=n)
    y = np.digitize(latent, [-1.5, -0.5, 0.5, 1.5]) + 1.0  # classes 1..5
    return x, y


@pytest.mark.learning
def test_linear_head_recovers_the_weights():
    x, y = linear_data(seed=seeded(1))
    model = train_head(x, y, "linear", FACTORS, TrainSettings(seed=SEED))
    w = model.weights()
    # z-scored factors: weights are the coefficients, shrunk a little by the 0.01 L2 penalty
    assert w["REL"] == pytest.approx(0.6, abs=0.02)
    assert w["LEN"] == pytest.approx(-0.4, abs=0.02)
    assert w["POL"] == pytest.approx(0.0, abs=0.02)
    assert w["bias"] == pytest.approx(3.0, abs=0.02)
    assert model.loss(x, y) < 0.01
    assert model.history["stopped"] == "no_improvement"


@pytest.mark.learning
def test_logistic_head_learns_an_ordinal_relation_and_scores_expected_class():
    x, y = ordinal_data(seed=seeded(2))
    model = train_head(x, y, "logistic", FACTORS, TrainSettings(seed=SEED))
    p = model.predict_proba(x)
    assert p.shape == (len(x), 5) and np.allclose(p.sum(1), 1)
    pred = model.predict(x)
    assert np.allclose(pred, p @ np.arange(1, 6))  # expected class value, not argmax
    assert np.corrcoef(pred, y)[0, 1] > 0.9
    assert np.mean(np.abs(pred - y) <= 0.5) > 0.7
    assert model.loss(x, y) < 1.0  # mean cross-entropy (uniform guess: log 5 = 1.61)


@pytest.mark.learning
def test_nn_head_has_6_and_3_hidden_units_and_fits():
    x, y = linear_data(n=200, seed=seeded(1))
    model = train_head(x, y, "nn", FACTORS, TrainSettings(max_epochs=1500, seed=SEED))
    assert model.n_hidden() == (6, 3)
    linears = [m for m in model.net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3, 6), (6, 3), (3, 1)]
    assert np.corrcoef(model.predict(x), y)[0, 1] > 0.97


def test_l2_is_an_explicit_penalty_on_weight_matrices_only():
    net = build_net("nn", 3)
    by_hand = sum(float((p.detach() ** 2).sum()) for n, p in net.named_parameters() if n.endswith("weight"))
    assert float(l2_penalty(net).detach()) == pytest.approx(by_hand)
    x, y = linear_data(n=200)
    # On z-scored factors z, mean squared error + l2 * |w|^2 is ridge regression:
    # w = (C + l2 I)^-1 c with C = z'z / n and c = z'(y - mean y) / n. With l2 = 1 the
    # weights about halve (0.6 -> 0.3); Adam's weight_decay would stop near 0.4 instead.
    strong = train_head(x, y, "linear", FACTORS, TrainSettings(l2=1.0))
    z = (x - x.mean(0)) / x.std(0)
    ridge = np.linalg.solve(z.T @ z / len(z) + np.eye(3), z.T @ (y - y.mean()) / len(z))
    assert [strong.weights()[f] for f in FACTORS] == pytest.approx(ridge, abs=0.003)
    assert strong.weights()["bias"] == pytest.approx(y.mean(), abs=0.01)  # the bias is not penalised
    assert strong.history["objective"] > strong.history["train_loss"]  # penalty inside the objective
    assert TrainSettings().l2 == 0.01 and TrainSettings().lr == 0.01


def test_training_is_deterministic_for_a_seed():
    x, y = linear_data(n=120)
    a = train_head(x, y, "nn", FACTORS, TrainSettings(seed=3, max_epochs=100))
    b = train_head(x, y, "nn", FACTORS, TrainSettings(seed=3, max_epochs=100))
    c = train_head(x, y, "nn", FACTORS, TrainSettings(seed=4, max_epochs=100))
    assert np.array_equal(a.predict(x), b.predict(x))
    assert not np.array_equal(a.predict(x), c.predict(x))


def test_global_rng_is_untouched():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    x, y = linear_data(n=50)
    train_head(x, y, "linear", FACTORS, TrainSettings(max_epochs=5))
    assert torch.equal(torch.rand(1), expected)


def test_max_epochs_cap():
    x, y = linear_data(n=50)
    model = train_head(x, y, "nn", FACTORS, TrainSettings(max_epochs=3))
    assert model.history["epochs"] == 3 and model.history["stopped"] == "max_epochs"


@pytest.mark.parametrize("head", HEADS)
def test_save_load_round_trip_gives_identical_predictions(tmp_path, head):
    x, y = ordinal_data(n=150)
    model = train_head(x, y, head, FACTORS, TrainSettings(max_epochs=100),
                       unavailable={"GC": "no LanguageTool"}, extra={"encoder": "fake"})
    model.save(tmp_path / head)
    meta = json.loads((tmp_path / head / "expscore.json").read_text())
    assert meta["head"] == head and meta["factors"] == list(FACTORS)
    assert meta["unavailable"] == {"GC": "no LanguageTool"}
    assert len(meta["normaliser"]["mean"]) == 3
    loaded = ExpScoreModel.load(tmp_path / head)
    assert np.array_equal(loaded.predict(x), model.predict(x))
    assert loaded.unavailable == model.unavailable and loaded.extra == {"encoder": "fake"}


def test_normaliser_z_scores_and_keeps_constant_factors_finite():
    x = np.array([[1.0, 5.0], [3.0, 5.0]])
    norm = Normaliser.fit(x)
    assert norm(x).tolist() == [[-1.0, 0.0], [1.0, 0.0]]


def test_label_classes_round_half_up_and_clip():
    assert label_classes(np.array([1.0, 2.5, 3.4, 4.6, 5.0, 0.2]), TrainSettings()).tolist() == [0, 2, 2, 4, 4, 0]


def test_bad_inputs_are_refused(tmp_path):
    x, y = linear_data(n=20)
    with pytest.raises(ValueError, match="unknown head"):
        train_head(x, y, "svm", FACTORS)
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        train_head(x, y, "linear", FACTORS[:2])
    model = train_head(x, y, "linear", FACTORS, TrainSettings(max_epochs=2))
    with pytest.raises(ValueError, match="NaN"):
        model.predict(np.full((1, 3), np.nan))
    with pytest.raises(ValueError, match="linear head"):
        train_head(x, y, "nn", FACTORS, TrainSettings(max_epochs=2)).weights()
    with pytest.raises(FileNotFoundError):
        ExpScoreModel.load(tmp_path)
