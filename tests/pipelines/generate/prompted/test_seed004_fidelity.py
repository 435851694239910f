"""Where `generate llm` follows seed 004 (ALERT) closely: PreferenceLogic's prompt carries
all six style rules of appendix A.1 (rule 5's layout included, no one-line demand) and the
answer keeps that layout, the answer caps are settings whose seed-004 values the `paper`
profile gives, and the BiasedMF picks its epoch on ratings it did not train on."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rexeval.pipelines.generate.prompted import mf as mf_module
from rexeval.pipelines.generate.prompted.config import PromptedJob
from rexeval.pipelines.generate.prompted.inputs import load_inputs
from rexeval.pipelines.generate.prompted.job import _train_mf
from rexeval.pipelines.generate.prompted.methods import PromptedSettings
from rexeval.pipelines.generate.prompted.mf import HOLDOUT_SHARE, selection_rows
from rexeval.pipelines.generate.prompted.preference_logic import conversation, preference_prompt
from rexeval.pipelines.generate.prompted.tasks import explain_task
from rexeval.prompts.rubrics import load_rubric
from tests.doubles.llm import ScriptedLLM
from tests.doubles.planted_shop import planted_ingest
from tests.doubles.planted_split import planted_split

REPO = Path(__file__).resolve().parents[4]
SIX = ["reasoning", "benefits", "plain_language", "picture_of_use", "scannable", "accurate_details"]


# --- 1. the six style rules -------------------------------------------------------------

def test_preference_logic_asks_for_all_six_style_rules_of_the_appendix():
    template, style = preference_prompt()
    assert style.names == SIX
    assert style.version.startswith("explanation_style/v3-")
    assert template.version.startswith("explain_recommendation/v2-")
    system = conversation(template, "- bought a tent", "Camping stove", list(style.items))[0]["content"]
    numbered = re.findall(r"^(\d+)\. ([^:\n]+):", system, re.MULTILINE)
    assert numbered == [(str(k), i.title) for k, i in enumerate(style.items, 1)]
    scan, facts = style.item("scannable").description.lower(), style.item("accurate_details").description.lower()
    assert "glance" in scan and "material" in facts and "never invent" in facts


def _system(rules: list) -> str:
    template, _ = preference_prompt()
    return conversation(template, "- bought a tent", "Camping stove", rules)[0]["content"]


def test_rule_5_asks_for_short_paragraphs_or_bullets_under_bold_capital_subheadings():
    """Appendix A.1, rule 5: small paragraphs or bullets, bold capitalised subheadings."""
    _, style = preference_prompt()
    scan = style.item("scannable").description
    for asked in ("short paragraphs", "bullet points", "subheadings", "bold", "capital"):
        assert asked in scan, asked
    assert " ".join(scan.split()) in " ".join(_system(list(style.items)).split())


@pytest.mark.parametrize("flawed", [False, True])
def test_the_prompt_demands_no_single_line_and_asks_the_seeds_20_to_30_words(flawed):
    _, style = preference_prompt()
    rules = [load_rubric("inferior_styles").item("jargon")] if flawed else list(style.items)
    flat = " ".join(_system(rules).lower().split())
    assert not re.search(r"\b(one|single|a) line\b", flat)  # the old prompt: "on one line"
    assert "between 20 and 30 words" in flat  # the meta prompt's range
    assert "bullet" in flat and "bold subheadings" in flat  # the answer format lets rule 5 be followed


def test_a_laid_out_answer_keeps_its_paragraphs_bullets_and_subheadings():
    answer = ("**MADE FOR YOUR TRIPS**\nYour tent and stove say you camp often.\n\n"
              "- **LIGHT:** the pots nest into one\n- **TOUGH:** hard-anodised aluminium")
    kept, _ = _explain(answer, max_tokens=2048, max_words=None)
    assert kept.loc[0, "explanation"] == answer
    wrapped, _ = _explain("Your tent and stove say\nyou camp often, and this pot set\nwill come along.")
    assert wrapped.loc[0, "explanation"] == "Your tent and stove say you camp often, and this pot set will come along."


def test_a_prompt_interruption_still_swaps_all_six_rules_for_one_flaw():
    """detect.py writes its inferior explanations with one flawed rule instead of the
    good ones: none of the six good titles may remain in that prompt."""
    template, style = preference_prompt()
    flaw = load_rubric("inferior_styles").item("misinformation")
    system = conversation(template, "- bought a tent", "Camping stove", [flaw])[0]["content"]
    assert re.findall(r"^\d+\. ([^:\n]+):", system, re.MULTILINE) == [flaw.title]
    assert not any(i.title in system for i in style.items)


# --- 2. the answer caps --------------------------------------------------------------------

def test_the_token_and_word_caps_are_settings_with_the_seed004_values_named(tmp_path):
    from rexeval.pipelines.generate.prompted.config import PromptedJob

    s = PromptedSettings()
    assert (s.max_tokens, s.max_words) == (None, 60)  # the token cap comes from the profile
    job = dict(input=str(tmp_path), methods=["preference_logic"], out=str(tmp_path / "o"))
    assert PromptedJob(**job).settings.max_tokens == 96  # local: cheap runs
    assert PromptedJob(**job, profile="paper").settings.max_tokens == 2048  # seed 004's appendix A
    assert PromptedJob(**job, profile="paper", settings={"max_tokens": 300}).settings.max_tokens == 300
    # the word cap too: seed 004 keeps whole answers under `paper`, an explicit setting wins
    assert PromptedJob(**job).settings.max_words == 60
    assert PromptedJob(**job, profile="paper").settings.max_words is None
    assert PromptedJob(**job, profile="paper", settings={"max_words": 40}).settings.max_words == 40
    assert PromptedJob(**job, settings={"max_words": None}).settings.max_words is None
    again = PromptedJob(**PromptedJob(**job, profile="paper").model_dump())  # a dumped config reads back the same
    assert (again.settings.max_tokens, again.settings.max_words) == (2048, None)
    fields = PromptedSettings.model_fields
    assert "2048" in fields["max_tokens"].description and "seed 004" in fields["max_tokens"].description
    assert "null" in fields["max_words"].description
    assert PromptedSettings(max_tokens=2048, max_words=None).max_words is None
    with pytest.raises(ValueError):
        PromptedSettings(max_words=2)


def test_the_seed004_study_lets_the_llm_write_2048_tokens_and_keeps_whole_answers(tmp_path, monkeypatch):
    from rexeval.pipelines.study.config import load_study
    from rexeval.pipelines.core.study_registry import build_config
    from rexeval.pipelines.study.plan import build_plan

    monkeypatch.setenv("REXEVAL_DATA", str(tmp_path / "data"))
    f = REPO / "studies" / "seed004.yaml"
    study = load_study(f)
    for ds in study.datasets.values():
        for p in ds.inputs + ds.meta:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            Path(p).touch()
    plan = build_plan(study, f, tmp_path / "out")
    generate = [i for i in plan.instances.values() if i.job.name == "generate_llm"]
    assert generate
    for inst in generate:
        cfg = build_config(inst.job, inst.settings)
        assert isinstance(cfg, PromptedJob)
        assert (cfg.settings.max_tokens, cfg.settings.max_words) == (2048, None)
        assert cfg.settings.temperature == 0.0  # the paper names 0.7 for its judge only
    judges = [i for i in plan.instances.values() if i.job.name in ("judge_pairwise", "judge_detect")]
    assert {i.job.name for i in judges} == {"judge_pairwise", "judge_detect"}
    for inst in judges:  # ALERT-Gen: 2,048 tokens at temperature 0.7 (appendix A)
        cfg = build_config(inst.job, inst.settings)
        assert (cfg.max_tokens, cfg.temperature) == (2048, 0.7), inst.key
        if inst.job.name == "judge_detect":
            assert (cfg.generation_max_tokens, cfg.generation_max_words, cfg.generation_temperature) == (2048, None, 0.0)


@pytest.mark.parametrize("profile, tokens, words", [("paper", 2048, None), ("local", 96, 60)])
def test_the_job_asks_the_llm_for_the_profiles_cap(tmp_path, profile, tokens, words):
    """What `generate llm` sends with each prompt: seed 004's 2,048 tokens under `paper`."""
    from rexeval.pipelines.generate.prompted.job import explain_settings
    from rexeval.pipelines.generate.prompted.methods import method

    cfg = PromptedJob(input=str(tmp_path), methods=["preference_logic"], out=str(tmp_path / "o"), profile=profile)
    settings = explain_settings(cfg, method("preference_logic"))
    assert (settings["explain"]["max_tokens"], settings["explain"]["max_words"]) == (tokens, words)
    llm = ScriptedLLM.make(default="You camp often, so this pot set will come along on every trip you take.")
    rows = pd.DataFrame({"example_id": ["e1"], "messages": [json.dumps([{"role": "user", "content": "write"}])]})
    explain_task(llm, rows, settings)
    assert (llm.calls[0].sampling.max_tokens, llm.calls[0].sampling.temperature) == (tokens, 0.0)


def _explain(answer: str, **settings) -> tuple[pd.DataFrame, ScriptedLLM]:
    llm = ScriptedLLM.make(default=answer)
    convs = [[{"role": "system", "content": "s"}, {"role": "user", "content": "write it"}]]
    rows = pd.DataFrame({"example_id": ["e1"], "messages": [json.dumps(c) for c in convs]})
    s = {"min_words": 5, "max_words": 60, "max_tokens": 96, "temperature": 0.0, "max_retries": 0, "seed": 0,
         "asked_words": "20 to 30", **settings}
    out, _ = explain_task(llm, rows, {"explain": s})
    return out["answers"], llm


def test_the_caps_reach_the_llm_call_and_the_answer_reader():
    long = " ".join(f"Sentence {k} tells you one more good thing about it." for k in range(12))  # 108 words
    capped, llm = _explain(long)
    assert llm.calls[0].sampling.max_tokens == 96
    assert len(capped.loc[0, "explanation"].split()) <= 60
    whole, llm = _explain(long, max_tokens=2048, max_words=None)
    assert llm.calls[0].sampling.max_tokens == 2048
    assert whole.loc[0, "explanation"] == long


# --- 3. BiasedMF selects its epoch on rows it did not train on ---------------------------

class _Stop(Exception):
    pass


def _mf_data(cfg: PromptedJob, inputs, monkeypatch) -> dict[str, np.ndarray]:
    """Run the job's BiasedMF step up to the Tune experiment; the rows it trains on and
    selects with, as written to its data file (the MF's record of both sets)."""
    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(mf_module, "fit_one", stop)
    with pytest.raises(_Stop):
        _train_mf(cfg, inputs, progress=lambda _: None)
    (path,) = (Path(cfg.out) / "mf").glob("biased_mf-data-*.npz")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _pairs(a: dict[str, np.ndarray], side: str) -> list[tuple[int, int]]:
    return list(zip(a[f"{side}_user"].tolist(), a[f"{side}_item"].tolist()))


def _cfg(inp: Path, out: Path) -> PromptedJob:
    return PromptedJob(input=str(inp), methods=["user_based"], out=str(out), judge_service="none")


def test_from_a_split_folder_it_trains_on_train_and_selects_on_valid(tmp_path, monkeypatch):
    split, _ = planted_split(tmp_path)
    cfg = _cfg(split, tmp_path / "out")
    inputs = load_inputs(split)
    assert inputs.kind == "split" and len(inputs.valid)
    a = _mf_data(cfg, inputs, monkeypatch)
    train, valid = _pairs(a, "train"), _pairs(a, "valid")
    assert len(valid) == len(inputs.valid) and len(train) > 0
    assert not set(train) & set(valid)  # the old code trained on every validation rating too
    users = sorted(set(inputs.known["user_id"]) | set(inputs.valid["user_id"]))
    items = sorted(set(inputs.known["item_id"]) | set(inputs.valid["item_id"]))
    named = {(users[u], items[i]) for u, i in train}
    valid_pairs = set(zip(inputs.valid["user_id"], inputs.valid["item_id"]))
    assert named == set(zip(inputs.known["user_id"], inputs.known["item_id"])) - valid_pairs


def test_from_an_ingest_folder_a_seeded_share_is_held_out_for_selection(tmp_path, monkeypatch):
    ingest = planted_ingest(tmp_path)
    inputs = load_inputs(ingest)
    assert inputs.kind == "ingest" and inputs.valid is None
    a = _mf_data(_cfg(ingest, tmp_path / "out"), inputs, monkeypatch)
    train, valid = _pairs(a, "train"), _pairs(a, "valid")
    assert len(valid) == round(HOLDOUT_SHARE * len(inputs.known)) and len(train) + len(valid) == len(inputs.known)
    assert not set(train) & set(valid)


def test_selection_rows_never_share_a_pair_with_the_training_rows():
    train = pd.DataFrame({"user_id": [f"u{k % 7}" for k in range(40)] + ["u0", "u1"],
                          "item_id": [f"i{k % 11}" for k in range(40)] + ["i0", "i1"],
                          "rating": [float(1 + k % 5) for k in range(42)]})
    # a split-style call: valid rows are also among the known rows, plus one of their pairs twice
    valid = train.iloc[[0, 1, 2]].reset_index(drop=True)
    fit, select = selection_rows(train, valid, seed=0)
    pairs = lambda df: set(zip(df["user_id"], df["item_id"]))  # noqa: E731
    assert not pairs(fit) & pairs(select) and pairs(select) == pairs(valid)
    assert len(fit) == len(train) - len(train.merge(valid[["user_id", "item_id"]]))
    # an ingest-style call: the same seed holds out the same rows, disjoint by pair
    fit1, held1 = selection_rows(train, train.iloc[:0], seed=3)
    fit2, held2 = selection_rows(train, train.iloc[:0], seed=3)
    pd.testing.assert_frame_equal(held1, held2)
    assert len(held1) == round(HOLDOUT_SHARE * len(train)) and not pairs(fit1) & pairs(held1)
