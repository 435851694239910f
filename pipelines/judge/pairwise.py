"""The generative pairwise judge of seed 004 (ALERT-Gen): two explanations for the same
user and item, reasoning against the criteria, then [[A]], [[B]] or [[C]].

Each pair is asked once per criterion (divide-and-aggregate: the criterion verdicts go
to a majority vote) or once with every criterion (the single-call variant), and, by
default, in both presentation orders: the swapped answer is mapped back and the two are
combined by a rule for disagreement (`metrics.preference.combine_orders`). How often the
verdict flips with the order is reported as position bias.

The explanations are untrusted data: they are fenced in the prompt, and any verdict
token written inside them ("... answer [[A]]") is defused to "[A]" before rendering, so
a judge that quotes the explanation cannot produce a readable verdict from it. The
verdict read is the last verdict token of the answer (the prompt asks for it last).
"""
from __future__ import annotations

import re
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from rexeval.metrics.preference import combine_orders, majority_vote, position_bias, swap

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)
_TOKEN = re.compile(r"\[\[\s*([ABC])\s*\]\]")
_LOOKALIKE = re.compile(r"\[\[\s*([A-Za-z])\s*\]\]")
ALL = "all"
PAIR_COLUMNS = ("pair_id", "user_profile", "item_description", "explanation_a", "explanation_b")
NO_HISTORY = "(no earlier purchases known)"


class CriteriaSettings(BaseModel):
    """Which rubric criteria a pairwise judge asks about, and how: what the generative
    judge (`PairwiseConfig`) and the reward model (`disc.DiscConfig`) share."""

    model_config = ConfigDict(extra="forbid")

    criteria: str = Field("alert_criteria", description="rubric name or a .yaml path")
    only: list[str] | None = Field(None, description="a subset of the rubric's criteria")
    divide: bool = Field(True, description="one question per criterion + majority vote (seed 004 D&A); "
                         "False: every criterion in one question")


def units(rubric, cfg: CriteriaSettings) -> list[tuple[str, list]]:
    """(unit name, criteria) per question: one per criterion, or one with them all."""
    items = list(rubric.subset(cfg.only).items)
    return [(i.name, [i]) for i in items] if cfg.divide else [(ALL, items)]


class PairwiseConfig(CriteriaSettings):
    """How the generative judge is asked."""

    both_orders: bool = Field(True, description="ask A/B and B/A and combine")
    disagreement: Literal["tie", "first"] = "tie"
    max_retries: int = Field(2, ge=0, le=10)
    max_tokens: int = Field(512, ge=8)
    # Seed 004 sampled its judge at 0.7; greedy (0) keeps verdicts reproducible and cacheable.
    temperature: float = Field(0.0, ge=0)
    seed: int = 0
    # Hold the answer to {"reasoning": ..., "verdict": "[[A]]" | "[[B]]" | "[[C]]"} where
    # the backend can constrain decoding, reasoning first as the seed asks; the verdict
    # token is still read from the text. False: free text, as seed 004's judge wrote.
    constrained: bool = True


def verdict_schema(max_tokens: int) -> dict:
    """Reasoning, then the verdict token; the reasoning is bounded so that the verdict
    still fits in `max_tokens` (about 3 characters per token, 24 tokens of JSON)."""
    return {"type": "object", "additionalProperties": False, "required": ["reasoning", "verdict"],
            "properties": {"reasoning": {"type": "string", "maxLength": max(40, 3 * (max_tokens - 24))},
                           "verdict": {"type": "string", "enum": ["[[A]]", "[[B]]", "[[C]]"]}}}


def parse_verdict(text: str) -> tuple[str | None, str | None]:
    """The last [[A]]/[[B]]/[[C]] of an answer (reasoning blocks dropped), or why none."""
    found = _TOKEN.findall(_THINK.sub(" ", text or ""))
    if not found:
        return None, "it held no verdict token [[A]], [[B]] or [[C]]"
    return found[-1], None


def defuse(text: str) -> str:
    """Data text with every verdict look-alike `[[X]]` turned into `[X]`."""
    return _LOOKALIKE.sub(r"[\1]", text or "")


def conversations(pairs: pd.DataFrame, cfg: PairwiseConfig) -> list[dict]:
    """Every call the judge needs: one per (pair, unit, order), with its messages."""
    from rexeval.prompts import load_prompt
    from rexeval.prompts.rubrics import load_rubric

    missing = [c for c in PAIR_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs lack column(s) {missing}")
    prompt, rubric = load_prompt("alert_pairwise"), load_rubric(cfg.criteria)
    orders = ("ab", "ba") if cfg.both_orders else ("ab",)
    tasks = []
    for row in pairs.itertuples(index=False):
        a, b = defuse(row.explanation_a), defuse(row.explanation_b)
        context = {"user_profile": defuse(row.user_profile) or NO_HISTORY,
                   "item_description": defuse(row.item_description)}
        for unit, items in units(rubric, cfg):
            for order in orders:
                first, second = (a, b) if order == "ab" else (b, a)
                tasks.append({"pair_id": row.pair_id, "unit": unit, "order": order,
                              "messages": prompt.render(criteria=items, explanation_a=first,
                                                        explanation_b=second, **context)})
    return tasks


def judge_pairwise(llm, pairs: pd.DataFrame, cfg: PairwiseConfig | None = None):
    """Verdicts for every pair (in the pair's own labels: A = explanation_a).

    Returns (verdicts, detail, stats): `verdicts` has one row per pair (pair_id, verdict,
    one `verdict_<unit>` column per criterion or `verdict_all`), `detail` one row per
    call (pair_id, unit, order, verdict mapped back to the pair's labels, problem, raw),
    and `stats` the CallStats of the calls.
    """
    from rexeval.models.llm.base import SamplingParams
    from rexeval.pipelines.core.llm.calls import ask

    cfg = cfg or PairwiseConfig()
    tasks = conversations(pairs, cfg)
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed)
    answers, stats = ask(llm, [t["messages"] for t in tasks], parse_verdict, sampling=sampling,
                         json_schema=verdict_schema(cfg.max_tokens) if cfg.constrained else None,
                         max_retries=cfg.max_retries, expected="a last line holding [[A]], [[B]] or [[C]]")
    detail = pd.DataFrame({
        "pair_id": [t["pair_id"] for t in tasks], "unit": [t["unit"] for t in tasks],
        "order": [t["order"] for t in tasks],
        "verdict": [a.value if t["order"] == "ab" else swap(a.value) for t, a in zip(tasks, answers)],
        "problem": [a.problem or a.error for a in answers], "raw": [a.raw for a in answers]})
    return _combine(pairs, detail, cfg), detail, stats


def _combine(pairs: pd.DataFrame, detail: pd.DataFrame, cfg: PairwiseConfig) -> pd.DataFrame:
    # An unreadable call is missing (pandas may hold it as NaN in a string column), not a verdict.
    by = {(r.pair_id, r.unit, r.order): None if pd.isna(r.verdict) else r.verdict
          for r in detail.itertuples(index=False)}
    units = list(dict.fromkeys(detail["unit"]))
    rows = []
    for pid in pairs["pair_id"]:
        row = {"pair_id": pid}
        for u in units:
            ab = by.get((pid, u, "ab"))
            row[f"verdict_{u}"] = (combine_orders(ab, by.get((pid, u, "ba")), cfg.disagreement)
                                   if cfg.both_orders else ab)
        per_unit = [row[f"verdict_{u}"] for u in units]
        row["verdict"] = majority_vote(per_unit) if cfg.divide else per_unit[0]
        rows.append(row)
    return pd.DataFrame(rows, columns=["pair_id", "verdict"] + [f"verdict_{u}" for u in units])


def order_bias(detail: pd.DataFrame) -> dict:
    """Position-bias statistics per unit and over all calls (pairs asked in both orders)."""
    out = {}
    groups = list(detail.groupby("unit", sort=False))
    if len(groups) > 1:  # the criteria together, then each one
        groups = [("overall", detail)] + groups
    for unit, part in groups:
        wide = part.pivot_table(index=["pair_id", "unit"], columns="order", values="verdict",
                                aggfunc="first", dropna=False)
        if "ba" not in wide.columns:
            continue
        first = [None if pd.isna(v) else v for v in wide["ab"]]
        second = [None if pd.isna(v) else v for v in wide["ba"]]
        out[unit] = position_bias(first, second)
    return out
