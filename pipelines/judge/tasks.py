"""The work a judge job runs on one chunk of its rows, by name.

A task takes the chunk's LLM (a client of the judge deployment or an in-process
backend), the chunk's rows and the job's settings, and returns the chunk's tables and
its call statistics; `pipelines/core/llm/chunks.py` runs tasks over chunks on Ray and
writes each chunk as a resumable shard. A new kind of judge job is one more task here.
"""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import pyarrow as pa

from rexeval.registry import Registry

TASKS: Registry[Callable] = Registry("judge task", name_attr=None)
register_task = TASKS.register


@register_task("likert")
def _likert_task(llm, rows: pd.DataFrame, settings: dict):
    from rexeval.pipelines.judge.inputs import read_examples
    from rexeval.pipelines.judge.likert import LikertConfig, judge_likert

    # `examples_at`: a copy beside the job's output that every node reaches; any table
    # format, its columns renamed by `examples_columns` (set only when there are some).
    lcfg = LikertConfig(**settings["likert"])
    where = settings.get("examples_at") or settings.get("examples")
    examples = read_examples(where, lcfg.aspects, settings.get("examples_columns")) if where else None
    scores, stats = judge_likert(llm, rows, lcfg, examples=examples)
    return {"likert": scores}, stats


@register_task("pairwise")
def _pairwise_task(llm, rows: pd.DataFrame, settings: dict):
    from rexeval.pipelines.judge.pairwise import PairwiseConfig, judge_pairwise

    verdicts, detail, stats = judge_pairwise(llm, rows, PairwiseConfig(**settings["pairwise"]))
    return {"verdicts": verdicts, "detail": detail}, stats


@register_task("detect_generate")
def _generate_task(llm, rows: pd.DataFrame, settings: dict):
    from rexeval.pipelines.judge.detect import DetectSuiteConfig, generate_planned
    from rexeval.pipelines.core.schema import ERRORS

    pairs, errors, stats = generate_planned(rows, llm, DetectSuiteConfig(**settings["generate"]))
    errors = pa.Table.from_pylist(errors.astype(object).where(errors.notna(), None).to_dict("records"),
                                  schema=ERRORS)
    return {"pairs": pairs.astype({"replacement_id": object}), "errors": errors}, stats
