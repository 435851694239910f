"""The chunk task of the prompted generators: ask the LLM each planned prompt, read the
explanation out of the answer (retrying an unreadable one with the reason), and return
one row per prompt: the explanation, or why there is none. Run by
`pipelines.core.llm.chunks.run_chunks`, which records its questions per chunk, streams
them, and runs it again over the answers to write the chunk."""
from __future__ import annotations

import functools
import json

import pandas as pd

ANSWER_COLUMNS = ("example_id", "explanation", "error_type", "message", "raw")


def explain_task(llm, rows: pd.DataFrame, settings: dict):
    from rexeval.models.llm.base import SamplingParams
    from rexeval.pipelines.core.llm.calls import ask
    from rexeval.pipelines.generate.prompted.parse import parse_explanation

    s = settings["explain"]
    asked = f"{s['asked_words']} words"
    parse = functools.partial(parse_explanation, min_words=s["min_words"], max_words=s["max_words"], asked=asked)
    sampling = SamplingParams(temperature=s["temperature"], max_tokens=s["max_tokens"], seed=s["seed"])
    convs = [json.loads(m) for m in rows["messages"]]
    answers, stats = ask(llm, convs, parse, sampling=sampling, max_retries=s["max_retries"],
                         expected=f"the explanation alone, {asked}, with no label or quotes")
    out = pd.DataFrame({
        "example_id": rows["example_id"].to_numpy(),
        "explanation": [a.value for a in answers],
        "error_type": [None if a.ok else ("llm_error" if a.error else "unparseable") for a in answers],
        "message": [None if a.ok else (a.error or a.problem) for a in answers],
        "raw": [a.raw for a in answers]}, columns=list(ANSWER_COLUMNS))
    return {"answers": out.astype(object)}, stats
