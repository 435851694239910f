"""Price table and usage counters: costs computed by hand, glob matching, unknown
models have no price (None, not 0), cached calls are free and counted apart."""
from __future__ import annotations

from pathlib import Path

import pytest

from rexeval.models.llm.base import LLMResult
from rexeval.models.llm.pricing import PriceTable, Usage, format_cost

EXAMPLE = Path(__file__).resolve().parents[3] / "models" / "prices.example.yaml"


@pytest.fixture
def table(tmp_path) -> PriceTable:
    path = tmp_path / "prices.yaml"
    path.write_text(
        "currency: USD\n"
        "models:\n"
        '  "judge-large": {prompt: 2.0, completion: 8.0}\n'
        '  "judge-mini*": {prompt: 0.1, completion: 0.4}\n'
        '  "judge-*": {prompt: 1.0, completion: 1.0}\n'
        '  "local/*": {prompt: 0, completion: 0}\n')
    return PriceTable.load(path)


def test_exact_and_glob_costs_by_hand(table):
    # 1,500 prompt tokens at 2 USD/M + 500 completion tokens at 8 USD/M = 0.003 + 0.004
    assert table.cost("judge-large", 1500, 500) == pytest.approx(0.007)
    # first matching pattern in file order: judge-mini* before judge-*
    assert table.cost("judge-mini-2025", 1_000_000, 1_000_000) == pytest.approx(0.5)
    assert table.cost("judge-other", 250_000, 750_000) == pytest.approx(1.0)
    assert table.cost("local/my-model", 10**9, 10**9) == 0.0
    # an exact id wins over an earlier pattern
    t = PriceTable(models={"judge-*": {"prompt": 1, "completion": 1},
                           "judge-x": {"prompt": 5, "completion": 5}})
    assert t.cost("judge-x", 1_000_000, 0) == pytest.approx(5.0)


def test_unknown_model_has_no_price(table):
    assert table.price("someone-else") is None
    assert table.cost("someone-else", 100, 100) is None
    assert format_cost(None) == "no price"
    assert format_cost(0.0071) == "0.0071 USD"


def test_bad_table_is_refused_with_the_file_name(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text('models:\n  "m": {prompt: -1, completion: 1}\n')
    with pytest.raises(ValueError, match="bad.yaml"):
        PriceTable.load(bad)


def test_usage_counts_and_cached_calls_are_free(table):
    results = [LLMResult(text="a", prompt_tokens=1000, completion_tokens=200, seconds=0.5),
               LLMResult(text="b", prompt_tokens=3000, completion_tokens=300, seconds=1.5),
               LLMResult(text="a", prompt_tokens=1000, completion_tokens=200, cached=True),
               LLMResult(error="boom", seconds=0.25)]
    u = Usage().add_all(results)
    assert (u.calls, u.cached_calls, u.errors) == (4, 1, 1)
    assert (u.prompt_tokens, u.completion_tokens) == (4000, 500)
    assert (u.cached_prompt_tokens, u.cached_completion_tokens) == (1000, 200)
    assert u.seconds == pytest.approx(2.25)
    d = u.as_dict(table, "judge-large")
    # 4,000 x 2 / 1M + 500 x 8 / 1M = 0.008 + 0.004 (the cached call adds nothing)
    assert d["cost_usd"] == pytest.approx(0.012)
    assert u.as_dict(table, "unpriced")["cost_usd"] is None
    assert "cost_usd" not in u.as_dict()
    only_cached = Usage().add(results[2])
    assert only_cached.as_dict(table, "judge-large")["cost_usd"] == 0.0


def test_usage_merge_adds_counters():
    a = Usage().add(LLMResult(text="x", prompt_tokens=10, completion_tokens=2, seconds=1.0))
    b = Usage().add_all([LLMResult(text="y", prompt_tokens=5, completion_tokens=1, cached=True),
                         LLMResult(error="e")])
    a.merge(b)
    assert a.as_dict() == {"calls": 3, "cached_calls": 1, "errors": 1, "prompt_tokens": 10,
                           "completion_tokens": 2, "cached_prompt_tokens": 5,
                           "cached_completion_tokens": 1, "seconds": 1.0}


def test_example_price_file_loads():
    t = PriceTable.load(EXAMPLE)
    assert t.currency == "USD" and t.models
    assert t.price("gpt-4o-mini-2024-07-18") == t.models["gpt-4o-mini*"]
    assert t.cost("meta-llama/Llama-3.1-8B-Instruct", 10**6, 10**6) == 0.0
    assert "EXAMPLE" in EXAMPLE.read_text()
