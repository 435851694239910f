"""Seed 003's Table 1 baselines in `expscore train`'s report: BLEU, ROUGE and METEOR of
each explanation against its item's reviews, correlated with the ratings.

Planted data: every review is six distinct words, no word shared between reviews; an
explanation is the first k words of its item's first review and 6 - k words that no
review has. By hand, against the best review: ROUGE-1 F1 = ROUGE-L F1 = k/6, ROUGE-2 F1 =
(k-1)/5 (0 for k = 0). BLEU comes from NLTK's own sentence BLEU (method-1 smoothing,
both reviews as references). The golden correlations are scipy's on those numbers."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from rexeval.pipelines.core.schema import REVIEWS, validate_table
from rexeval.pipelines.expscore import baselines as eb
from rexeval.pipelines.expscore import pipeline as ep
from tests.doubles.encoder import HashingEncoder

WORDS = ("bright warm sturdy gentle quiet simple clever heavy smooth rapid loud tiny "
         "classic modern rustic elegant silly brave calm lively honest fancy plain sharp "
         "mellow crisp fresh humble noble vivid cosy steady proud eager jolly witty").split()
FILLER = "apple river window garden pencil candle orange guitar mirror basket".split()
K = [0, 1, 2, 3, 4, 5, 6, 2, 4, 6, 1, 3, 5, 0, 6, 3]  # words shared per explanation
RATINGS = [1, 2, 2, 3, 4, 4, 5, 1, 3, 5, 2, 3, 4, 2, 4, 3]


def _reviews() -> dict[str, list[str]]:
    """Three items, two reviews each, 36 distinct words."""
    return {f"item{j}": [" ".join(WORDS[12 * j + 6 * r: 12 * j + 6 * r + 6]) for r in range(2)] for j in range(3)}


def _rows(reviews: dict[str, list[str]]) -> list[dict]:
    items = sorted(reviews)
    rows = []
    for i, (k, rating) in enumerate(zip(K, RATINGS)):
        item = items[i % len(items)]
        words = reviews[item][0].split()[:k] + FILLER[: 6 - k]
        rows.append({"example_id": f"ex{i}", "explanation": " ".join(words), "item_id": item, "rating": rating})
    return rows


def _by_hand(k: int) -> dict[str, float]:
    return {"ROUGE-1": k / 6, "ROUGE-L": k / 6, "ROUGE-2": max(k - 1, 0) / 5}


def _nltk_bleu(text: str, refs: list[str]) -> float:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    return sentence_bleu([r.split() for r in refs], text.split(), smoothing_function=SmoothingFunction().method1)


def test_baseline_values_by_hand_and_by_nltk():
    pytest.importorskip("nltk")
    reviews = _reviews()
    rows = _rows(reviews)
    refs = [reviews[r["item_id"]] for r in rows]
    got = eb.baseline_values([r["explanation"] for r in rows], refs, ["BLEU-4", "ROUGE-1", "ROUGE-2", "ROUGE-L"])
    for name in ("ROUGE-1", "ROUGE-2", "ROUGE-L"):
        assert got[name] == pytest.approx([_by_hand(k)[name] for k in K], abs=1e-12), name
    assert got["BLEU-4"] == pytest.approx([_nltk_bleu(r["explanation"], f) for r, f in zip(rows, refs)], abs=1e-12)
    assert np.isnan(eb.baseline_values(["a b"], [[]], ["ROUGE-1"])["ROUGE-1"][0])  # no review: undefined


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("baselines")
    reviews = _reviews()
    rows = _rows(reviews)
    (root / "rated.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    flat = [(item, text) for item, texts in reviews.items() for text in texts]
    table = pa.Table.from_pydict({
        "review_id": [f"r{i}" for i in range(len(flat))], "user_id": [f"u{i}" for i in range(len(flat))],
        "item_id": [item for item, _ in flat], "rating": pa.array([4.0] * len(flat), pa.float32()),
        "timestamp": list(range(len(flat))), "text": [text for _, text in flat],
        "source": ["planted"] * len(flat), "line": list(range(1, len(flat) + 1))})
    pq.write_table(validate_table(table, REVIEWS), root / "reviews.parquet")
    cfg = ep.ExpScoreTrainConfig(inputs=[str(root / "rated.jsonl")], out=str(root / "out"),
                                 reviews=str(root / "reviews.parquet"), head="linear", max_epochs=50,
                                 test_fraction=0.25)
    report = ep.run_train(cfg, encoder=HashingEncoder(), progress=lambda m: None)
    return root / "out", report, rows, reviews


def test_train_report_correlates_the_baselines_with_the_ratings(trained):
    pytest.importorskip("nltk")
    out, report, rows, reviews = trained
    assert report["counts"]["scored"] == len(rows) and report["counts"]["errors"] == 0
    scores = pq.read_table(out / "scores.parquet").to_pandas().set_index("example_id")
    split = np.array([scores.at[r["example_id"], "split"] for r in rows])
    y = np.array(RATINGS, dtype=float)
    hand = {name: np.array([_by_hand(k)[name] for k in K]) for name in ("ROUGE-1", "ROUGE-2", "ROUGE-L")}
    hand["BLEU-4"] = np.array([_nltk_bleu(r["explanation"], reviews[r["item_id"]]) for r in rows])
    for name, x in hand.items():
        for part, mask in (("all", np.ones(len(y), bool)), ("train", split == "train"), ("test", split == "test")):
            got = report["baselines"][name][part]
            assert got["n"] == mask.sum()
            assert got["pearson"] == pytest.approx(stats.pearsonr(x[mask], y[mask]).statistic, abs=1e-9), (name, part)
            assert got["kendall"] == pytest.approx(stats.kendalltau(x[mask], y[mask]).statistic, abs=1e-9), (name, part)
    md = (out / "report.md").read_text()
    test_rows = int((split == "test").sum())
    r1 = report["baselines"]["ROUGE-1"]["test"]["pearson"]
    assert f"| ROUGE-1 (vs the item's reviews) | {test_rows} | {r1:.3f} |" in md
    # METEOR needs NLTK's WordNet data: computed where it is installed, else said so.
    why = eb.meteor_unavailable_reason()
    if why is None:
        assert report["baselines"]["METEOR"]["all"]["n"] == len(rows)
    else:
        assert report["baselines"]["METEOR"] is None
        assert f"baseline METEOR not computed: {why}" in report["notes"]
        assert "| METEOR (vs the item's reviews) | – | unavailable |" in md


def test_train_declares_its_report_with_the_baselines():
    from rexeval.pipelines.expscore.config import EXPSCORE_TRAIN_OUTPUTS

    assert "BLEU-4" in EXPSCORE_TRAIN_OUTPUTS.report.what and "ROUGE" in EXPSCORE_TRAIN_OUTPUTS.report.what
