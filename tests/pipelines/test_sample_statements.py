"""Checks on the hand-written statements in pipelines/sample/statements.jsonl (no Ray)."""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

SAMPLE = Path(__file__).parents[2] / "pipelines" / "sample"
KEYS = {"reviewerID", "asin", "unixReviewTime", "statements"}
SENTIMENTS = {"positive", "negative", "neutral"}
FIRST_PERSON = re.compile(r"\b(i|me|my|we|our)\b", re.IGNORECASE)
SECTION = "## Statements (`statements.jsonl`)"


def _jsonl(name: str) -> list[dict]:
    lines = (SAMPLE / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]  # strict JSON, raises on a bad line


@pytest.fixture(scope="module")
def reviews() -> list[dict]:
    return _jsonl("reviews.jsonl")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return _jsonl("statements.jsonl")


@pytest.fixture(scope="module")
def statements(rows) -> list[dict]:
    return [s for row in rows for s in row["statements"]]


def _key(rec: dict) -> tuple:
    return rec["reviewerID"], rec["asin"], rec["unixReviewTime"]


def test_one_line_per_review_in_order(reviews, rows):
    assert len(rows) == len(reviews)
    assert [_key(r) for r in rows] == [_key(r) for r in reviews]
    assert len({_key(r) for r in rows}) == len(rows)


def test_keys_and_types(rows):
    for n, row in enumerate(rows, 1):
        assert set(row) == KEYS, (n, set(row) ^ KEYS)
        assert isinstance(row["reviewerID"], str) and isinstance(row["asin"], str), n
        assert type(row["unixReviewTime"]) is int, n
        assert isinstance(row["statements"], list), n
        assert len(row["statements"]) <= 6, n
        for s in row["statements"]:
            assert set(s) == {"statement", "sentiment"}, (n, s)
            assert isinstance(s["statement"], str), (n, s)
            assert s["sentiment"] in SENTIMENTS, (n, s)


def test_statement_form(rows):
    for n, row in enumerate(rows, 1):
        texts = [s["statement"] for s in row["statements"]]
        assert len(texts) == len(set(texts)), (n, "repeated statement in one review")
        for text in texts:
            assert text.startswith("the product "), (n, text)
            assert text == text.strip() and "  " not in text, (n, text)
            assert 3 <= len(text.split()) <= 12, (n, text)
            assert not FIRST_PERSON.search(text), (n, text)
            assert " and " not in text and " but " not in text, (n, text)


def test_few_reviews_without_statements(rows):
    empty = sum(1 for row in rows if not row["statements"])
    assert empty <= len(rows) // 20


def test_prompt_injections_yield_nothing(reviews, rows):
    injected = [
        (review, row)
        for review, row in zip(reviews, rows)
        if re.search(r"(ignore|disregard)\b.{0,20}\binstructions", review["reviewText"], re.I)
    ]
    assert len(injected) == 3
    for review, row in injected:
        for s in row["statements"]:
            low = s["statement"].lower()
            for word in ("instruction", "ignore", "disregard", " ok", "excellent"):
                assert word not in low, (review["asin"], s)


def test_statements_recur_across_reviews(rows):
    seen = defaultdict(set)
    for n, row in enumerate(rows):
        for s in row["statements"]:
            seen[s["statement"]].add(n)
    assert sum(1 for ids in seen.values() if len(ids) >= 2) >= 30


def _readme_section() -> str:
    text = (SAMPLE / "README.md").read_text(encoding="utf-8")
    assert SECTION in text
    section = text.split(SECTION, 1)[1]
    return section.split("\n## ", 1)[0]


def _num(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, pattern
    return float(m.group(1))


def test_readme_counts_match_file(rows, statements):
    text = _readme_section()
    sentiments = Counter(s["sentiment"] for s in statements)
    seen = defaultdict(set)
    for n, row in enumerate(rows):
        for s in row["statements"]:
            seen[s["statement"]].add(n)

    assert _num(r"(\d+) lines, one per review", text) == len(rows)
    assert _num(r"(\d+) statement rows", text) == len(statements)
    assert _num(r"(\d+) distinct statements", text) == len(seen)
    assert _num(r"(\d+) of them appear in two or more reviews", text) == sum(
        1 for ids in seen.values() if len(ids) >= 2
    )
    for label in SENTIMENTS:
        assert _num(rf"(\d+) {label}", text) == sentiments[label], label
    assert _num(r"(\d+) reviews? with no statement", text) == sum(
        1 for row in rows if not row["statements"]
    )
    mean = _num(r"([\d.]+) statements per review on average", text)
    assert mean == round(len(statements) / len(rows), 1)
