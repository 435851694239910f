"""The pairwise judge and the detection suite's generator with the real local LLM
(SmolLM2-135M through the hf backend): the plumbing, not the quality of the verdicts."""
from __future__ import annotations

import pandas as pd
import pytest

from rexeval.pipelines.judge.pairwise import PairwiseConfig, judge_pairwise

CONTEXT = {"user_profile": "Elixir acoustic guitar strings (rated 5/5)\nSnark clip-on tuner (rated 4/5)",
           "item_description": "D'Addario phosphor bronze acoustic strings (category: instruments)"}


@pytest.fixture(scope="module")
def smollm2():
    from rexeval.models.profiles import load_profile
    from rexeval.models.llm.cache import build_cached_backend

    ref = load_profile("local").require("judge_llm")
    return build_cached_backend("hf", ref, {}, None)


@pytest.mark.slow
def test_smollm2_pairwise_judge_gives_verdicts_or_reasons(smollm2):
    pairs = pd.DataFrame([{"pair_id": "p0", **CONTEXT,
                           "explanation_a": "You keep your guitar fresh with coated strings; these bright bronze "
                                            "ones give the same crisp sound for longer.",
                           "explanation_b": "BUY NOW!!! Best strings ever made, everybody loves them!!!"}])
    verdicts, detail, stats = judge_pairwise(smollm2, pairs, PairwiseConfig(divide=False, max_tokens=96,
                                                                            max_retries=1))
    assert len(verdicts) == 1 and len(detail) == 2
    for r in detail.itertuples():
        assert r.verdict in ("A", "B", "C") or (r.verdict is None and r.problem)
    assert stats.usage.prompt_tokens > 0 and stats.usage.seconds > 0 and stats.usage.calls >= 2


@pytest.mark.slow
def test_smollm2_writes_detection_pairs_or_error_rows(smollm2):
    from rexeval.pipelines.judge.detect import DetectSuiteConfig, build_detection_pairs

    contexts = pd.DataFrame([{"user_id": "u1", "item_id": "i1", **CONTEXT},
                             {"user_id": "u2", "item_id": "i2", "user_profile": "Yamaha keyboard stand (rated 4/5)",
                              "item_description": "Sustain pedal for digital pianos (category: instruments)"}])
    pairs, errors, stats = build_detection_pairs(
        contexts, smollm2, DetectSuiteConfig(conditions=["item_replace", "jargon"], max_tokens=64, max_retries=1))
    assert len(pairs) + len(errors) == 4
    for r in pairs.itertuples():
        assert r.original.strip() and r.inferior.strip()
    assert stats.usage.completion_tokens > 0
