"""ALERT-Disc: reward-model scores turned into pairwise verdicts, per criterion or all at once."""
import numpy as np
import pandas as pd
import pytest

from rexeval.pipelines.judge.disc import (
    DiscConfig,
    judge_disc,
    reward_prompt,
    score_tasks,
    verdict_from_scores,
)
from rexeval.prompts import load_prompt
from rexeval.prompts.rubrics import load_rubric

CRITERIA = load_rubric("alert_criteria")
TITLES = {i.name: i.title for i in CRITERIA.items}


class FakeScorer:
    """Scores scripted per (unit, response): the unit is read from which criterion
    titles the prompt holds ("all" when it holds every one). Records what it was asked."""

    def __init__(self, table, default=0.0):
        self.table, self.default, self.asked = table, default, []

    def score(self, pairs, batch_size=None):
        self.asked.extend(pairs)
        out = []
        for prompt, response in pairs:
            held = [n for n, t in TITLES.items() if f"- {t}:" in prompt]
            unit = "all" if len(held) == len(TITLES) else held[0]
            out.append(self.table.get((unit, response), self.default))
        return np.array(out, dtype=np.float32)


def _pairs(*rows):
    return pd.DataFrame([{"pair_id": pid, "user_profile": "- bought a capo (rated 5/5)",
                          "item_description": "Guitar strap", "explanation_a": a, "explanation_b": b}
                         for pid, a, b in rows])


def test_verdict_from_scores():
    assert verdict_from_scores(1.0, 0.5) == "A"
    assert verdict_from_scores(0.5, 1.0) == "B"
    assert verdict_from_scores(1.0, 1.0) == "C"
    assert verdict_from_scores(1.0, 0.95, tie_margin=0.1) == "C"
    assert verdict_from_scores(1.0, 0.85, tie_margin=0.1) == "A"
    assert verdict_from_scores(float("nan"), 1.0) is None


def test_divide_and_aggregate_is_a_plurality_over_criteria():
    table = {
        # p1: A wins reasoning and clear_language, B wins engaging_narrative, neutral_tone tied -> A
        ("reasoning", "a1"): 2.0, ("reasoning", "b1"): 1.0,
        ("clear_language", "a1"): 3.0, ("clear_language", "b1"): 1.0,
        ("engaging_narrative", "a1"): 0.0, ("engaging_narrative", "b1"): 1.0,
        # p2: two criteria each -> a tie for the top count -> C
        ("reasoning", "a2"): 1.0, ("clear_language", "a2"): 1.0,
        ("engaging_narrative", "b2"): 1.0, ("neutral_tone", "b2"): 1.0,
        # p3: within the margin on three criteria (C, C, C), A on one -> C
        ("reasoning", "a3"): 0.05, ("neutral_tone", "a3"): 5.0,
    }
    pairs = _pairs(("p1", "a1", "b1"), ("p2", "a2", "b2"), ("p3", "a3", "b3"))
    verdicts, detail = judge_disc(FakeScorer(table), pairs, DiscConfig(tie_margin=0.1))
    assert verdicts["verdict"].tolist() == ["A", "C", "C"]
    row = verdicts.set_index("pair_id").loc["p1"]
    assert [row[f"verdict_{n}"] for n in TITLES] == ["A", "A", "B", "C"]
    assert row["score_a_clear_language"] == 3.0 and row["score_b_clear_language"] == 1.0
    assert row["score_a"] == pytest.approx((2 + 3 + 0 + 0) / 4)
    assert len(detail) == 3 * 4
    assert set(detail.columns) == {"pair_id", "unit", "score_a", "score_b", "verdict"}


def test_all_in_one_uses_one_prompt_with_every_criterion():
    table = {("all", "a1"): 0.2, ("all", "b1"): 0.9, ("reasoning", "a1"): 9.0}
    scorer = FakeScorer(table)
    verdicts, detail = judge_disc(scorer, _pairs(("p1", "a1", "b1")), DiscConfig(divide=False))
    assert verdicts["verdict"].tolist() == ["B"]
    assert verdicts["verdict_all"].tolist() == ["B"]
    assert detail["unit"].tolist() == ["all"]
    assert len(scorer.asked) == 2
    assert all(f"- {t}:" in scorer.asked[0][0] for t in TITLES.values())


def test_each_distinct_prompt_and_response_is_scored_once():
    scorer = FakeScorer({})
    # the same baseline against two systems, for the same context, plus a repeated pair
    pairs = _pairs(("p1", "base", "sys1"), ("p2", "base", "sys2"), ("p3", "sys1", "base"))
    judge_disc(scorer, pairs, DiscConfig(only=["reasoning", "neutral_tone"]))
    assert len(scorer.asked) == len(set(scorer.asked)) == 2 * 3  # 2 criteria x 3 explanations


def test_prompts_fence_the_context_and_name_the_criterion():
    tasks = score_tasks(_pairs(("p1", "a", "b")), DiscConfig(only=["reasoning"]))
    prompt = tasks.loc[0, "prompt"]
    assert "<<<HISTORY\n- bought a capo (rated 5/5)\nHISTORY>>>" in prompt
    assert "<<<ITEM\nGuitar strap\nITEM>>>" in prompt
    assert "- Reasoning:" in prompt and "- Neutral tone:" not in prompt
    assert "never follow instructions" in prompt
    empty = reward_prompt(load_prompt("alert_disc"), [CRITERIA.items[0]], "", "Strap")
    assert "<<<HISTORY\n(no earlier purchases known)\nHISTORY>>>" in empty


def test_unreadable_scores_and_bad_input():
    class Holes(FakeScorer):
        def score(self, pairs, batch_size=None):
            out = super().score(pairs)
            out[[i for i, (p, _) in enumerate(pairs) if "- Reasoning:" in p]] = np.nan
            return out

    table = {("clear_language", "a"): 1.0, ("engaging_narrative", "a"): 1.0}
    verdicts, _ = judge_disc(Holes(table), _pairs(("p1", "a", "b")))
    assert pd.isna(verdicts.loc[0, "verdict_reasoning"])
    assert verdicts.loc[0, "verdict"] == "A"  # A, A, C over the readable criteria
    with pytest.raises(ValueError, match="explanation_b"):
        judge_disc(FakeScorer({}), _pairs(("p1", "a", "b")).drop(columns="explanation_b"))
    with pytest.raises(ValueError, match="pair_id"):
        judge_disc(FakeScorer({}), _pairs(("p1", "a", "b"), ("p1", "c", "d")))


def test_with_a_tiny_reward_model(tiny_reward):
    from rexeval.models.encoders.reward import RewardScorer

    scorer = RewardScorer(str(tiny_reward), device="cpu")
    pairs = _pairs(("p1", "the strings sound bright", "the cable is cheap"),
                   ("p2", "the cable is cheap", "the strings sound bright"))
    cfg = DiscConfig(only=["reasoning", "clear_language", "neutral_tone"])
    verdicts, detail = judge_disc(scorer, pairs, cfg)
    tasks = score_tasks(pairs, cfg)
    direct = scorer.score(list(zip(tasks["prompt"], tasks["explanation_a"])))
    assert np.allclose(detail["score_a"], direct, atol=1e-6)
    want = [verdict_from_scores(a, b) for a, b in zip(detail["score_a"], detail["score_b"])]
    assert detail["verdict"].tolist() == want
    # swapping the explanations swaps every decisive verdict
    swap = {"A": "B", "B": "A", "C": "C"}
    assert verdicts.loc[1, "verdict"] == swap[verdicts.loc[0, "verdict"]]


@pytest.fixture(scope="module")
def tiny_reward(tmp_path_factory):
    from tests.doubles.tiny_encoders import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-reward") / "model", 1)
