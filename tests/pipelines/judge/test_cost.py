"""The reward model's side of the judges' cost (seed 004, Table 3): the scoring's wall
seconds and GPUs, GPU-hours and their cost by hand, and the one cost table beside the
LLM judge's tokens."""
import numpy as np
import pandas as pd
import pytest

from rexeval.models.llm.pricing import PriceTable
from rexeval.pipelines.judge.cost import COST_COLUMNS, cost_markdown, cost_rows, reward_line, reward_usage
from rexeval.pipelines.judge.disc import DiscConfig, gpu_count, judge_disc, run_disc, scorer_devices


class ScriptedScorer:
    """Scores by the response's length; says which devices it holds; counts its calls."""

    def __init__(self, devices=None, device=None):
        if devices is not None:
            self.devices = devices
        if device is not None:
            self.device = device
        self.calls = 0

    def score(self, pairs, batch_size=None):
        self.calls += 1
        return np.array([len(r) for _, r in pairs], dtype=np.float32)


class Clock:
    """A clock that reads the scripted times, one per call."""

    def __init__(self, *times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def _pairs(*rows):
    return pd.DataFrame([{"pair_id": pid, "user_profile": "- bought a capo", "item_description": "Strap",
                          "explanation_a": a, "explanation_b": b} for pid, a, b in rows])


PRICES = PriceTable(models={"reward-*": {"gpu_hour": 2.50}, "judge": {"prompt": 1.0, "completion": 4.0}})


def test_gpu_count_and_devices():
    assert gpu_count(["cuda:0", "cuda:1"]) == 2
    assert gpu_count(["cuda", "cuda:0"]) == 1  # "cuda" is cuda:0
    assert gpu_count(["cpu"]) == 0 and gpu_count([]) == 0
    assert gpu_count(None) is None
    assert scorer_devices(ScriptedScorer(devices=["cuda:1", "cuda:0", "cuda:1"])) == ["cuda:0", "cuda:1"]
    assert scorer_devices(ScriptedScorer(device="cpu")) == ["cpu"]
    assert scorer_devices(ScriptedScorer()) is None

    class WithModel:  # a torch model's weights say where it runs
        import torch

        model = torch.nn.Linear(2, 1)
        device = "cuda"  # ignored: the weights are on the CPU

    assert scorer_devices(WithModel()) == ["cpu"]


def test_disc_run_on_two_gpus_by_hand():
    scorer = ScriptedScorer(devices=["cuda:0", "cuda:1"])
    pairs = _pairs(("p1", "good", "bad"), ("p2", "okay", "bad"))
    run = run_disc(scorer, pairs, DiscConfig(only=["reasoning"]), clock=Clock(100.0, 5500.0))
    # the scoring took 5500 - 100 = 5400 s on 2 GPUs
    assert (run.pairs, run.seconds, run.devices, run.gpus) == (2, 5400.0, ["cuda:0", "cuda:1"], 2)
    # 1 criterion, one prompt per pair (both share the context): (p, good), (p, okay), (p, bad) -> 3 distinct
    assert run.scored == 3 and scorer.calls == 1
    assert run.verdicts["verdict"].tolist() == ["A", "A"]  # longer wins: 4 > 3 letters
    u = reward_usage(run, "reward-armo", PRICES, "prices.yaml")
    # 5400 s x 2 GPUs / 3600 = 3 GPU-hours; x 2.50 = 7.50
    assert u["gpu_hours"] == pytest.approx(3.0) and u["cost_usd"] == pytest.approx(7.5)
    assert (u["kind"], u["model"], u["pairs"], u["seconds"], u["gpus"], u["gpu_hour_price"]) == (
        "GPU-hours", "reward-armo", 2, 5400.0, 2, 2.5)
    assert "cost_note" not in u
    assert "3 GPU-hours" in reward_line(u) and "7.5000 USD" in reward_line(u)
    # judge_disc gives the same tables
    verdicts, _ = judge_disc(scorer, pairs, DiscConfig(only=["reasoning"]))
    pd.testing.assert_frame_equal(verdicts, run.verdicts)


def test_no_price_is_none_and_cpu_is_zero_gpu_hours():
    run = run_disc(ScriptedScorer(devices=["cuda:0"]), _pairs(("p1", "a", "bb")), DiscConfig(only=["reasoning"]),
                   clock=Clock(0.0, 720.0))
    u = reward_usage(run, "unpriced-model", PRICES, "prices.yaml")
    # 720 s x 1 GPU / 3600 = 0.2 GPU-hours, but no gpu_hour price: None, not 0
    assert u["gpu_hours"] == pytest.approx(0.2) and u["cost_usd"] is None and u["gpu_hour_price"] is None
    assert "no gpu_hour price for 'unpriced-model' in prices.yaml" in u["cost_note"]
    # without a price table there is no cost at all
    assert "cost_usd" not in reward_usage(run, "reward-x")
    cpu = run_disc(ScriptedScorer(device="cpu"), _pairs(("p1", "a", "bb")), DiscConfig(only=["reasoning"]),
                   clock=Clock(10.0, 40.0))
    u = reward_usage(cpu, "reward-x", PRICES, "prices.yaml")
    # 30 s on the CPU: 0 GPUs -> 0 GPU-hours -> 0 x 2.50 = 0; the seconds are still there
    assert (u["seconds"], u["gpus"], u["gpu_hours"], u["cost_usd"]) == (30.0, 0, 0.0, 0.0)
    assert "ran on CPU: 0 GPU-hours" in u["cost_note"] and "30.0 s of CPU time" in u["cost_note"]
    unknown = reward_usage(run_disc(ScriptedScorer(), _pairs(("p1", "a", "b")), DiscConfig(only=["reasoning"]),
                                    clock=Clock(0.0, 1.0)), "reward-x", PRICES)
    assert unknown["gpus"] is None and unknown["gpu_hours"] is None and unknown["cost_usd"] is None


def test_one_cost_table_for_llm_tokens_and_reward_gpu_hours():
    report = {"usage": {"model": "judge", "calls": 8, "cached_calls": 0, "prompt_tokens": 1000,
                        "completion_tokens": 250, "seconds": 12.5, "cost_usd": 0.002},
              "usage_disc": {"kind": "GPU-hours", "model": "reward-armo", "pairs": 4, "scored": 8,
                             "seconds": 5400.0, "devices": ["cuda:0", "cuda:1"], "gpus": 2, "gpu_hours": 3.0,
                             "gpu_hour_price": 2.5, "cost_usd": 7.5}}
    rows = cost_rows(report)
    # 1000 + 250 = 1250 tokens; (1000 x 1 + 250 x 4) / 1M = 0.002
    assert rows == [["LLM judge judge", "tokens", "8 calls", "1250", "12.5", "–", "0.0020 USD"],
                    ["reward model reward-armo", "GPU-hours", "4 pairs", "–", "5400", "3", "7.5000 USD"]]
    md = cost_markdown(report)
    assert "| " + " | ".join(COST_COLUMNS) + " |" in md
    assert "| reward model `reward-armo` | GPU-hours | 4 pairs | – | 5400 | 3 | 7.5000 USD |" in md
    assert "seed 004, Table 3" in md and "cuda:0, cuda:1: 2 GPU(s)" in md
    # the detect job's nested usage, an unpriced reward model on the CPU, no price table for the LLM
    nested = {"usage": {"generator": {"model": "w", "calls": 2, "prompt_tokens": 10, "completion_tokens": 5,
                                      "seconds": 1.0}},
              "usage_disc": {"model": "r", "pairs": 3, "seconds": 30.0, "devices": ["cpu"], "gpus": 0,
                             "gpu_hours": 0.0, "cost_usd": None}}
    assert cost_rows(nested) == [["generator (LLM) w", "tokens", "2 calls", "15", "1", "–", "–"],
                                 ["reward model r", "GPU-hours", "3 pairs", "–", "30", "0 (CPU)", "no price"]]
    assert cost_markdown({"usage": {}}) == ""
