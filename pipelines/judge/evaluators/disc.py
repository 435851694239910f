"""`disc`: a reward model as the pairwise evaluator of seed 004 (ALERT-Disc).

The model (`--reward-model`, a sequence-classification folder) scores both explanations
of a pair per criterion on Ray actors sized by the job's worker settings, never in the
driver (`pipelines/judge/disc.py`); the higher score wins. It bills no tokens: its usage
is the scoring's seconds, GPUs and GPU-hour cost (`usage_disc`), and pairwise.md adds
the cost table that sets it beside the LLM judge's tokens (seed 004, Table 3).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from rexeval.pipelines.judge.evaluators import Evaluator, Judged, JudgeRun, register_evaluator


def disc_verdicts(cfg, pairs: pd.DataFrame, progress) -> tuple[pd.DataFrame, dict]:
    """The reward-model judge (ALERT-Disc) on `pairs` (pair_id, user_profile,
    item_description, explanation_a, explanation_b), scored on Ray actors
    (`disc.run_disc_on_ray`), with the job's rubric, criteria
    subset (`only`, where the job has one) and divide setting: `judge_disc`'s verdicts,
    one row per pair (pair_id, verdict, score_a, score_b, then verdict_<unit>,
    score_a_<unit>, score_b_<unit> per criterion), and the scoring's usage record
    (seconds, devices, GPU-hours, cost at the model's gpu_hour price: `cost.reward_usage`)."""
    from rexeval.models.encoders.reward import build_reward_scorer
    from rexeval.models.llm.pricing import PriceTable
    from rexeval.pipelines.core.stage import worker_resources
    from rexeval.pipelines.judge.cost import reward_line, reward_usage
    from rexeval.pipelines.judge.disc import DiscConfig, DiscStage, run_disc_on_ray
    from rexeval.pipelines.judge.evaluators.gen import rubric_ref

    # The price table is read before the scoring, so a bad one fails before the work.
    prices = PriceTable.load(cfg.price_table) if cfg.price_table else None
    progress(f"  disc: scoring {len(pairs)} pair(s) with {cfg.reward_model}")
    dcfg = DiscConfig(criteria=rubric_ref(cfg.criteria), only=getattr(cfg, "only", None), divide=cfg.divide)
    # The model loads on Ray actors sized by the job's worker settings, never in this driver.
    stage = DiscStage(cfg.reward_model, dcfg, worker_resources(cfg, free=True), build=build_reward_scorer)
    run = run_disc_on_ray(stage, pairs, cfg.workers, cfg.min_workers)
    usage = reward_usage(run, cfg.reward_model, prices, cfg.price_table)
    progress(f"  disc: {reward_line(usage)}")
    return run.verdicts, usage


@register_evaluator("disc")
class RewardModelJudge(Evaluator):
    """A reward model (ALERT-Disc) scores both explanations per criterion; the higher
    score wins."""

    description = "a reward model (ALERT-Disc, verdicts_disc.parquet; --reward-model)"

    def check(self, cfg) -> None:
        if not cfg.reward_model:
            raise ValueError("the disc evaluator needs a reward model (--reward-model PATH: a "
                             "sequence-classification reward model)")

    def judge(self, pairs: pd.DataFrame, run: JudgeRun) -> Judged:
        verdicts, usage = disc_verdicts(run.cfg, pairs, run.progress)
        first = ["pair_id", "verdict"] + [c for c in verdicts.columns if c.startswith("verdict_")]
        return Judged(verdicts[first + [c for c in verdicts.columns if c not in first]], usage)

    def who(self, cfg, judged: Judged) -> str:
        return f"reward model `{cfg.reward_model}`"

    def label(self, report: dict) -> str:
        reward = report.get("reward_model")
        return f"ALERT-Disc ({Path(str(reward)).name})" if reward else "ALERT-Disc"

    def report_fields(self, cfg, judged: Judged) -> dict:
        return {"reward_model": cfg.reward_model}

    def notes(self, report: dict) -> list[str]:
        from rexeval.pipelines.judge.cost import cost_markdown

        return [cost_markdown(report)]
