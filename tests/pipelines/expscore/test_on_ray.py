"""ExpScore on Ray workers (issue 47): with `ray: always` the job's driver reads no table's
rows (the explanations and reviews are read by Ray tasks, the factors computed by an
actor pool and the heads trained by a Ray task), and the model, scores, errors and
report are those of the run in one process on the same inputs.

The in-process runs come first; then every whole-table reader of this process (the
driver) raises (`tests/doubles/whole_tables.py`): Ray workers are other processes.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.expscore import on_ray
from rexeval.pipelines.expscore import pipeline as ep
from tests.doubles.encoder import HashingEncoder
from tests.doubles.whole_tables import forbid_whole_tables
from tests.pipelines.expscore.test_pipeline import data, train_cfg  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.slow
QUIET = dict(encoder=HashingEncoder(), progress=lambda m: None)


def assert_close(got, want, path="report"):
    """Equal, floats to 1e-6 (the heads train in another process, with other threads)."""
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            assert_close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9, nan_ok=True), path
    else:
        assert got == want, path


def assert_same_outputs(got, want, model: tuple[str, str] = ("", "")) -> None:
    """`model`: (its folder in `got`'s run, in `want`'s), which a scoring report names."""
    report = (got / "report.json").read_text().replace(*model)
    assert_close(json.loads(report), json.loads((want / "report.json").read_text()))
    assert pq.read_table(got / "errors.parquet").to_pylist() == pq.read_table(want / "errors.parquet").to_pylist()
    g, w = pq.read_table(got / "scores.parquet").to_pandas(), pq.read_table(want / "scores.parquet").to_pandas()
    assert list(g.columns) == list(w.columns) and len(g) == len(w)
    numbers = [c for c in w.columns if w[c].dtype.kind == "f"]
    assert g.drop(columns=numbers).equals(w.drop(columns=numbers))
    np.testing.assert_allclose(g[numbers].to_numpy(float), w[numbers].to_numpy(float), rtol=1e-6, equal_nan=True)


def test_train_and_score_on_ray_read_no_table_in_the_driver(data, tmp_path, monkeypatch, ray_session):  # noqa: F811
    here = tmp_path / "here"
    ep.run_train(train_cfg(data, here, ray="never"), **QUIET)
    scored_here = ep.run_score(ep.ExpScoreScoreConfig(inputs=[str(data["rated"])], out=str(tmp_path / "s-here"),
                                                      reviews=str(data["reviews"]), model=str(here / "model"),
                                                      max_reviews_per_item=5, ray="never"), **QUIET)
    there = tmp_path / "there"
    with monkeypatch.context() as m:
        forbid_whole_tables(m)
        ep.run_train(train_cfg(data, there, ray="always"), **QUIET)
        scored = ep.run_score(ep.ExpScoreScoreConfig(inputs=[str(data["rated"])], out=str(tmp_path / "s-there"),
                                                     reviews=str(data["reviews"]), model=str(there / "model"),
                                                     max_reviews_per_item=5, ray="always"), **QUIET)
    assert_same_outputs(there, here)
    # The same word counts (WI's corpus), in the same order, and the same factor settings.
    assert (there / "model" / "factors.json").read_text() == (here / "model" / "factors.json").read_text()
    model = (str(there / "model"), str(here / "model"))
    assert_same_outputs(tmp_path / "s-there", tmp_path / "s-here", model)
    assert_close(json.loads(json.dumps(scored).replace(*model)), scored_here)


def test_auto_counts_rows_without_reading_them(data, tmp_path):  # noqa: F811
    cfg = train_cfg(data, tmp_path / "out")
    lines = len(data["rated"].read_text().splitlines())
    assert on_ray.input_rows(cfg) == max(lines, pq.read_metadata(data["reviews"]).num_rows)
    assert not ep.use_ray(cfg)  # under ray_min_rows
    assert ep.use_ray(cfg.model_copy(update={"ray_min_rows": lines}))


def test_reviews_from_a_column_of_parquet_inputs_on_ray(data, tmp_path, monkeypatch, ray_session):  # noqa: F811
    """The item's reviews in an input column, the inputs in Parquet: read by the load task."""
    import pandas as pd

    pool = data["pool"]
    by_item = pool.groupby("asin")["reviewText"].apply(lambda s: s.tolist()[:3])
    frame = pd.DataFrame(data["rows"])
    frame["reviews"] = frame["item_id"].map(by_item)
    frame.loc[0, "reviews"] = []  # a row without reviews: an error row
    frame.to_parquet(tmp_path / "rated.parquet", index=False)

    def cfg(out, ray):
        return ep.ExpScoreTrainConfig(inputs=[str(tmp_path / "rated.parquet")], out=str(tmp_path / out),
                                      reviews_column="reviews", head="linear", max_epochs=200, ray=ray)

    ep.run_train(cfg("here", "never"), **QUIET)
    with monkeypatch.context() as m:
        forbid_whole_tables(m)
        ep.run_train(cfg("there", "always"), **QUIET)
    assert_same_outputs(tmp_path / "there", tmp_path / "here")
    assert (tmp_path / "there/model/factors.json").read_text() == (tmp_path / "here/model/factors.json").read_text()
