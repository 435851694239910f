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


def test_only_a_run_of_metrics_that_read_no_reference_goes_without_references(monkeypatch):
    """A texts metric whose declared inputs name no reference (Distinct-2) needs none; one
    that names a reference, or declares nothing, does, and so do every model family and
    the corpus metrics: one of them in the run puts the references back in."""
    from rexeval.pipelines.evaluate.families import asked_metrics, references_needed

    registry.METRICS.load_all()
    monkeypatch.setattr(registry, "METRICS", registry.METRICS.copy())
    registry.register_metric("t-vs-ref", group="texts", inputs=("explanation", "reference"))(lambda g, r: 0)
    registry.register_metric("t-unsaid", group="texts")(lambda g, r: 0)
    assert not registry.reads_references("distinct-2")
    assert registry.reads_references("t-vs-ref") and registry.reads_references("t-unsaid")

    def needed(*names):
        names = list(names)
        return references_needed(select_families(names, []), asked_metrics(names))

    assert needed("distinct-2") is False
    assert needed("distinct-2", "t-vs-ref") and needed("t-unsaid") and needed("texts")
    assert needed("distinct-2", "rouge-1-f") and needed("distinct-2", "usr") and needed("all")


def test_st2exp_averages_over_the_seeds_population_unless_the_job_says_each():
    import numpy as np

    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.families import EvalContext
    from rexeval.ray_jobs.evaluate import evaluate_cmd
    from tests.doubles.llm import ScriptedLLM

    assert EvaluateConfig(explanations=["x.parquet"], out="o").st2exp_population == "both"
    assert "st2exp_population" in {p.name for p in evaluate_cmd.params}
    # e0 has statements on both sides; e1 only reference statements (its R is 1 under "each").
    batch = {"gen_sentences": [["it is loud"], []], "ref_sentences": [["it is loud"], ["it is light"]],
             "reference": ["ref 0", "ref 1"], "explanation": ["gen 0", "gen 1"]}
    scores = {}
    for population in ("both", "each"):
        fam = FAMILIES["st2exp"](EvalContext(st2exp_population=population))
        fam.llm = ScriptedLLM.make(rules=[], default="1")
        scores[population], _ = fam.score(batch)
    assert np.isnan(scores["both"]["st2exp_r"][1]) and scores["each"]["st2exp_r"][1] == 1.0


def test_fcr_and_div_are_undefined_without_features_not_zero():
    """No reference topics, so no features to cover or share: both are NaN ("–" in the
    tables, as FMR's missing values are), never a 0 that reads as a measured lack."""
    import math

    from rexeval.pipelines.evaluate.families import corpus_scores

    got = corpus_scores(["the battery lasts", "a sturdy case"], ["the battery lasts", "a case"], ())
    assert math.isnan(got["fcr"]) and math.isnan(got["div"])
    with_features = corpus_scores(["the battery lasts", "battery is fine"], ["x", "y"], ("battery",))
    assert with_features["fcr"] == 1.0 and with_features["div"] == 1.0
