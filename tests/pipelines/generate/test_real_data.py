"""All four generators on the shared real reviews, end to end on the CPU: ingest, split,
`generate train` (a few epochs, small sizes), `generate run` on the test split, and
`evaluate` reading the explanations as they are (review targets: no LLM needed)."""
from __future__ import annotations

import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.generate.config import RunConfig, TrainJob
from rexeval.pipelines.generate.decode import run_generate
from rexeval.pipelines.generate.pipeline import run_train

pytestmark = pytest.mark.slow

SMALL = {
    "nrt": {"dim": 32, "hidden": 48},
    "att2seq": {"dim": 16, "hidden": 48, "lr": 0.01},  # 2 epochs at the paper's 0.002 only learn EOS
    "peter": {"emsize": 32, "nhid": 64, "nlayers": 1},
    "cer": {"emsize": 32, "nhid": 64, "nlayers": 1},
}


@pytest.fixture(scope="module")
def split(ray_session, shared_csv, tmp_path_factory):
    from rexeval.pipelines.ingest.config import IngestConfig, SplitConfig
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.split_pipeline import run_split

    root = tmp_path_factory.mktemp("mi")
    run_ingest(IngestConfig(inputs=[str(shared_csv)], out=str(root / "ingest")), progress=lambda m: None)
    run_split(SplitConfig(input=str(root / "ingest"), out=str(root / "split")), progress=lambda m: None)
    return root / "split"


@pytest.mark.parametrize("model", ["nrt", "att2seq", "peter", "cer"])
def test_train_run_and_evaluate_on_the_shared_reviews(split, tmp_path, model):
    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.pipeline import run_evaluate

    report = run_train(TrainJob(data=str(split), target="review", model=model, out=str(tmp_path / "train"),
                                settings={**SMALL[model], "epochs": 2, "vocab_size": 2000, "batch_size": 64}),
                       progress=lambda m: None)
    assert report["best"]["val_ppl"] < 2000  # below a uniform guess over the vocabulary
    m = run_generate(RunConfig(checkpoint=str(tmp_path / "train"), out=str(tmp_path / "gen"), limit=200),
                     progress=lambda m: None)
    expl = read_table(tmp_path / "gen" / "explanations", "explanations")
    errors = read_table(tmp_path / "gen" / "errors", "errors")
    assert m["counts"]["in"] == 200 and expl.num_rows + errors.num_rows == 200
    assert set(expl.column("system").to_pylist()) <= {model}
    assert ("rmse" in m) == (model != "att2seq")
    rep = run_evaluate(EvaluateConfig(explanations=[str(tmp_path / "gen")], metrics=["overlap"],
                                      out=str(tmp_path / "eval"), bootstrap=0), progress=lambda m: None)
    assert rep["counts"]["examples"] == expl.num_rows and rep["counts"]["scores"] > 0
