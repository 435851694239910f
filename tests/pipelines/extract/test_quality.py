"""Extraction quality (seed 002 Table 2) with a scripted judge: sampling, counting, report."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.extract.pipeline import run_extract
from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.pipelines.extract.quality import format_table2, run_quality, sample_statements, summarise
from rexeval.pipelines.extract.config import QualityConfig
from rexeval.pipelines.core.schema import REVIEWS, STATEMENTS

BACKEND = "tests.doubles.llm:ScriptedLLM"
YES = json.dumps({"explanatory": True, "atomic": True})


def test_sample_is_seeded_and_keeps_whole_reviews():
    rows = [{"statement_id": f"s{i}", "review_id": f"r{i // 3}", "user_id": "u", "item_id": "i",
             "statement": f"x{i}", "topic": None, "sentiment": "positive", "stage": "candidate",
             "provenance": None} for i in range(30)]
    t = pa.Table.from_pylist(rows, schema=STATEMENTS)
    a, b = sample_statements(t, 4, seed=7), sample_statements(t, 4, seed=7)
    assert a.equals(b) and a.num_rows == 12
    assert len(set(a.column("review_id").to_pylist())) == 4
    assert sample_statements(t, 100, seed=0).num_rows == 30


def test_summary_and_table2_gain_by_hand():
    j = pa.table({"statement_id": list("abcdef"), "review_id": ["r"] * 6,
                  "stage": ["candidate"] * 4 + ["verified"] * 2,
                  "statement": list("abcdef"),
                  "explanatory": [True, False, True, None, True, True],
                  "atomic": [True, True, False, None, True, False]})
    s = summarise(j, {"candidate": 1})
    # candidate: 3 judged (one unusable): 2/3 explanatory, 2/3 atomic; verified: 2/2, 1/2
    assert s["candidate"] == {"statements": 3, "unparsed": 1, "explanatory_pct": 66.67,
                              "atomic_pct": 66.67}
    assert s["verified"]["explanatory_pct"] == 100.0 and s["verified"]["atomic_pct"] == 50.0
    table = format_table2("toys", s)
    assert "| toys | 66.67 | 100.00 | +33.33 | 66.67 | 50.00 | -16.67 |" in table


@pytest.mark.slow
def test_extract_quality_job_judges_candidates_and_verified(tmp_path, ray_session):
    rows = [{"review_id": f"r{i}", "user_id": "u", "item_id": "i", "rating": 4.0,
             "timestamp": i, "text": f"review {i}", "category": "toys", "source": "t", "line": i + 1}
            for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows, schema=REVIEWS), tmp_path / "reviews.parquet")
    cands = json.dumps({"statements": [
        {"statement": "the product is sturdy", "sentiment": "positive"},
        {"statement": "I bought it for my son", "sentiment": "neutral"}]})
    verified = json.dumps({"statements": [{"statement": "the product is sturdy",
                                           "sentiment": "positive"}]})
    run_extract(ExtractConfig(input=str(tmp_path / "reviews.parquet"), out=str(tmp_path / "star"),
                              method="star", backend=BACKEND, use_cache=False,
                              backend_options={"rules": [['"statements"', verified]],
                                               "default": cands}),
                progress=lambda s: None)
    judge = {"rules": [["I bought it", json.dumps({"explanatory": False, "atomic": True})]],
             "default": YES}
    m = run_quality(QualityConfig(input=str(tmp_path / "star"), out=str(tmp_path / "q"),
                                  sample=3, backend=BACKEND, backend_options=judge,
                                  use_cache=False), progress=lambda s: None)
    s = m["summary"]
    # 3 reviews sampled: 6 candidates (half personal), 3 verified (all explanatory).
    assert s["candidate"]["statements"] == 6 and s["candidate"]["explanatory_pct"] == 50.0
    assert s["verified"]["statements"] == 3 and s["verified"]["explanatory_pct"] == 100.0
    assert "+50.00" in (tmp_path / "q" / "report.md").read_text()
    assert m["counts"]["in"] == 9 and m["counts"]["errors"] == 0


@pytest.mark.slow
def test_unusable_judge_answers_are_counted_not_guessed(tmp_path, ray_session):
    rows = [{"statement_id": f"s{i}", "review_id": "r0", "user_id": "u", "item_id": "i",
             "statement": f"the product is thing {i}", "topic": "price", "sentiment": "positive",
             "stage": "triplet", "provenance": None} for i in range(3)]
    (tmp_path / "ex" / "statements").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=STATEMENTS),
                   tmp_path / "ex" / "statements" / "part-00000.parquet")
    judge = {"rules": [["thing 2", "maybe?"]], "default": YES}
    m = run_quality(QualityConfig(input=str(tmp_path / "ex"), out=str(tmp_path / "q"),
                                  backend=BACKEND, backend_options=judge, use_cache=False,
                                  max_retries=0), progress=lambda s: None)
    assert m["summary"]["triplet"] == {"statements": 2, "unparsed": 1, "explanatory_pct": 100.0,
                                       "atomic_pct": 100.0}
    assert m["counts"]["errors"] == 1
