"""Checks on the hand-written sample data in pipelines/sample (no project imports)."""
from __future__ import annotations

import ast
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

SAMPLE = Path(__file__).parents[2] / "pipelines" / "sample"
DOMAINS = {"toys", "clothes", "beauty", "sports", "cellphones"}
REQUIRED = {
    "reviewerID": str,
    "asin": str,
    "helpful": list,
    "reviewText": str,
    "overall": float,
    "summary": str,
    "unixReviewTime": int,
    "reviewTime": str,
    "category": str,
}
ALLOWED = set(REQUIRED) | {"reviewerName"}
LO, HI = 1420070400, 1546300800  # 2015-01-01 .. 2019-01-01 UTC


def _lines(name: str) -> list[str]:
    return (SAMPLE / name).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def reviews() -> list[dict]:
    return [json.loads(line) for line in _lines("reviews.jsonl")]


@pytest.fixture(scope="module")
def items() -> dict[str, dict]:
    rows = [json.loads(line) for line in _lines("items.jsonl")]
    assert len({r["asin"] for r in rows}) == len(rows), "duplicate asin in items.jsonl"
    return {r["asin"]: r for r in rows}


def test_every_line_is_strict_json_with_required_keys_and_types():
    lines = _lines("reviews.jsonl")
    assert 260 <= len(lines) <= 320
    for n, line in enumerate(lines, 1):
        rec = json.loads(line)  # strict JSON, raises on any bad line
        assert isinstance(rec, dict), n
        assert REQUIRED.keys() <= rec.keys(), (n, REQUIRED.keys() - rec.keys())
        assert rec.keys() <= ALLOWED, (n, rec.keys() - ALLOWED)
        for key, typ in REQUIRED.items():
            assert type(rec[key]) is typ, (n, key, type(rec[key]))
        if "reviewerName" in rec:
            assert isinstance(rec["reviewerName"], str) and rec["reviewerName"].strip(), n


def test_field_values(reviews):
    for r in reviews:
        assert 1.0 <= r["overall"] <= 5.0 and r["overall"].is_integer()
        assert len(r["asin"]) == 10 and r["asin"].isalnum() and r["asin"].isupper()
        rid = r["reviewerID"]
        assert rid.startswith("A") and 12 <= len(rid) <= 14 and rid.isalnum() and rid.isupper()
        a, b = r["helpful"]
        assert 0 <= a <= b
        assert r["reviewText"].strip() and r["summary"].strip()
        assert r["category"] in DOMAINS
        assert LO <= r["unixReviewTime"] < HI
        day = datetime.strptime(r["reviewTime"], "%m %d, %Y").replace(tzinfo=timezone.utc)
        assert r["unixReviewTime"] - int(day.timestamp()) in range(86400), r["reviewTime"]


def test_users(reviews):
    per_user = Counter(r["reviewerID"] for r in reviews)
    assert len(per_user) >= 40
    assert sum(1 for c in per_user.values() if c >= 5) >= 32
    assert any("reviewerName" not in r for r in reviews)  # some names missing


def test_domains_and_items(reviews, items):
    per_domain = Counter(r["category"] for r in reviews)
    assert set(per_domain) == DOMAINS
    assert all(c >= 40 for c in per_domain.values()), per_domain
    per_item = Counter(r["asin"] for r in reviews)
    assert all(c >= 3 for c in per_item.values())
    for r in reviews:
        assert r["asin"] in items, r["asin"]
        assert items[r["asin"]]["category"] == r["category"]
    assert set(items) == set(per_item), "items without reviews"


def test_no_duplicate_pairs_and_unique_texts(reviews):
    pairs = Counter((r["reviewerID"], r["asin"]) for r in reviews)
    assert max(pairs.values()) == 1
    texts = Counter(r["reviewText"] for r in reviews)
    assert max(texts.values()) == 1, [t for t, c in texts.items() if c > 1]


def test_mixed_sentiment(reviews):
    ratings = Counter(int(r["overall"]) for r in reviews)
    assert set(ratings) == {1, 2, 3, 4, 5}
    assert ratings[1] + ratings[2] >= 30
    assert ratings[4] + ratings[5] > len(reviews) / 2  # realistic skew to the top


def test_noisy_file_has_the_documented_problems(items):
    lines = _lines("reviews_noisy.jsonl")
    assert len(lines) == 12

    def strict(i):
        return json.loads(lines[i - 1])

    for i in (1, 2, 6, 11, 12):
        rec = strict(i)
        assert REQUIRED.keys() <= rec.keys() and 1 <= rec["overall"] <= 5, i
        assert rec["asin"] in items
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[2])
    py = ast.literal_eval(lines[2])  # line 3: Python literal, valid
    assert REQUIRED.keys() <= py.keys()
    with pytest.raises(json.JSONDecodeError):
        strict(4)
    assert "asin" not in strict(5)
    assert lines[6].strip() == ""
    assert strict(8)["reviewText"].strip() == ""
    assert strict(9)["overall"] == 7.0
    assert strict(10) == strict(1)
