"""`generate train` and `generate run` with the split, the ground truth and both outputs on
S3 (moto on 127.0.0.1): the trials read the prepared data by URI and keep their
checkpoints in the bucket, the best one is copied there, and the same epoch is chosen
and the same explanations written as by a local run; nothing lands in the working
directory, and a run resumes from its markers in the bucket."""
from __future__ import annotations

import pytest
import torch

from rexeval.pipelines.core.io import read_table
from rexeval.storage import location
from rexeval.pipelines.generate.config import RunConfig, TrainJob
from rexeval.pipelines.generate.decode import read_ratings, run_generate
from rexeval.pipelines.generate.pipeline import run_train
from rexeval.pipelines.generate.train import read_state
from tests.doubles.planted_split import planted_split

pytestmark = pytest.mark.slow

TINY = {"epochs": 2, "dim": 16, "hidden": 32}  # the CLI test's NRT: seconds per trial


def _files(root) -> dict[str, bytes]:
    base = location(root)
    return {f.relative_to(base): f.read_bytes() for f in base.walk_files()}


def _run(checkpoint, out) -> dict:
    return run_generate(RunConfig(checkpoint=str(checkpoint), out=str(out), shard_size=10, batch_size=7),
                        progress=lambda m: None)


def test_a_generator_trained_and_run_on_s3_matches_the_local_one(tmp_path, s3_root, ray_session, monkeypatch):
    split, truth = planted_split(tmp_path / "in")
    local = run_train(TrainJob(data=str(split), truth=str(truth), model="nrt", out=str(tmp_path / "nrt"),
                               settings=TINY), progress=lambda m: None)
    local_run = _run(tmp_path / "nrt", tmp_path / "gen")

    location(f"{s3_root}/split").upload(split)
    location(f"{s3_root}/truth").upload(truth)
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    out = f"{s3_root}/nrt"
    job = TrainJob(data=f"{s3_root}/split", truth=f"{s3_root}/truth", model="nrt", out=out, settings=TINY)
    remote = run_train(job, progress=lambda m: None)

    # The same epoch of the same trial, with the same validation numbers and weights.
    assert remote["best"]["epoch"] == local["best"]["epoch"]
    assert remote["best"]["checkpoint"] == f"{out}/best" and remote["experiment"] == f"{out}/tune/nrt-explanation"
    for key in ("val_loss", "val_ppl", "val_rmse"):
        assert remote["best"][key] == local["best"][key]
    assert location(out).joinpath("train.json").read_json()["best"] == remote["best"]
    mine, theirs = read_state(f"{out}/best"), read_state(tmp_path / "nrt" / "best")
    assert mine["data"] == f"{out}/data" and mine["epoch"] == theirs["epoch"]
    assert mine["model"].keys() == theirs["model"].keys()
    assert all(torch.equal(mine["model"][k], theirs["model"][k]) for k in mine["model"])
    # The prepared arrays, vocabulary and tables are the local ones (index.json names the inputs).
    data, local_data = _files(f"{out}/data"), _files(tmp_path / "nrt" / "data")
    assert data.keys() == local_data.keys()
    assert all(data[k] == local_data[k] for k in data if k != "index.json")
    assert list(location(out).joinpath("tune").glob("nrt-explanation*"))  # the experiment is in the bucket

    gen = f"{s3_root}/gen"
    m = _run(out, gen)
    assert m["counts"] == local_run["counts"] and m["rmse"] == local_run["rmse"] and m["mae"] == local_run["mae"]
    assert m["config"]["checkpoint"] == f"{out}/best"
    for table in ("explanations", "errors"):
        assert read_table(location(gen) / table, table).equals(read_table(tmp_path / "gen" / table, table))
    assert read_ratings(gen).equals(read_ratings(tmp_path / "gen"))
    assert list(here.iterdir()) == []

    # Without one shard's marker only that shard is decoded again, to the same bytes.
    before = _files(gen)
    (location(gen) / "_done" / "part-00000.json").unlink()
    again = _run(out, gen)
    assert again["counts"] == m["counts"]
    after = _files(gen)
    assert {k: v for k, v in after.items() if k != "manifest.json"} == {
        k: v for k, v in before.items() if k != "manifest.json"}
    # A second `train` restores the finished experiment from the bucket and keeps its choice.
    assert run_train(job, progress=lambda m: None)["best"] == remote["best"]
    assert list(here.iterdir()) == []
