"""Seed 004's win-rate study end to end on the shared reviews with the real local LLM
(the packaged SmolLM2-135M, role `llm`, hf backend, in-process on the CPU; slow):

1. `rexeval ingest` of the shared CSV;
2. `rexeval generate llm` with all five prompted generators on the latest review of the
   first few users with two or more reviews (the BiasedMF Tune trial included);
3. the same job again: every chunk is finished, so no chunk is re-run (its shards are
   not rewritten) and the explanations table is the same;
4. `rexeval judge pairwise` of every system against `preference_logic`;
5. `rexeval judge winrate`: Figure 5, Table 4 and winrate.csv.

SmolLM2-135M is far too small for either role, and its verdicts are NOT meaningful:
its explanations are rambling or repeat the prompt (cut at 48 tokens to keep the CPU
time down), those the word-count parser rejects become `unparseable` error rows, and
the win rates it gives say nothing about the generators. What is checked is the
plumbing and the accounting: every interaction of every method ends in an explanation
or an error row, every explanation in a verdict row or an error row, a re-run makes no
LLM call, and the win-rate report names every judged system.
"""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.generate.prompted.inputs import load_inputs

pytestmark = pytest.mark.slow

ALL = ["user_based", "item_based", "review_extract", "review_summary", "preference_logic"]
BASELINE = "preference_logic"
LIMIT = 2


def _job(root: Path, cache: Path):
    from rexeval.pipelines.generate.prompted.config import PromptedJob

    return PromptedJob(input=str(root / "ingest"), methods=ALL, out=str(root / "generate"), limit=LIMIT,
                       judge_service="none", cache=str(cache), chunk_size=LIMIT,
                       # Short answers, one retry, shorter summary prompts: CPU time (2 cores in CI).
                       settings={"max_tokens": 48, "max_retries": 1, "summary_reviews": 4,
                                 "summary_review_words": 40, "mf": {"mf_epochs": 5}})


def _shards(folder: Path) -> dict[str, int]:
    """Every chunk's files (answers, usage, done marker) and their mtimes; the payload
    and the manifest are rewritten by every run."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("part-*"))}


def _asks_the_llm(plan: pd.DataFrame) -> bool:
    return bool((plan["skip"].isna() & plan["messages"].notna()).any())


@pytest.fixture(scope="module")
def study(ray_session, shared_csv, tmp_path_factory):
    from rexeval.pipelines.generate.prompted.job import run_prompted
    from rexeval.pipelines.ingest.config import IngestConfig
    from rexeval.pipelines.ingest.pipeline import run_ingest

    root = tmp_path_factory.mktemp("winrate-real")
    cache = root / "llm.sqlite"
    times = {}
    t0 = time.time()
    run_ingest(IngestConfig(inputs=[str(shared_csv)], out=str(root / "ingest"), category="instruments"),
               progress=lambda m: None)
    times["ingest"] = time.time() - t0
    t0 = time.time()
    lines: list[str] = []
    first = run_prompted(_job(root, cache), progress=lines.append)
    times["generate"] = time.time() - t0
    return {"root": root, "cache": cache, "report": first, "lines": lines, "times": times}


def test_every_interaction_of_every_method_ends_in_an_explanation_or_an_error_row(study):
    root, report = study["root"], study["report"]
    out = root / "generate"
    expl = pd.read_parquet(out / "explanations.parquet")
    errors = pd.read_parquet(out / "errors.parquet")
    assert report["interactions"] == LIMIT
    assert len(expl) + len(errors) == LIMIT * len(ALL)
    for m in ALL:
        c = report["methods"][m]
        got = set(expl.loc[expl["system"] == m, "example_id"])
        failed = {r.split("|", 1)[1] for r in errors.loc[errors["row_id"].str.startswith(m + "|"), "row_id"]}
        assert c["explanations"] == len(got) and c["errors"] == len(failed), m
        assert c["explanations"] + c["errors"] == LIMIT and not got & failed, m
    # The interactions explained: each user's latest review (users with two or more).
    reviews = read_table(root / "ingest" / "reviews", "reviews").to_pandas()
    targets = set(expl["example_id"]) | {r.split("|", 1)[1] for r in errors["row_id"]}
    assert len(targets) == LIMIT
    picked = reviews[reviews["review_id"].isin(targets)]
    assert picked["user_id"].is_unique
    by_user = reviews.groupby("user_id")
    assert (by_user["review_id"].count().loc[picked["user_id"]] >= 2).all()
    assert (picked["timestamp"].to_numpy() == by_user["timestamp"].max().loc[picked["user_id"]].to_numpy()).all()
    # Review extraction needs no LLM: every interaction whose item another shopper
    # reviewed in the known data gets one (unless no sentence of theirs has 4 to 30
    # words: no_sentence), the others a no_reviews error row.
    known = load_inputs(root / "ingest", min_reviews=2).known
    readable = set(picked.loc[picked["item_id"].isin(set(known["item_id"])), "review_id"])
    extracted = set(expl.loc[expl["system"] == "review_extract", "example_id"])
    kinds = errors[errors["row_id"].str.startswith("review_extract|")].set_index("row_id")["error_type"]
    assert extracted <= readable and readable
    assert {i: kinds[f"review_extract|{i}"] for i in targets - extracted} == {
        i: "no_sentence" if i in readable else "no_reviews" for i in targets - extracted}
    usage = report["usage"]
    assert usage["calls"] > 0 and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert report["biased_mf"]["users"] > 0


def test_a_rerun_runs_no_chunk_and_gives_the_same_table(study):
    from rexeval.models.llm.cache import LLMCache
    from rexeval.pipelines.generate.prompted.job import run_prompted

    root = study["root"]
    out = root / "generate"
    asked = [m for m in ALL if _asks_the_llm(pd.read_parquet(out / m / "plan.parquet"))]
    assert "review_extract" not in asked and BASELINE in asked
    shards = {m: _shards(out / m / "calls") for m in asked}
    assert all(shards.values())
    first = pd.read_parquet(out / "explanations.parquet")
    calls_cached = len(LLMCache(study["cache"]))
    t0 = time.time()
    again = run_prompted(_job(root, study["cache"]), progress=lambda m: None)
    study["times"]["rerun"] = time.time() - t0
    for m, before in shards.items():
        assert _shards(out / m / "calls") == before, m  # no chunk ran again
    assert len(LLMCache(study["cache"])) == calls_cached  # and no LLM call was made
    pd.testing.assert_frame_equal(pd.read_parquet(out / "explanations.parquet"), first)
    assert again["methods"] == study["report"]["methods"]
    assert again["usage"] == study["report"]["usage"]  # the finished chunks' usage, counted again


@pytest.fixture(scope="module")
def judged(study):
    from rexeval.pipelines.judge.config import PairwiseJobConfig
    from rexeval.pipelines.judge.jobs import run_pairwise

    root = study["root"]
    if not study["report"]["methods"][BASELINE]["explanations"]:
        pytest.skip(f"SmolLM2 wrote no readable {BASELINE} explanation: nothing to judge against")
    t0 = time.time()
    report = run_pairwise(PairwiseJobConfig(
        explanations=[str(root / "generate" / "explanations.parquet")], baseline=BASELINE,
        reviews=[str(root / "ingest")], out=str(root / "pairwise"), judge_service="none", divide=False,
        both_orders=False, max_tokens=64, max_retries=1, cache=str(study["cache"]), chunk_size=16),
        progress=lambda m: None)
    study["times"]["pairwise"] = time.time() - t0
    return report


def test_every_explanation_is_judged_against_the_baseline_or_an_error_row(study, judged):
    root = study["root"]
    expl = pd.read_parquet(root / "generate" / "explanations.parquet")
    verdicts = pd.read_parquet(root / "pairwise" / "verdicts.parquet")
    errors = pd.read_parquet(root / "pairwise" / "errors.parquet")
    base = set(expl.loc[expl["system"] == BASELINE, "example_id"])
    others = expl[expl["system"] != BASELINE]
    expected = {f"{r.system}|{r.example_id}" for r in others.itertuples() if r.example_id in base}
    assert sorted(verdicts["pair_id"]) == sorted(expected) and judged["pairs"] == len(expected)
    assert set(errors["row_id"]) == {f"{r.system}|{r.example_id}" for r in others.itertuples()} - expected
    assert set(errors["error_type"]) <= {"no_baseline"}
    assert (verdicts["baseline"] == BASELINE).all()
    assert verdicts["verdict"].dropna().isin(["A", "B", "C"]).all()
    if expected:
        assert judged["usage"]["calls"] >= len(expected)


def test_the_winrate_report_names_every_judged_system(study, judged):
    from rexeval.pipelines.judge.winrate import WinrateConfig, run_winrate

    root = study["root"]
    verdicts = pd.read_parquet(root / "pairwise" / "verdicts.parquet")
    if verdicts.empty:
        pytest.skip(f"no explanation shares an example with a {BASELINE} one: nothing was judged")
    t0 = time.time()
    report = run_winrate(WinrateConfig(runs=[str(root / "pairwise")], out=str(root / "winrate"), resamples=200),
                         progress=lambda m: None)
    study["times"]["winrate"] = time.time() - t0
    out = root / "winrate"
    for name in ("figure5.png", "figure5.svg", "table4.md", "winrate.csv"):
        assert (out / name).stat().st_size > 0, name
    systems = sorted(set(verdicts["system"]))
    svg = (out / "figure5.svg").read_text()
    assert all(s in svg for s in systems)
    assert sorted(report["systems"]) == systems and report["counts"]["verdicts"] == len(verdicts)
    print("timings:", {k: round(v, 1) for k, v in study["times"].items()})
