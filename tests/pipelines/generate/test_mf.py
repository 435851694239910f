"""BiasedMF as a Tune trial: on planted ratings it beats the global mean, its factors line
up with the ids, a second call restores the finished experiment instead of training,
and without a validation split a seeded tenth of the training rows is held out."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rexeval.pipelines.generate.prompted.mf import (DEFAULTS, KEYS, hold_out, resolve_settings, train_biased_mf,
                                                    write_arrays)
from tests.models.recommenders.test_biased_mf import planted_ratings

SMALL = {"mf_dim": 8, "mf_lr": 0.05, "mf_batch_size": 64, "mf_epochs": 15, "mf_patience": 15}


def _frames(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = planted_ratings(n_users=30, n_items=20, density=0.5, seed=seed)
    df = pd.DataFrame({"user_id": [f"u{u:02d}" for u in p["user"]], "item_id": [f"i{i:02d}" for i in p["item"]],
                       "rating": p["rating"]})
    held = np.random.default_rng(seed + 1).random(len(df)) < 0.2
    return df[~held].reset_index(drop=True), df[held].reset_index(drop=True)


def _checkpoints(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("checkpoint_*") if p.is_dir())


@pytest.mark.slow
def test_train_then_restore(ray_session, tmp_path) -> None:
    train, valid = _frames()
    first_lines: list[str] = []
    res = train_biased_mf(train, valid, tmp_path, SMALL, progress=first_lines.append)
    assert res.user_ids == sorted(set(train.user_id) | set(valid.user_id))
    assert res.item_ids == sorted(set(train.item_id) | set(valid.item_id))
    assert res.user_factors.shape == (len(res.user_ids), 8) and res.user_factors.dtype == np.float32
    assert res.item_factors.shape == (len(res.item_ids), 8) and res.item_factors.dtype == np.float32
    assert res.user_bias.shape == (len(res.user_ids),) and res.validated
    assert res.global_mean == pytest.approx(train.rating.mean(), abs=1e-5)
    assert res.baseline_rmse == pytest.approx(np.sqrt(np.mean((valid.rating - res.global_mean) ** 2)))
    assert res.val_rmse < res.baseline_rmse and 1 <= res.best_epoch <= 15
    assert not any("restoring" in line for line in first_lines)
    # Users of the same planted group are each other's nearest (even/odd index).
    near = res.similar_users("u00", 3)
    assert [int(u[1:]) % 2 for u, _ in near] == [0, 0, 0] and "u00" not in dict(near)
    assert res.similar_items("i01", 5, candidates=["i00", "i03"])[0][0] == "i03"
    assert res.user_index()["u00"] == 0 and res.item_index()[res.item_ids[-1]] == len(res.item_ids) - 1

    before = _checkpoints(tmp_path)
    lines: list[str] = []
    again = train_biased_mf(train, valid, tmp_path, SMALL, progress=lines.append)
    assert any("restoring the Tune experiment" in line for line in lines)
    assert _checkpoints(tmp_path) == before  # nothing trained again
    for name in ("user_factors", "item_factors", "user_bias", "item_bias"):
        np.testing.assert_array_equal(getattr(again, name), getattr(res, name))
    assert (again.user_ids, again.item_ids, again.global_mean, again.val_rmse, again.baseline_rmse,
            again.best_epoch) == (res.user_ids, res.item_ids, res.global_mean, res.val_rmse, res.baseline_rmse,
                                  res.best_epoch)
    assert len(list(tmp_path.glob("biased_mf-data-*.npz"))) == 1  # the data file was reused
    with pytest.raises(FileExistsError, match="other settings"):
        train_biased_mf(train, valid, tmp_path, {**SMALL, "mf_reg": 0.1}, progress=lines.append)


@pytest.mark.slow
def test_without_a_validation_split_rows_are_held_out(ray_session, tmp_path) -> None:
    train, _ = _frames(seed=2)
    lines: list[str] = []
    res = train_biased_mf(train, None, tmp_path, {**SMALL, "mf_epochs": 5}, progress=lines.append)
    n_out = round(0.1 * len(train))
    assert any(f"holding out {n_out} of {len(train)}" in line for line in lines)
    rest, out = hold_out(train, 0)
    assert len(out) == n_out and len(rest) + len(out) == len(train)
    assert res.global_mean == pytest.approx(rest.rating.mean(), abs=1e-5)
    assert res.validated and res.val_rmse < res.baseline_rmse


def test_hold_out_settings_and_the_data_file(tmp_path) -> None:
    train, _ = _frames()
    rest, out = hold_out(train, 3)
    again = hold_out(train, 3)
    pd.testing.assert_frame_equal(out, again[1])
    assert not pd.merge(rest, out, how="inner").shape[0]  # planted rows are distinct
    small = train.iloc[:19]
    kept, none = hold_out(small, 3)
    assert len(kept) == 19 and len(none) == 0
    assert resolve_settings(None) == DEFAULTS and set(DEFAULTS) == set(KEYS)
    with pytest.raises(ValueError, match="unknown"):
        resolve_settings({"lr": 0.1})
    arrays = {"a": np.arange(3), "b": np.ones(2, np.float32)}
    path = write_arrays(arrays, tmp_path)
    assert write_arrays({"b": np.ones(2, np.float32), "a": np.arange(3)}, tmp_path) == path
    assert write_arrays({**arrays, "a": np.arange(4)}, tmp_path) != path
    assert not list(tmp_path.glob(".*.tmp"))
    with np.load(path) as z:
        np.testing.assert_array_equal(z["a"], arrays["a"])
