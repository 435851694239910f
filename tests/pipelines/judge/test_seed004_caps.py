"""Seed 004 (appendix A) lets generation and evaluation write up to 2,048 tokens and
samples its judge (ALERT-Gen) at 0.7. Under the `paper` profile `judge detect` and `judge
pairwise` ask for 2,048 tokens unless told otherwise; `local` keeps short, cheap caps.
What the jobs would send is read off the sampling each call of a scripted LLM receives."""
from __future__ import annotations

import pandas as pd
import pytest

from rexeval.models.profiles import AnswerCaps, load_profile
from rexeval.pipelines.judge.config import DetectJobConfig, PairwiseJobConfig
from rexeval.pipelines.judge.detect import generate_planned, judge_layout, plan_conditions
from rexeval.pipelines.judge.evaluators.gen import pairwise_settings
from rexeval.pipelines.judge.jobs import detect_suite
from rexeval.pipelines.judge.pairwise import PairwiseConfig, judge_pairwise
from tests.doubles.llm import ScriptedLLM

LONG = " ".join(f"Sentence {k} says one more good thing about this tent for you." for k in range(8))  # 96 words


def _contexts(path) -> str:
    pd.DataFrame({"user_id": ["u0", "u1"], "item_id": ["i0", "i1"],
                  "user_profile": ["- bought a stove", "- bought boots"],
                  "item_description": ["Tent (category: outdoors)", "Lamp (category: home)"]}).to_parquet(path)
    return str(path)


def _detect(tmp_path, **kw) -> DetectJobConfig:
    return DetectJobConfig(contexts=_contexts(tmp_path / "ctx.parquet"), out=str(tmp_path / "o"),
                           conditions=["item_replace", "jargon"], **kw)


def test_the_profiles_name_seed_004s_caps_and_local_keeps_small_ones():
    assert load_profile("paper").answer_caps == AnswerCaps(explain_tokens=2048, explain_words=None,
                                                           judge_tokens=2048)
    assert load_profile("local").answer_caps == AnswerCaps()  # the defaults: 96 tokens, 60 words, 512


@pytest.mark.parametrize("profile, gen_tokens, judge_tokens", [("paper", 2048, 2048), ("local", 96, 512)])
def test_detect_writes_and_judges_with_the_profiles_caps(tmp_path, profile, gen_tokens, judge_tokens):
    cfg = _detect(tmp_path, profile=profile, temperature=0.7)
    ctx = pd.read_parquet(cfg.contexts)
    writer = ScriptedLLM.make(default=LONG)
    pairs, errors, _ = generate_planned(plan_conditions(ctx, detect_suite(cfg).conditions), writer, detect_suite(cfg))
    assert writer.calls and {(c.sampling.max_tokens, c.sampling.temperature) for c in writer.calls} == {(gen_tokens, 0.0)}
    # paper keeps the whole answer (seed 004 caps no words); local keeps what fits in 60 words
    assert (pairs["original"] == LONG).all() if profile == "paper" else (pairs["original"].str.split().str.len() <= 60).all()
    judge = ScriptedLLM.make(default='{"reasoning": "A fits.", "verdict": "[[A]]"}')
    judge_pairwise(judge, judge_layout(pairs), PairwiseConfig(**pairwise_settings(cfg)["pairwise"]))
    assert judge.calls and {(c.sampling.max_tokens, c.sampling.temperature) for c in judge.calls} == {(judge_tokens, 0.7)}


def test_explicit_detect_settings_win_over_the_profile(tmp_path):
    cfg = _detect(tmp_path, profile="paper", max_tokens=300, generation_max_tokens=200, generation_max_words=40,
                  generation_temperature=0.5)
    suite = detect_suite(cfg)
    assert (cfg.max_tokens, suite.max_tokens, suite.max_words, suite.temperature) == (300, 200, 40, 0.5)
    assert _detect(tmp_path, generation_max_words=None).generation_max_words is None  # local, kept whole on request
    again = DetectJobConfig(**_detect(tmp_path, profile="paper").model_dump())  # a dumped config reads back the same
    assert (again.max_tokens, again.generation_max_tokens, again.generation_max_words) == (2048, 2048, None)


@pytest.mark.parametrize("profile, tokens", [("paper", 2048), ("local", 512)])
def test_pairwise_judges_with_the_profiles_cap(tmp_path, profile, tokens):
    expl = tmp_path / "expl.parquet"
    pd.DataFrame({"example_id": ["e"], "system": ["s"], "user_id": ["u"], "item_id": ["i"],
                  "explanation": ["x"]}).to_parquet(expl)
    given = dict(explanations=[str(expl)], baseline="s", out=str(tmp_path / "o"), profile=profile)
    cfg = PairwiseJobConfig(**given, temperature=0.7)
    settings = PairwiseConfig(**pairwise_settings(cfg)["pairwise"])
    assert (settings.max_tokens, settings.temperature) == (tokens, 0.7)
    assert PairwiseJobConfig(**given, max_tokens=256).max_tokens == 256
