"""The metric registry: decorator, look-ups and duplicate protection."""
from __future__ import annotations

import dataclasses

import pytest

from rexeval.metrics import registry
from rexeval.metrics.registry import MetricInfo, get_metric, group_metrics, list_metrics, register_metric


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Each test registers into a copy, so nothing leaks into the real registry (loaded
    first: the built-in metrics register where they are imported)."""
    registry.METRICS.load_all()
    monkeypatch.setattr(registry, "METRICS", registry.METRICS.copy())


def test_decorator_records_info_and_returns_function():
    def f(x):
        return x

    out = register_metric("t_dummy", higher_is_better=False, inputs=("a",), description="d")(f)
    assert out is f
    want = MetricInfo("t_dummy", False, "per_example", ("a",), "d")
    assert f.metric_info == want == get_metric("t_dummy")
    with pytest.raises(dataclasses.FrozenInstanceError):
        want.name = "other"


def test_duplicate_name_with_other_function_rejected():
    @register_metric("t_dup")
    def first():
        return 1

    register_metric("t_dup")(first)  # same function again is fine

    def second():
        return 2

    with pytest.raises(ValueError):
        register_metric("t_dup")(second)


def test_unknown_name_lists_known():
    register_metric("t_known")(lambda: 0)
    with pytest.raises(KeyError, match="t_known"):
        get_metric("t_missing")


def test_list_by_kind_and_bad_kind():
    register_metric("t_corpus", kind="corpus")(lambda: 0)
    register_metric("t_example")(lambda: 0)
    assert "t_corpus" in list_metrics("corpus")
    assert "t_corpus" not in list_metrics("per_example")
    assert "t_example" in list_metrics()
    assert list_metrics() == sorted(list_metrics())
    with pytest.raises(ValueError):
        register_metric("t_bad", kind="weird")
    with pytest.raises(ValueError):
        list_metrics("weird")


def test_groups_list_metrics_in_registration_order():
    register_metric("t_g1", group="t_group")(lambda: 0)
    register_metric("t_other", group="t_else")(lambda: 0)
    register_metric("t_g2", group="t_group", kind="corpus")(lambda: 0)
    assert group_metrics("t_group") == ("t_g1", "t_g2")
    assert group_metrics("t_group", kind="corpus") == ("t_g2",)
    assert get_metric("t_g1").group == "t_group"


def test_statement_groups_are_what_the_batch_functions_return():
    """`rexeval evaluate` dispatches on the registry's groups; the batch functions of
    seed 000's statement metrics return exactly those names."""
    from rexeval.metrics.statement_level import NLI_METRICS
    from rexeval.metrics.st2exp import ST2EXP_METRICS

    assert group_metrics("statement_nli") == NLI_METRICS
    assert group_metrics("st2exp") == ST2EXP_METRICS
