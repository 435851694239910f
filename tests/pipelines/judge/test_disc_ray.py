"""The reward-model judge (ALERT-Disc) on Ray actors (issue 47): the job's driver never
loads or runs the reward model, and the verdicts, scores and counts are those of the
model run in one process (`disc.run_disc`) on the same pairs.

The in-process run is made first; then every way into the model in this process (the
driver) raises: building a `RewardScorer`, its `score`, `run_disc` and `score_distinct`
(Ray workers are other processes, so the actors load and score as they must).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rexeval.models.encoders import reward
from rexeval.pipelines.judge import disc
from rexeval.pipelines.judge.config import PairwiseJobConfig
from rexeval.pipelines.judge.evaluators.disc import disc_verdicts

pytestmark = pytest.mark.slow


class ModelInDriver(AssertionError):
    """The driver loaded or ran the reward model."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise ModelInDriver(f"the driver called {what}")

    return refuse


def forbid_the_model(monkeypatch) -> None:
    for owner, name in [(reward.RewardScorer, "__init__"), (reward.RewardScorer, "score"), (disc, "run_disc"),
                        (disc, "score_distinct")]:
        monkeypatch.setattr(owner, name, _refuse(f"{getattr(owner, '__name__', owner)}.{name}"))


def pairs_frame() -> pd.DataFrame:
    """Three systems against a baseline over four contexts (the baseline's explanation
    repeats in every pair of its context: scored once), a context with no history, an
    empty explanation and a pair whose two explanations are the same (a tie)."""
    rows = []
    for c, (profile, item) in enumerate([("- bought a capo (5/5)", "Guitar strap"), (None, "Picks"),
                                         ("- bought strings (4/5)", "Tuner"), ("", "Picks")]):
        for s, text in enumerate(["warm tone, fair price", "", "it is fine", f"baseline {c}"]):
            rows.append({"pair_id": f"p{c}-{s}", "user_profile": profile, "item_description": item,
                         "explanation_a": text, "explanation_b": f"baseline {c}"})
    frame = pd.DataFrame(rows)
    return frame.astype(object).where(frame.notna(), None)  # a history that is None, as the jobs' frames hold it


def test_the_reward_model_scores_on_actors_as_in_one_process(tmp_path, monkeypatch, ray_session):
    from tests.doubles.tiny_encoders import build_tiny_bert

    model = str(build_tiny_bert(tmp_path / "reward", 1))
    pairs = pairs_frame()
    cfg = PairwiseJobConfig(explanations=[str(tmp_path)], baseline="b", out=str(tmp_path / "out"),
                            evaluators=["disc"], reward_model=model, only=["reasoning", "neutral_tone"])
    dcfg = disc.DiscConfig(only=cfg.only)
    want = disc.run_disc(reward.build_reward_scorer(model), pairs, dcfg)
    monkeypatch.setattr(disc, "PAIRS_PER_BATCH", 5, raising=False)  # several batches: several actor calls
    with monkeypatch.context() as m:
        forbid_the_model(m)
        verdicts, usage = disc_verdicts(cfg, pairs, progress=lambda line: None)
    assert list(verdicts.columns) == list(want.verdicts.columns)
    assert verdicts["pair_id"].tolist() == pairs["pair_id"].tolist()
    verdict_cols = [c for c in verdicts.columns if c.startswith("verdict")]
    assert verdicts[verdict_cols].equals(want.verdicts[verdict_cols])
    scores = [c for c in verdicts.columns if c.startswith("score")]
    # float32 scores of texts batched with other texts (padded to other lengths, on other
    # BLAS paths) differ in the last bits: 6e-6 on 0.328 was seen; the verdicts are equal.
    np.testing.assert_allclose(verdicts[scores].to_numpy(float), want.verdicts[scores].to_numpy(float),
                               rtol=1e-4, atol=1e-5)
    assert (usage["pairs"], usage["scored"], usage["devices"], usage["gpus"]) == (16, want.scored, ["cpu"], 0)
    # Per criterion: 3 contexts ("" and None are the same history), each with the three
    # systems' texts and its baselines (Picks has two): 13 distinct (prompt, response).
    assert want.scored == 2 * 13
    assert [len(b) for b in disc.context_batches(pairs, 5)] == [4, 8, 4]  # contexts whole
