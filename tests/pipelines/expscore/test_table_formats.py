"""`expscore train` and `score` read their tables in any format (issue 50, item 1): rated
explanations as CSV or gzipped JSON lines and reviews as gzipped JSON lines or CSV, under
other column names mapped with `columns`, give the Parquet inputs' model and scores; an
unknown format or a missing column names the file, the format read and the columns
found. Planted data; a hashing bag-of-words stands in for the sentence encoder."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.expscore import pipeline as ep
from tests.doubles.encoder import HashingEncoder
from tests.doubles.table_files import write_frame_as

QUIET = dict(encoder=HashingEncoder(), progress=lambda m: None)
WORDS = ["warm", "bright", "cheap", "sturdy", "noisy", "clean", "loud", "thin", "rich", "dull"]
EXPL_THEIRS = {"explanation": "text", "item_id": "asin", "rating": "stars"}  # ours -> theirs
REVIEWS_THEIRS = {"item_id": "asin", "text": "body", "review_id": "rid"}


def _explanations() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(40):
        ws = rng.choice(WORDS, size=3 + i % 5)
        rows.append({"example_id": f"ex{i:02d}", "explanation": f"The {' and '.join(ws)} sound of this item.",
                     "item_id": f"i{i % 4}", "rating": float(1 + (i * 7) % 5), "features": "sound; strings"})
    return pd.DataFrame(rows)


def _reviews() -> pd.DataFrame:
    rows = [{"review_id": f"r{i:02d}", "user_id": f"u{i % 7}", "item_id": f"i{i % 4}", "rating": float(1 + i % 5),
             "timestamp": 1_400_000_000 + i, "text": f"Review {i}: {WORDS[i % 10]} and {WORDS[(i * 3) % 10]} sound.",
             "source": "planted", "line": i + 1} for i in range(24)]
    return pd.DataFrame(rows)


def _scores(folder) -> pd.DataFrame:
    return pq.read_table(folder / "scores.parquet").to_pandas().drop(columns=["source"]).set_index("example_id")


def _train(tmp_path, name, inputs, reviews, columns=None):
    out = tmp_path / name
    cfg = ep.ExpScoreTrainConfig(inputs=[inputs], reviews=reviews, out=str(out), head="linear", max_epochs=300,
                                 test_fraction=0.25, max_reviews_per_item=5, columns=columns or {})
    return out, ep.run_train(cfg, **QUIET)


@pytest.fixture(scope="module")
def parquet_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("es_formats")
    expl = write_frame_as(_explanations(), tmp / "rated.parquet")
    reviews = write_frame_as(_reviews(), tmp / "reviews.parquet")
    out, report = _train(tmp, "parquet", expl, reviews)
    return tmp, out, report


@pytest.mark.parametrize("expl_name, reviews_name", [("rated.csv", "reviews.jsonl.gz"),
                                                     ("rated.jsonl.gz", "reviews.csv")])
def test_train_and_score_read_csv_and_gzipped_json_lines_under_other_names(parquet_run, tmp_path, expl_name,
                                                                          reviews_name):
    _, want_out, want = parquet_run
    columns = {**EXPL_THEIRS, **REVIEWS_THEIRS}  # one mapping, two tables: text=body never renames `text`
    expl = write_frame_as(_explanations(), tmp_path / expl_name, EXPL_THEIRS)
    reviews = write_frame_as(_reviews(), tmp_path / reviews_name, REVIEWS_THEIRS)
    out, got = _train(tmp_path, "mine", expl, reviews, columns)
    assert got["counts"] == want["counts"] and got["counts"]["errors"] == 0
    pd.testing.assert_frame_equal(_scores(out), _scores(want_out))
    assert got["linear_weights"] == pytest.approx(want["linear_weights"])
    # score: the same tables through `expscore score`, the ratings compared
    res = ep.run_score(ep.ExpScoreScoreConfig(inputs=[expl], reviews=reviews, model=str(out / "model"),
                                              out=str(tmp_path / "s"), max_reviews_per_item=5, columns=columns),
                       **QUIET)
    base = ep.run_score(ep.ExpScoreScoreConfig(inputs=[str(parquet_run[0] / "rated.parquet")],
                                               reviews=str(parquet_run[0] / "reviews.parquet"),
                                               model=str(want_out / "model"), out=str(tmp_path / "s0"),
                                               max_reviews_per_item=5), **QUIET)
    assert res["counts"] == base["counts"]
    pd.testing.assert_frame_equal(_scores(tmp_path / "s"), _scores(tmp_path / "s0"))


def test_no_mapping_keeps_the_settings_hash(parquet_run):
    """`columns` left empty is left out of the recorded settings (old folders resume)."""
    cfg = ep.ExpScoreTrainConfig(inputs=["x.parquet"], reviews="r.parquet", out="o")
    assert "columns" not in cfg.recorded()
    assert cfg.model_copy(update={"columns": {"item_id": "asin"}}).recorded()["columns"] == {"item_id": "asin"}


def test_a_missing_column_names_the_file_the_format_and_the_columns_found(parquet_run, tmp_path):
    tmp = parquet_run[0]
    expl = write_frame_as(_explanations(), tmp_path / "rated.jsonl.gz", EXPL_THEIRS)
    with pytest.raises(SchemaError) as err:
        _train(tmp_path, "a", expl, str(tmp / "reviews.parquet"))  # no mapping given
    msg = str(err.value)
    assert expl in msg and "JSON-lines file" in msg and "explanation" in msg
    assert "columns found: example_id, text, asin, stars, features" in msg and "--columns" in msg
    reviews = write_frame_as(_reviews(), tmp_path / "reviews.csv", REVIEWS_THEIRS)
    with pytest.raises(SchemaError) as err:
        _train(tmp_path, "b", str(tmp / "rated.parquet"), reviews, {"item_id": "asin"})  # text, review_id unmapped
    msg = str(err.value)
    assert reviews in msg and "CSV file" in msg and "columns found:" in msg and "body" in msg


def test_an_unknown_format_is_named(parquet_run, tmp_path):
    odd = tmp_path / "rated.xlsx"
    odd.write_bytes(b"PK\x03\x04 not a table")
    with pytest.raises(SchemaError) as err:
        _train(tmp_path, "c", str(odd), str(parquet_run[0] / "reviews.parquet"))
    assert str(odd) in str(err.value) and "parquet, csv, tsv, jsonl" in str(err.value)


@pytest.mark.slow
def test_on_ray_the_reviews_read_in_another_format_under_other_names(parquet_run, tmp_path):
    """`ray: always`: the reviews are read by Ray Data (`runtime.read_dataset`, rename=)."""
    _, want_out, want = parquet_run
    expl = write_frame_as(_explanations(), tmp_path / "rated.csv", EXPL_THEIRS)
    reviews = write_frame_as(_reviews(), tmp_path / "reviews.jsonl.gz", REVIEWS_THEIRS)
    cfg = ep.ExpScoreTrainConfig(inputs=[expl], reviews=reviews, out=str(tmp_path / "ray"), head="linear",
                                 max_epochs=300, test_fraction=0.25, max_reviews_per_item=5, ray="always",
                                 columns={**EXPL_THEIRS, **REVIEWS_THEIRS})
    got = ep.run_train(cfg, **QUIET)
    assert got["counts"] == want["counts"]
    pd.testing.assert_frame_equal(_scores(tmp_path / "ray"), _scores(want_out), check_exact=False, rtol=1e-5)
