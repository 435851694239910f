"""Metric families read the metrics they write from the metric registry."""
from __future__ import annotations

from rexeval.metrics import registry
from rexeval.pipelines.evaluate.families import FAMILIES, corpus_metrics
from rexeval.pipelines.evaluate.families import select_families


def test_every_family_writes_the_metrics_registered_in_its_group():
    for name, cls in FAMILIES.items():
        assert cls.metrics(), f"family {name} has no registered metric"
        for metric in cls.metrics():
            info = registry.get_metric(metric)
            assert info.group == name and info.kind == "per_example"
    assert corpus_metrics() == ("bleu-1", "bleu-4", "usr", "fcr", "div")


def test_a_newly_registered_metric_is_dispatched_to_its_family(monkeypatch):
    registry.METRICS.load_all()
    monkeypatch.setattr(registry, "METRICS", registry.METRICS.copy())
    registry.register_metric("sts-extra", group="sts")(lambda: 0)
    assert FAMILIES["sts"].metrics() == ("sts", "sts-extra")
    assert select_families(["sts-extra"], []) == ["sts"]
