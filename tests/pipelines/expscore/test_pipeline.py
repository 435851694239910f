"""ExpScore train + score on a small rated set built from the real Musical Instruments
reviews: each review's summary line plays an explanation of its item, rated with the
review's stars. A hashing bag-of-words stands in for the sentence encoder (one test
loads the real MiniLM)."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.models import languagetool as lt
from rexeval.pipelines.expscore import inputs as ei
from rexeval.pipelines.expscore import pipeline as ep
from rexeval.pipelines.expscore import report as er
from rexeval.pipelines.core.schema import REVIEWS, validate_table
from tests.doubles.encoder import HashingEncoder

CSV_COLUMNS = ["reviewerID", "asin", "reviewerName", "helpful", "reviewText", "overall", "summary",
               "unixReviewTime", "reviewTime"]


class TyposChecker:
    """Fake grammar checker: one error per word written in upper case."""

    def count_errors(self, texts):
        return [sum(1 for w in t.split() if w.isupper() and len(w) > 1) for t in texts]


@pytest.fixture(scope="module")
def data(shared_csv, tmp_path_factory):
    root = tmp_path_factory.mktemp("expscore")
    df = pd.read_csv(shared_csv, header=None, names=CSV_COLUMNS)
    df = df[df["summary"].notna() & df["reviewText"].notna()]
    counts = df["asin"].value_counts()
    items = sorted(counts[counts >= 8].index)[:15]
    pool = df[df["asin"].isin(items)]
    rated = (pool.sort_values(["overall", "asin", "reviewerID"]).groupby("overall").head(12))
    rows = [{"example_id": f"ex{i}", "explanation": r.summary, "item_id": r.asin, "rating": float(r.overall),
             "features": ["strings", "sound", "price", "cable"]}
            for i, r in enumerate(rated.itertuples())]
    good = root / "rated.jsonl"
    bad_lines = [
        {"example_id": "bad-empty", "explanation": "  ", "item_id": items[0], "rating": 3},
        {"example_id": "bad-rating", "explanation": "Works fine", "item_id": items[0], "rating": "lots"},
        {"example_id": "bad-scale", "explanation": "Works fine", "item_id": items[0], "rating": 9},
        {"example_id": "bad-item", "explanation": "Works fine", "item_id": "NO-SUCH-ITEM", "rating": 4},
        {"example_id": "bad-features", "explanation": "Works fine", "item_id": items[0], "rating": 4,
         "features": [1, 2]},
        {"example_id": "ex0", "explanation": "A repeated id", "item_id": items[0], "rating": 4},
        {"example_id": "bad-words", "explanation": "!!! ...", "item_id": items[0], "rating": 2},
    ]
    good.write_text("".join(json.dumps(r) + "\n" for r in rows + bad_lines) + "this is not json\n")
    reviews = pa.Table.from_pydict({
        "review_id": [f"r{i}" for i in range(len(pool))], "user_id": pool["reviewerID"].tolist(),
        "item_id": pool["asin"].tolist(), "rating": pool["overall"].astype("float32").tolist(),
        "timestamp": pool["unixReviewTime"].astype("int64").tolist(), "text": pool["reviewText"].tolist(),
        "source": ["shared.csv"] * len(pool), "line": list(range(1, len(pool) + 1))})
    reviews_path = root / "reviews.parquet"
    pq.write_table(validate_table(reviews, REVIEWS), reviews_path)
    return {"root": root, "rated": good, "reviews": reviews_path, "n_good": len(rows), "n_bad": len(bad_lines) + 1,
            "rows": rows, "items": items, "pool": pool}


def train_cfg(data, out, **kw):
    return ep.ExpScoreTrainConfig(inputs=[str(data["rated"])], out=str(out), reviews=str(data["reviews"]),
                                  max_reviews_per_item=5, max_epochs=400, test_fraction=0.25, **kw)


@pytest.fixture(scope="module")
def trained(data):
    out = data["root"] / "train"
    report = ep.run_train(train_cfg(data, out), encoder=HashingEncoder(), progress=lambda m: None)
    return out, report


def test_train_writes_model_scores_errors_and_report(data, trained):
    out, report = trained
    assert report["counts"]["rows_in"] == data["n_good"] + data["n_bad"]
    assert report["counts"]["scored"] == data["n_good"]
    assert report["counts"]["errors"] == data["n_bad"]
    assert report["counts"]["train"] + report["counts"]["test"] == data["n_good"]
    assert report["counts"]["test"] == round(0.25 * data["n_good"])
    for head in ("linear", "logistic", "nn"):
        assert (out / "model" / head / "expscore.json").exists()
        m = report["heads"][head]["test"]
        assert m["n"] == report["counts"]["test"] and -1 <= m["pearson"] <= 1 and -1 <= m["kendall"] <= 1
        assert 0 <= m["accuracy"] <= 1 and m["loss"] > 0
    assert report["heads"]["nn"]["hidden"] == [6, 3]
    assert report["heads"]["logistic"]["test"]["loss_type"] == "CE"
    assert set(report["linear_weights"]) == {"REL", "LEN", "REA", "WI", "REP", "SUB", "POL", "FA", "bias"}
    # summaries with the review's stars: polarity agrees with people
    assert report["factor_correlations"]["POL"]["pearson"] > 0.2
    scores = pq.read_table(out / "scores.parquet").to_pandas()
    assert len(scores) == data["n_good"] and set(scores["split"]) == {"train", "test"}
    assert scores[["REL", "LEN", "REA", "WI", "REP", "SUB", "POL", "FA", "expscore_nn"]].notna().all().all()
    md = (out / "report.md").read_text()
    assert "ExpScore (linear)" in md and "accuracy (±0.5)" in md and "| REL | LEN |" in md
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_grammar_unavailable_is_reported_not_zero(trained):
    out, report = trained
    assert "LanguageTool" in report["unavailable"]["GC"]
    assert "GC" not in report["factors"] and report["factor_correlations"]["GC"] is None
    assert any(n.startswith("GC (grammar correctness) unavailable, so trained and scored without it: "
                            "LanguageTool is not installed") for n in report["notes"])
    assert "- GC (grammar correctness) unavailable" in (out / "report.md").read_text()
    assert pq.read_table(out / "scores.parquet").column("GC").null_count == len(pq.read_table(out / "scores.parquet"))
    meta = json.loads((out / "model" / "linear" / "expscore.json").read_text())
    assert "GC" not in meta["factors"] and "GC" in meta["unavailable"]


def test_every_bad_row_is_an_error_row_naming_file_row_and_field(data, trained):
    out, _ = trained
    errors = pq.read_table(out / "errors.parquet").to_pandas().set_index("row_id", drop=False)
    assert set(errors["stage"]) == {"expscore"}
    assert (errors["source"] == str(data["rated"])).all()
    expect = {"bad-empty": ("explanation", "missing_text"), "bad-rating": ("rating", "bad_rating"),
              "bad-scale": ("rating", "bad_rating"), "bad-item": ("item_id", "no_reviews"),
              "bad-features": ("features", "bad_features"), "bad-words": ("explanation", "no_words")}
    for rid, (field, kind) in expect.items():
        assert (errors.at[rid, "field"], errors.at[rid, "error_type"]) == (field, kind), rid
    dup = errors[errors["error_type"] == "duplicate_id"]
    assert dup["row_id"].tolist() == ["ex0"] and dup["line"].tolist() == [data["n_good"] + 6]
    bad_json = errors[errors["error_type"] == "bad_json"]
    assert bad_json["line"].tolist() == [data["n_good"] + data["n_bad"]]


def test_score_reproduces_training_scores_and_reports_ratings(data, trained, tmp_path):
    out, _ = trained
    res = ep.run_score(ep.ExpScoreScoreConfig(inputs=[str(data["rated"])], out=str(tmp_path / "s"),
                                              reviews=str(data["reviews"]), model=str(out / "model"),
                                              max_reviews_per_item=5),
                       encoder=HashingEncoder(), progress=lambda m: None)
    train_scores = pq.read_table(out / "scores.parquet").to_pandas().set_index("example_id")
    new = pq.read_table(tmp_path / "s" / "scores.parquet").to_pandas().set_index("example_id")
    assert set(new["split"]) == {"score"}
    for col in ("REL", "WI", "POL", "expscore_linear", "expscore_logistic", "expscore_nn"):
        assert np.allclose(new.loc[train_scores.index, col], train_scores[col]), col
    assert res["counts"]["rated"] == data["n_good"] and res["heads"]["linear"]["score"]["n"] == data["n_good"]
    assert res["counts"]["errors"] == data["n_bad"]


def test_score_one_head_without_ratings(data, trained, tmp_path):
    out, _ = trained
    unrated = tmp_path / "new.csv"
    pd.DataFrame([{"explanation": "Great strings, warm sound", "item_id": data["items"][0],
                   "features": "strings; sound"}]).to_csv(unrated, index=False)
    res = ep.run_score(ep.ExpScoreScoreConfig(inputs=[str(unrated)], out=str(tmp_path / "s"),
                                              reviews=str(data["reviews"]), model=str(out / "model" / "nn")),
                       encoder=HashingEncoder(), progress=lambda m: None)
    scores = pq.read_table(tmp_path / "s" / "scores.parquet").to_pandas()
    assert scores["example_id"].tolist() == ["new.csv:1"] and scores.at[0, "FA"] == 2
    assert np.isfinite(scores.at[0, "expscore_nn"]) and scores["expscore_linear"].isna().all()
    assert res["heads"]["nn"]["score"] == {"n": 0} and res["factor_correlations"] == {}


def test_grammar_checker_used_when_given_and_required_when_scoring(data, tmp_path):
    out = tmp_path / "gc"
    report = ep.run_train(train_cfg(data, out, head="linear"), encoder=HashingEncoder(), grammar=TyposChecker(),
                          progress=lambda m: None)
    assert "GC" in report["factors"] and "GC" not in report["unavailable"]
    assert "GC" in report["linear_weights"]
    with pytest.raises(ValueError, match="grammar correctness"):
        ep.run_score(ep.ExpScoreScoreConfig(inputs=[str(data["rated"])], out=str(tmp_path / "s"),
                                            reviews=str(data["reviews"]), model=str(out / "model")),
                     encoder=HashingEncoder(), progress=lambda m: None)


def test_reviews_from_an_input_column_and_csv_input(data, tmp_path):
    pool = data["pool"]
    by_item = pool.groupby("asin")["reviewText"].apply(lambda s: json.dumps(s.tolist()[:3]))
    frame = pd.DataFrame(data["rows"]).drop(columns=["features"])
    frame["reviews"] = frame["item_id"].map(by_item)
    path = tmp_path / "rated.csv"
    frame.to_csv(path, index=False)
    cfg = ep.ExpScoreTrainConfig(inputs=[str(path)], out=str(tmp_path / "o"), reviews_column="reviews",
                                 head="linear", max_epochs=200)
    report = ep.run_train(cfg, encoder=HashingEncoder(), progress=lambda m: None)
    assert report["counts"]["scored"] == len(frame) and report["counts"]["errors"] == 0
    assert set(report["unavailable"]) == {"GC", "FA"}  # no features column: FA left out


def test_clear_errors_for_unusable_inputs(data, tmp_path):
    with pytest.raises(ValueError, match="required column.s. missing: text; JSON-lines file, columns found: example_id, explanation"):
        ep.run_train(ep.ExpScoreTrainConfig(inputs=[str(data["rated"])], out=str(tmp_path / "a"),
                                            reviews=str(data["reviews"]), text_column="text"),
                     encoder=HashingEncoder(), progress=lambda m: None)
    with pytest.raises(ValueError, match="reviews table"):
        ep.run_train(ep.ExpScoreTrainConfig(inputs=[str(data["rated"])], out=str(tmp_path / "b")),
                     encoder=HashingEncoder(), progress=lambda m: None)
    with pytest.raises(FileNotFoundError, match="not an ExpScore model"):
        ep.load_models(tmp_path, "all")


def test_validate_row_and_parse_list():
    cfg = ep.ExpScoreTrainConfig(inputs=["x"], out="o", reviews="r")
    row, err = ei.validate_row({"explanation": "Nice", "item_id": 7, "rating": "4.5", "features": '["a", "b"]',
                                "_source": "f.csv", "_line": 3}, cfg, "required")
    assert err is None and row["item_id"] == "7" and row["rating"] == 4.5 and row["features"] == ["a", "b"]
    assert row["example_id"] == "f.csv:3"
    row, err = ei.validate_row({"explanation": "Nice", "item_id": "i", "_source": "f.csv", "_line": 4},
                               cfg, "required")
    assert row is None and (err["field"], err["error_type"], err["line"]) == ("rating", "missing_rating", 4)
    row, _ = ei.validate_row({"explanation": "Nice", "item_id": "i", "_source": "f", "_line": 1}, cfg, "optional")
    assert row["rating"] is None and row["features"] == []
    assert ei.parse_list("tone; sound ;") == ["tone", "sound"]
    assert ei.parse_list("[1, 2]") is None and ei.parse_list("[broken") is None


def test_correlations_and_accuracy_by_hand():
    c = er.correlations([1, 2, 3, 4], [1, 3, 2, 4])
    assert c["pearson"] == pytest.approx(0.8)  # cov 1.0 / var 1.25
    assert c["kendall"] == pytest.approx(4 / 6)  # 5 concordant, 1 discordant pair
    assert er.correlations([1, 1, 1], [1, 2, 3])["pearson"] is None
    assert er.accuracy_within([3.0, 3.6, 2.5, 1.0], [3.4, 3.0, 3.0, 5.0]) == 0.5


def test_split_is_seeded():
    a = ei.split_rows(20, 0.25, seed=1)
    assert (a == "test").sum() == 5 and np.array_equal(a, ei.split_rows(20, 0.25, seed=1))
    assert not np.array_equal(a, ei.split_rows(20, 0.25, seed=2))


# ------------------------------------------------------------------ LanguageTool


def _lt_transport(matches_for):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v2/languages":
            return httpx.Response(200, json=[{"code": "en-US"}])
        if request.url.path == "/v2/check":
            form = dict(x.split("=", 1) for x in request.content.decode().split("&"))
            assert form["language"] == "en-US"
            text = httpx.QueryParams(request.content.decode())["text"]
            return httpx.Response(200, json={"matches": [{"rule": i} for i in range(matches_for(text))]})
        return httpx.Response(404)
    return httpx.MockTransport(handler)


def test_languagetool_client_counts_matches():
    client = lt.LanguageToolClient("http://lt.test/v2/", transport=_lt_transport(lambda t: t.count("teh")))
    client.ping()
    assert client.url == "http://lt.test"
    assert client.count_errors(["teh cat", "fine", "teh teh"]) == [1, 0, 2]


def test_languagetool_down_is_an_error():
    down = httpx.MockTransport(lambda r: httpx.Response(503))
    with pytest.raises(ValueError, match="no LanguageTool server answers"):
        lt.LanguageToolClient("http://lt.test", transport=down).ping()


def test_open_grammar_checker_without_one_says_why(monkeypatch, tmp_path):
    monkeypatch.delenv(lt.LANGUAGETOOL_ENV, raising=False)
    checker, note, close = lt.open_grammar_checker(None)
    assert checker is None and "--languagetool" in note and lt.LANGUAGETOOL_ENV in note
    close()
    monkeypatch.setenv(lt.LANGUAGETOOL_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="neither an http"):
        lt.open_grammar_checker(None)
    with pytest.raises(FileNotFoundError, match="languagetool-server.jar"):
        lt.open_grammar_checker(str(tmp_path))


# ------------------------------------------------------------------ the factor stage


def test_factor_stage_matches_the_pure_factors(data):
    rows = [{"explanation": r["explanation"], "item_id": r["item_id"], "features": r["features"]}
            for r in data["rows"][:10]]
    reviews = {i: ["great strings and sound", "cheap cable"] for i in data["items"]}
    stage = ep.FactorStage(["REL", "LEN", "POL", "FA"], {"great": 3}, reviews, encoder=HashingEncoder(),
                           batch_size=4)
    values = ep.compute_factors(rows, stage, "never", 1, progress=lambda m: None)
    assert list(values.index) == list(range(10))
    from rexeval.metrics.expscore_factors import factor_table

    frame = pd.DataFrame(rows).assign(item_reviews=lambda f: f["item_id"].map(reviews))
    direct = factor_table(frame, encoder=HashingEncoder(), term_frequency={"great": 3},
                          factors=["REL", "LEN", "POL", "FA"]).values
    assert np.allclose(values.to_numpy(), direct.to_numpy())


@pytest.mark.slow
def test_factor_stage_on_ray_data_equals_in_process(data, ray_session):
    rows = [{"explanation": r["explanation"], "item_id": r["item_id"], "features": r["features"]}
            for r in data["rows"][:12]]
    reviews = {i: ["great strings and sound", "cheap cable"] for i in data["items"]}
    stage = ep.FactorStage(["REL", "LEN", "WI", "SUB"], {"great": 3}, reviews, encoder=HashingEncoder(),
                           batch_size=5)
    on_ray = ep.compute_factors(rows, stage, "always", 1, progress=lambda m: None)
    local = ep.compute_factors(rows, stage, "never", 1, progress=lambda m: None)
    assert np.allclose(on_ray.to_numpy(), local.to_numpy())


@pytest.mark.slow
def test_train_with_the_real_minilm(data, tmp_path):
    cfg = ep.ExpScoreTrainConfig(inputs=[str(data["rated"])], out=str(tmp_path / "m"), reviews=str(data["reviews"]),
                                 max_reviews_per_item=2, head="linear", max_epochs=200, device="cpu")
    report = ep.run_train(cfg, progress=lambda m: None)
    assert report["settings"]["encoder"] == "all-MiniLM-L6-v2"
    scores = pq.read_table(tmp_path / "m" / "scores.parquet").to_pandas()
    assert scores["REL"].between(-1, 1).all() and scores["REL"].std() > 0


def test_languagetool_client_pickles_for_ray_actors():
    import pickle

    client = pickle.loads(pickle.dumps(lt.LanguageToolClient("http://lt.test", language="en-GB")))
    assert (client.url, client.language) == ("http://lt.test", "en-GB")


def test_local_languagetool_that_cannot_start_is_an_error(tmp_path):
    import shutil

    if shutil.which("java") is None:
        pytest.skip("no java on this machine")
    (tmp_path / "LanguageTool-6.6").mkdir()
    (tmp_path / "LanguageTool-6.6" / "languagetool-server.jar").write_bytes(b"not a jar")
    with pytest.raises(ValueError, match="did not start"):
        lt.LocalLanguageTool(tmp_path, start_timeout=60)


def test_too_few_usable_rows_names_the_problems(data, tmp_path):
    path = tmp_path / "few.jsonl"
    path.write_text(json.dumps({"explanation": "Fine", "item_id": data["items"][0], "rating": 11}) + "\n")
    with pytest.raises(ValueError, match=r"only 0 usable rows.*row 1: the rating 11 is outside 1\.\.5"):
        ep.run_train(ep.ExpScoreTrainConfig(inputs=[str(path)], out=str(tmp_path / "o"), reviews=str(data["reviews"])),
                     encoder=HashingEncoder(), progress=lambda m: None)
    assert not (tmp_path / "o").exists()  # nothing written for a run that cannot start
