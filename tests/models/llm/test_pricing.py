"""Price table and usage counters: costs computed by hand, glob matching, unknown
models have no price (None, not 0), cached calls are free and counted apart; GPU-hour
prices (`gpu_hour`) beside the token prices, CPU work at 0 GPU-hours."""
from __future__ import annotations

from pathlib import Path

import pytest

from rexeval.models.llm.base import LLMResult
from rexeval.models.llm.pricing import ModelPrice, PriceTable, Usage, format_cost, gpu_cost

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


# ------------------------------------------------------------ GPU-hour prices


@pytest.fixture
def gpu_table(tmp_path) -> PriceTable:
    path = tmp_path / "prices.yaml"
    path.write_text(
        "currency: USD\n"
        "models:\n"
        '  "reward-big": {gpu_hour: 10.0, prompt: 1.0, completion: 2.0}\n'
        '  "reward-*": {gpu_hour: 2.50}\n'
        '  "judge-*": {prompt: 1.0, completion: 4.0}\n')
    return PriceTable.load(path)


def test_gpu_hours_and_cost_by_hand():
    # 5400 s on 2 GPUs = 10800 GPU-seconds = 3 GPU-hours; at 2.50 per GPU-hour = 7.50
    assert gpu_cost(5400, 2, 2.50) == (pytest.approx(3.0), pytest.approx(7.5))
    # 90 s on 1 GPU = 0.025 GPU-hours; at 4.00 = 0.10
    assert gpu_cost(90, 1, 4.0) == (pytest.approx(0.025), pytest.approx(0.1))


def test_no_price_is_none_not_zero():
    hours, cost = gpu_cost(5400, 2, None)
    assert hours == pytest.approx(3.0) and cost is None
    assert format_cost(cost) == "no price"


def test_cpu_is_zero_gpu_hours_and_unknown_devices_are_none():
    # on CPU: 0 GPUs -> 0 GPU-hours, so a priced model costs 0 and an unpriced one None
    assert gpu_cost(120, 0, 2.50) == (0.0, 0.0)
    assert gpu_cost(120, 0, None) == (0.0, None)
    # GPUs not known: neither the hours nor the cost can be given
    assert gpu_cost(120, None, 2.50) == (None, None)
    with pytest.raises(ValueError, match="gpus"):
        gpu_cost(10, -1, 1.0)
    with pytest.raises(ValueError, match="seconds"):
        gpu_cost(-1, 1, 1.0)


def test_table_exact_then_glob_gpu_prices(gpu_table):
    table = gpu_table
    # exact id: 1800 s x 4 GPUs / 3600 = 2 GPU-hours x 10.00 = 20.00
    assert table.gpu_hour_price("reward-big") == 10.0
    assert table.gpu_cost("reward-big", 1800, 4) == pytest.approx(20.0)
    # ...and its token price still holds: 1M prompt x 1.0 + 0.5M completion x 2.0 = 2.0
    assert table.cost("reward-big", 1_000_000, 500_000) == pytest.approx(2.0)
    # glob: 900 s x 1 GPU = 0.25 GPU-hours x 2.50 = 0.625
    assert table.gpu_hour_price("reward-small-v2") == 2.5
    assert table.gpu_cost("reward-small-v2", 900, 1) == pytest.approx(0.625)
    # a GPU-hour-only entry has no token price, a token-only entry no GPU-hour price
    assert table.cost("reward-small-v2", 1000, 1000) is None
    assert table.gpu_hour_price("judge-x") is None and table.gpu_cost("judge-x", 3600, 1) is None
    assert table.cost("judge-x", 1_000_000, 1_000_000) == pytest.approx(5.0)
    # not in the table at all
    assert table.gpu_cost("someone-else", 3600, 1) is None


def test_an_entry_with_no_price_names_the_file_and_the_key(tmp_path):
    bad = tmp_path / "prices.yaml"
    bad.write_text('models:\n  "judge-a": {prompt: 1, completion: 1}\n  "my-reward": {}\n')
    with pytest.raises(ValueError, match=r"prices\.yaml: models\.'my-reward': no price.*gpu_hour"):
        PriceTable.load(bad)
    half = tmp_path / "half.yaml"
    half.write_text('models:\n  "judge-a": {prompt: 1}\n')
    with pytest.raises(ValueError, match=r"half\.yaml: models\.'judge-a': give both `prompt` and `completion`"):
        PriceTable.load(half)
    neg = tmp_path / "neg.yaml"
    neg.write_text('models:\n  "r": {gpu_hour: -2}\n')
    with pytest.raises(ValueError, match=r"neg\.yaml: models\.'r'\.gpu_hour"):
        PriceTable.load(neg)
    with pytest.raises(ValueError):
        ModelPrice()


def test_token_only_tables_keep_their_costs(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text('currency: USD\nmodels:\n  "m": {prompt: 2.0, completion: 8.0}\n')
    t = PriceTable.load(path)
    # 1,500 x 2 / 1M + 500 x 8 / 1M = 0.003 + 0.004
    assert t.cost("m", 1500, 500) == pytest.approx(0.007)
    assert t.models["m"].gpu_hour is None and t.gpu_cost("m", 3600, 1) is None


def test_example_file_has_a_reward_model_entry():
    t = PriceTable.load(EXAMPLE)
    entry = t.price("/models/ArmoRM-Llama3-8B-v0.1")
    assert entry is not None and entry.gpu_hour and entry.prompt is None
    assert "gpu_hour" in EXAMPLE.read_text() and "EXAMPLE" in EXAMPLE.read_text()
    # the token-priced entries are as before
    assert t.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0) == pytest.approx(0.15)
