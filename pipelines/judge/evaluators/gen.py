"""`gen`: the LLM judge of seed 004 (ALERT-Gen), as a pairwise evaluator.

The profile's `judge_llm` (served once for the job, `judge_service`) answers each pair
per criterion and in both orders by default (`pipelines/judge/pairwise.py`), in
resumable chunks: `calls/` under a pairwise folder, `judge_gen/` under a detect folder.
It writes every call (calls.parquet) beside the verdicts and measures position bias.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from rexeval.pipelines.judge.evaluators import Evaluator, Judged, JudgeRun, judge_service, register_evaluator


def pairwise_settings(cfg) -> dict:
    """The chunks' settings of the LLM judge, from a pairwise or detect job's settings."""
    from rexeval.pipelines.judge.pairwise import PairwiseConfig

    return {"pairwise": PairwiseConfig(
        criteria=rubric_ref(cfg.criteria), only=getattr(cfg, "only", None), divide=cfg.divide,
        both_orders=cfg.both_orders, disagreement=cfg.disagreement, max_retries=cfg.max_retries,
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=cfg.seed,
        constrained=cfg.constrained).model_dump()}


def rubric_ref(ref: str) -> str:
    """A rubric as the workers find it: a name or URI as given, a local .yaml file resolved."""
    from rexeval.storage import is_uri

    if is_uri(ref):
        return ref
    p = Path(ref).expanduser()
    return str(p.resolve()) if p.suffix in (".yaml", ".yml") else ref


@register_evaluator("gen")
class LLMJudge(Evaluator):
    """The LLM judge (ALERT-Gen): it reasons against the criteria and answers [[A]], [[B]]
    or [[C]]."""

    description = "the LLM judge (ALERT-Gen, verdicts.parquet)"
    suffix = ""
    serves = "judge_llm"
    bills_tokens = True

    def judge(self, pairs: pd.DataFrame, run: JudgeRun) -> Judged:
        from rexeval.pipelines.core.llm.chunks import llm_spec, run_chunks, usage_totals
        from rexeval.pipelines.judge.config import DETECT_OUTPUTS, PAIRWISE_OUTPUTS
        from rexeval.pipelines.judge.tasks import TASKS

        cfg = run.cfg
        spec = llm_spec(cfg, run.profile)
        folder = run.root / (PAIRWISE_OUTPUTS.chunks if run.job == "pairwise" else DETECT_OUTPUTS.judge_gen)
        out = judge_service(cfg, spec, run.progress, lambda addr: run_chunks(
            "pairwise", TASKS.lookup("pairwise"), pairs, folder, ["verdicts", "detail"], pairwise_settings(cfg), spec,
            addr, cfg, run.progress))
        return Judged(out.read("verdicts").to_pandas(), usage_totals([out], cfg.price_table, spec["model"]),
                      detail=out.read("detail").to_pandas())

    def who(self, cfg, judged: Judged) -> str:
        return f"LLM judge `{judged.usage['model']}`"

    def label(self, report: dict) -> str:
        usage = report.get("usage") if isinstance(report.get("usage"), dict) else {}
        model = usage.get("model")
        return f"ALERT-Gen ({model})" if model else "ALERT-Gen"

    def position_bias(self, cfg, judged: Judged) -> dict:
        from rexeval.pipelines.judge.pairwise import order_bias

        if "position_bias" not in judged.extra:  # measured once, for the report and the table
            judged.extra["position_bias"] = order_bias(judged.detail) if cfg.both_orders else {}
        return judged.extra["position_bias"]

    def report_fields(self, cfg, judged: Judged) -> dict:
        return {"position_bias": self.position_bias(cfg, judged)}
