"""The one trainer's phases (`fit_epochs(phases=2, next_phase=...)`) in real Tune runs, on
a toy model of two parameters `a` and `b` (phase 0 trains `a`, phase 1 both) whose
validation values are scripted, so every switch can be worked out by hand: a phase ends
after `patience` stale epochs or after `epochs` epochs, the next starts from the best
epoch's trainable parameters, and a trial restored after crashes (one in each phase)
gives the uninterrupted run's curve."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rexeval.pipelines.core.tune import build_tuner, fit_epochs

# mode "min". epochs 5, patience 2: e1 5 (best), e2 3 (best), e3 4, e4 4.5 -> two stale epochs
# end phase 0 after 4 of its 5 epochs; phase 1 must beat 3: e5 3.5 (stale), e6 2 (best),
# e7 2.5, e8 2.6 -> two stale epochs stop the trial.
BY_PATIENCE = {"epochs": 5, "patience": 2, "script": [5.0, 3.0, 4.0, 4.5, 3.5, 2.0, 2.5, 2.6, 9.0, 9.0, 9.0]}
# epochs 3, patience 10: phase 0 ends at its epoch cap (e3, best e2), phase 1 at its cap (e6).
BY_EPOCHS = {"epochs": 3, "patience": 10, "script": [5.0, 3.0, 4.0, 2.0, 1.0, 0.5, 9.0, 9.0]}
COLUMNS = ["epoch", "phase", "val", "loss", "a", "b", "a_start", "b_start", "best", "best_epoch"]


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.0))
        self.b = nn.Parameter(torch.tensor(0.0))
        self.register_buffer("done", torch.tensor(0))  # epochs trained (in the checkpoint)
        self.register_buffer("start", torch.zeros(2))  # (a, b) when the last epoch began

    def enter_phase(self, phase: int) -> None:
        self.a.requires_grad_(True)
        self.b.requires_grad_(phase >= 1)


def toy_trainable(config):
    torch.manual_seed(0)
    model = Toy()
    opts: list[torch.optim.Optimizer] = []
    calls: list[int] = []

    def next_phase(k: int) -> torch.optim.Optimizer:
        calls.append(k)
        model.enter_phase(k)
        opts[:] = [torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)]
        return opts[0]

    next_phase(0)
    rng = torch.Generator().manual_seed(0)
    script = config["script"]

    def train_epoch() -> float:
        with torch.no_grad():
            model.start.copy_(torch.stack([model.a, model.b]))
        total = 0.0
        for _ in range(3):
            x = torch.randn(2, generator=rng)
            loss = (model.a - 2 - x[0]) ** 2 + (model.b + 1 - x[1]) ** 2
            opts[0].zero_grad(set_to_none=True)
            loss.backward()
            opts[0].step()
            total += float(loss.detach())
        model.done += 1
        return total / 3

    def validate() -> dict[str, float]:
        return {"val": script[int(model.done) - 1], "a": float(model.a), "b": float(model.b),
                "a_start": float(model.start[0]), "b_start": float(model.start[1]),
                "n_params": float(len(opts[0].param_groups[0]["params"])),
                "next_phase_calls": float(len(calls))}

    def after_epoch(epoch: int) -> None:
        marker = Path(config["marker_dir"]) / f"crashed-{epoch}"
        if epoch in config["crash_at"] and not marker.exists():
            marker.touch()
            raise RuntimeError(f"simulated crash after epoch {epoch}")

    fit_epochs(model, opts[0], rng, epochs=config["epochs"], patience=config["patience"], metric_key="val",
               train_epoch=train_epoch, validate=validate, mode="min", phases=2, next_phase=next_phase,
               after_epoch=after_epoch)


def run(storage: Path, scenario: dict, crash_at=(), marker_dir: Path | None = None):
    """One run; no automatic retries (max_failures=0), so a crash ends it as when the
    retries are used up, and the next run restores the experiment by hand."""
    config = {**scenario, "crash_at": list(crash_at), "marker_dir": str(marker_dir or storage)}
    tuner, plan = build_tuner(toy_trainable, config, storage, "exp", metric="val", mode="min",
                              max_epochs=scenario["epochs"] * 2, sweepable=[], asha=False,
                              progress=lambda m: None, cpus_per_trial=1, max_failures=0)
    (result,) = list(tuner.fit())
    return result, plan


def rows(result) -> list[dict]:
    df = result.metrics_dataframe
    return df[COLUMNS].drop_duplicates("epoch", keep="last").sort_values("epoch").to_dict("records")


def test_phases_need_next_phase():
    with pytest.raises(ValueError, match="next_phase"):
        fit_epochs(Toy(), torch.optim.SGD(Toy().parameters(), lr=0.1), torch.Generator(), epochs=2, patience=1,
                   metric_key="val", train_epoch=lambda: 0.0, validate=lambda: 0.0, phases=2)


@pytest.fixture(scope="module")
def clean(ray_session, tmp_path_factory):
    result, plan = run(tmp_path_factory.mktemp("clean"), BY_PATIENCE)
    assert result.error is None and not plan["restored"]
    return rows(result)


@pytest.mark.slow
def test_phase_ends_after_patience_and_the_next_starts_from_its_best_epoch(clean):
    r = {row["epoch"]: row for row in clean}
    assert [row["epoch"] for row in clean] == list(range(1, 9))  # <= epochs * phases = 10
    assert [row["phase"] for row in clean] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [row["val"] for row in clean] == BY_PATIENCE["script"][:8]
    # phase 0 trains a only; a keeps moving after its best epoch (e2), b does not move
    assert all(r[e]["b"] == 0.0 and r[e]["b_start"] == 0.0 for e in range(1, 5))
    assert len({r[e]["a"] for e in range(1, 5)}) == 4
    assert all(r[e]["a_start"] == r[e - 1]["a"] for e in (2, 3, 4))
    # the switch put back a of the best epoch (2), not of the last (4); b as it was
    assert r[5]["a_start"] == r[2]["a"] != r[4]["a"]
    assert r[5]["b_start"] == 0.0
    # phase 1 trains both, with a fresh optimizer over both
    assert r[5]["b"] != 0.0 and r[5]["a"] != r[5]["a_start"]
    assert all(r[e]["a_start"] == r[e - 1]["a"] and r[e]["b_start"] == r[e - 1]["b"] for e in (6, 7, 8))
    # the best value is kept across phases: e5 (3.5) did not beat phase 0's 3
    assert [row["best_epoch"] for row in clean] == [1, 2, 2, 2, 2, 6, 6, 6]
    assert [row["best"] for row in clean] == [5.0, 3.0, 3.0, 3.0, 3.0, 2.0, 2.0, 2.0]


@pytest.mark.slow
def test_phase_ends_after_its_epochs_and_the_trial_after_epochs_times_phases(ray_session, tmp_path):
    result, _ = run(tmp_path, BY_EPOCHS)
    assert result.error is None
    out = rows(result)
    r = {row["epoch"]: row for row in out}
    assert [row["epoch"] for row in out] == [1, 2, 3, 4, 5, 6]  # epochs * phases, though still improving
    assert [row["phase"] for row in out] == [0, 0, 0, 1, 1, 1]
    assert r[4]["a_start"] == r[2]["a"] != r[3]["a"]  # best of phase 0 is e2
    assert r[4]["b_start"] == 0.0 and r[4]["b"] != 0.0
    assert [row["best_epoch"] for row in out] == [1, 2, 2, 4, 5, 6]


@pytest.mark.slow
def test_a_trial_restored_in_either_phase_gives_the_uninterrupted_curve(ray_session, clean, tmp_path):
    """Crash after e3 (phase 0: the best epoch's parameters wait in the checkpoint) and
    after e5 (phase 1: the restore must rebuild phase 1's optimizer, over a and b, and
    load its state); each time `build_tuner` restores the experiment."""
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    first, _ = run(tmp_path / "s", BY_PATIENCE, crash_at=(3, 5), marker_dir=marker_dir)
    assert first.error is not None and first.metrics_dataframe["epoch"].max() == 3
    second, plan = run(tmp_path / "s", BY_PATIENCE, crash_at=(3, 5), marker_dir=marker_dir)
    assert plan["restored"]
    assert second.error is not None and second.metrics_dataframe["epoch"].max() == 5
    df = second.metrics_dataframe
    assert df.loc[df["epoch"] == 4, "phase"].tolist()[-1] == 0
    third, plan = run(tmp_path / "s", BY_PATIENCE, crash_at=(3, 5), marker_dir=marker_dir)
    assert plan["restored"] and third.error is None
    df = third.metrics_dataframe
    # the resumed run optimizes a and b again after the e5 crash (phase 1's optimizer rebuilt)
    assert df.loc[df["epoch"] == 6, "n_params"].tolist()[-1] == 2.0
    assert df.loc[df["epoch"] == 3, "n_params"].tolist()[-1] == 1.0
    assert df["epoch"].tolist() == list(range(1, 9))  # each epoch reported once
    assert rows(third) == clean


@pytest.mark.slow
def test_a_tune_experiment_on_s3_keeps_its_checkpoints_there_and_resumes_from_them(ray_session, s3_root,
                                                                                   tmp_path):
    """Tune's storage_path takes the storage URI: the experiment state and the trials'
    checkpoints are objects under it (a trial on any node, a restore from any node, finds
    them), and a trial that crashed resumes from its checkpoint there, giving the
    uninterrupted curve."""
    from rexeval.storage import location

    result, plan = run(s3_root, BY_EPOCHS, crash_at=[2], marker_dir=tmp_path)
    assert result.error is not None and not plan["restored"]  # no retries left: the crash ends the run
    keys = [f.relative_to(s3_root) for f in location(s3_root).walk_files()]
    assert "exp.rexeval.json" in keys and any(k.startswith("exp/") and k.endswith("/state.pt") for k in keys)
    again, plan = run(s3_root, BY_EPOCHS, crash_at=[2], marker_dir=tmp_path)
    assert plan["restored"] and again.error is None
    assert [r["epoch"] for r in rows(again)] == [1, 2, 3, 4, 5, 6]  # as uninterrupted (the test above)
    assert [r["val"] for r in rows(again)] == BY_EPOCHS["script"][:6]
