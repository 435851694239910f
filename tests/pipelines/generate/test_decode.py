"""Decoding a split with a trained generator: the stage on a plain table, the Ray Data
job (every test review in the output or an error row, ratings with RMSE/MAE, resume),
and an output `rexeval evaluate` reads as is."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from rexeval.pipelines.core.io import ShardedOutput, read_table
from rexeval.pipelines.core.stage import Resources
from rexeval.pipelines.generate.config import RunConfig, TrainJob
from rexeval.pipelines.generate.decode import TABLES, DecodeStage, read_ratings, run_generate
from rexeval.pipelines.generate.pipeline import run_train
from tests.doubles.planted_split import NO_TRUTH, planted_split
from tests.doubles.planted_text import planted_rows
from tests.doubles.seeds import SEED

pytestmark = pytest.mark.slow  # its fixture trains a PETER once (seconds): the full tier only

# Small enough to train in seconds, big enough to learn the planted sentences.
SETTINGS = {"emsize": 64, "nhid": 128, "nlayers": 2, "dropout": 0.0, "batch_size": 16, "epochs": 40,
            "patience": 40, "optimizer": "adam", "lr": 0.003, "lr_decay": 1.0, "seed": SEED}


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    split, truth = planted_split(root, seed=SEED)
    run_train(TrainJob(data=str(split), truth=str(truth), model="peter", out=str(root / "peter"),
                       settings=SETTINGS), progress=lambda m: None)
    return root


@pytest.mark.learning
def test_decoded_test_split_reproduces_the_planted_sentences(trained, tmp_path):
    m = run_generate(RunConfig(checkpoint=str(trained / "peter"), out=str(tmp_path / "out"), shard_size=10,
                               batch_size=7), progress=lambda m: None)
    expl = read_table(tmp_path / "out" / "explanations", "explanations")
    errors = read_table(tmp_path / "out" / "errors", "errors")
    held = [r for r in planted_rows(seed=SEED) if r["held_out"]]
    n_test = len(held) // 2
    # Every test review is an explanation or an error row (the one without ground truth).
    assert m["counts"]["in"] == n_test and expl.num_rows + errors.num_rows == n_test + 1
    assert m["target"] == "explanation"  # evaluate reads it: the references are ground-truth explanations
    assert NO_TRUTH in errors.column("row_id").to_pylist()
    assert set(expl.column("system").to_pylist()) == {"peter"}
    rows = expl.to_pylist()
    # Held-out (user, item) pairs: the model composes the planted sentence from what it
    # learnt about the user and the item separately.
    right = sum(r["explanation"] == r["reference"] for r in rows)
    assert right >= 0.7 * len(rows), [(r["explanation"], r["reference"]) for r in rows[:5]]
    ratings = read_ratings(tmp_path / "out")
    assert ratings.num_rows == expl.num_rows
    diff = [p - t for p, t in zip(ratings.column("predicted_rating").to_pylist(), ratings.column("rating").to_pylist())]
    assert m["rmse"] == pytest.approx(math.sqrt(sum(d * d for d in diff) / len(diff)), rel=1e-5)
    assert m["mae"] == pytest.approx(sum(abs(d) for d in diff) / len(diff), rel=1e-5)
    # A re-run has nothing to do; beam search is another output.
    again = run_generate(RunConfig(checkpoint=str(trained / "peter"), out=str(tmp_path / "out"), shard_size=10,
                                   batch_size=7), progress=lambda m: None)
    assert again["counts"] == m["counts"]
    beam = run_generate(RunConfig(checkpoint=str(trained / "peter"), out=str(tmp_path / "beam"), beam_size=3),
                        progress=lambda m: None)
    assert beam["counts"]["in"] == m["counts"]["in"] and beam["config"]["beam_size"] == 3
    b = read_table(tmp_path / "beam" / "explanations", "explanations").to_pylist()
    assert sum(r["explanation"] == r["reference"] for r in b) >= 0.7 * len(b)


def test_the_stage_runs_on_a_plain_table_and_failures_become_error_rows(trained, tmp_path):
    out = ShardedOutput(tmp_path / "o", "generate", {"x": 1}, TABLES).open()
    stage = DecodeStage(str(trained / "peter" / "best"), out, "valid", 5, system="p", beam_size=1, decode_batch=4,
                        max_words=None, limit=None, resources=Resources(cpus=1))
    stage.setup()
    res = stage(pa.table({"shard": [0]})).to_pylist()
    assert res[0]["in"] == 5 and res[0]["out"] + res[0]["errors"] == 5

    def broken(rows):
        raise RuntimeError("out of memory")

    stage.decode = broken
    res = stage(pa.table({"shard": [1]})).to_pylist()[0]
    assert res["errors"] == res["in"] > 0
    err = read_table(out.shard_path("errors", 1), "errors").to_pylist()
    assert err[0]["error_type"] == "decode_failed" and "out of memory" in err[0]["message"]


def test_evaluate_reads_the_output_as_is(trained, tmp_path):
    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.pipeline import run_evaluate

    run_generate(RunConfig(checkpoint=str(trained / "peter"), out=str(tmp_path / "gen")), progress=lambda m: None)
    rep = run_evaluate(EvaluateConfig(explanations=[str(tmp_path / "gen")], references=str(trained / "truth"),
                                      metrics=["overlap"], out=str(tmp_path / "eval"), bootstrap=0),
                       progress=lambda m: None)
    assert rep["counts"]["examples"] > 0 and rep["counts"]["scores"] > 0


def test_a_checkpoint_refuses_data_prepared_otherwise(trained, tmp_path):
    from rexeval.pipelines.generate.data import GenData, prepare
    from rexeval.pipelines.generate.train import load_checkpoint_model

    model, settings, data = load_checkpoint_model(trained / "peter" / "best")
    assert settings["model"] == "peter" and str(data.folder) == str(trained / "peter" / "data")
    other = GenData.load(prepare(trained / "split", tmp_path, target="review", truth=None, vocab_size=5,
                                 max_words=4, progress=lambda m: None))
    with pytest.raises(ValueError, match="not the data"):
        load_checkpoint_model(trained / "peter" / "best", data=other)
