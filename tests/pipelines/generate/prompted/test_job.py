"""`rexeval generate llm` end to end on Ray with the scripted LLM: the real BiasedMF Tune
trial, every method, an error row for every interaction a method cannot explain,
unreadable answers as error rows, and a re-run that makes no LLM call."""
import json
from pathlib import Path

import pandas as pd
import pytest

from rexeval.pipelines.generate.prompted.config import PromptedJob
from rexeval.pipelines.generate.prompted.job import run_prompted
from rexeval.pipelines.generate.prompted.methods import method_names
from tests.doubles.planted_shop import planted_ingest

pytestmark = pytest.mark.slow  # its fixture runs the whole prompted job once: the full tier only

# Every registered method, the built-ins and any added in one file (checked by the same contract).
ALL = method_names()
GOOD = "This fits the way you play, so you will enjoy every practice session and every gig with it."


def _calls(log: Path) -> int:
    return sum(1 for _ in open(log)) if log.exists() else 0


def _job(root: Path, log: Path, **kw) -> PromptedJob:
    # Summaries get a one-word answer, and so does the retry after it: they stay unreadable.
    rules = [["What buyers wrote about it", "Sure."], ["only 1 word", "Sure."]]
    return PromptedJob(input=str(root / "ingest"), methods=ALL, out=str(root / "out"),
                       backend="tests.doubles.llm:ScriptedLLM", models={"llm": "scripted-writer"},
                       backend_options={"rules": rules, "default": GOOD, "log": str(log)},
                       judge_service="none", chunk_size=4, use_cache=False,
                       settings={"mf": {"mf_epochs": 3, "mf_dim": 4}}, **kw)


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("generate_llm")
    planted_ingest(root)
    log = root / "calls.jsonl"
    lines = []
    report = run_prompted(_job(root, log), progress=lines.append)
    return root, log, report, lines


def test_every_interaction_ends_in_an_explanation_or_an_error_row(run):
    root, _, report, _ = run
    expl = pd.read_parquet(root / "out" / "explanations.parquet")
    errors = pd.read_parquet(root / "out" / "errors.parquet")
    assert report["interactions"] == 9
    for m in ALL:
        got = set(expl.loc[expl["system"] == m, "example_id"]) | {
            r.split("|", 1)[1] for r in errors.loc[errors["row_id"].str.startswith(m + "|"), "row_id"]}
        assert len(got) == 9, m
    kinds = errors.groupby(errors["row_id"].str.split("|").str[0])["error_type"].agg(lambda s: sorted(set(s)))
    assert kinds["user_based"] == ["no_neighbour"] and kinds["item_based"] == ["cold_item"]
    assert kinds["review_extract"] == ["no_reviews"]
    assert kinds["review_summary"] == ["no_reviews", "unparseable"]  # every summary answer was "Sure."
    assert "preference_logic" not in kinds
    assert (expl.loc[expl["system"] != "review_extract", "explanation"] == GOOD).all()
    assert expl["reference"].str.startswith("TXT-").all()  # the review text, kept for evaluate
    assert errors["message"].str.contains("example r-").all()
    assert report["methods"]["review_summary"]["explanations"] == 0
    assert report["biased_mf"]["users"] == 9 and report["provenance"]["prompt_versions"]["user_based"].startswith("explain_user_based/v1")


def test_the_table_is_what_evaluate_and_judge_read(run):
    from rexeval.pipelines.core.inputs import read_explanations

    root, _, _, _ = run
    t = read_explanations([str(root / "out" / "explanations.parquet")]).to_pandas()
    assert set(t["system"]) == set(ALL) - {"review_summary"}


def test_a_rerun_makes_no_llm_call_and_gives_the_same_table(run):
    root, log, report, _ = run
    before = _calls(log)
    first = pd.read_parquet(root / "out" / "explanations.parquet")
    lines = []
    again = run_prompted(_job(root, log), progress=lines.append)
    assert _calls(log) == before > 0
    assert any("restoring" in x for x in lines)  # the BiasedMF trial is restored, not retrained
    pd.testing.assert_frame_equal(pd.read_parquet(root / "out" / "explanations.parquet"), first)
    assert again["methods"] == report["methods"]


def test_the_llm_sees_exactly_the_planned_prompts(run):
    root, log, _, _ = run
    planned = set()
    for m in ALL:
        plan = pd.read_parquet(root / "out" / m / "plan.parquet")
        planned |= {json.loads(x)[-1]["content"][-200:] for x in plan["messages"].dropna()}
    sent = {json.loads(line)["last"] for line in open(log)}
    retries = {s for s in sent if s not in planned}
    assert planned <= sent and all("word" in s for s in retries)  # only the retry feedback is extra


def test_the_methods_share_one_model_load(run):
    """Every method's chunks go to the same engines: the job loads its model once (each
    method used to start and load its own), and says so per method."""
    _, _, _, lines = run
    engines = [line for line in lines if "scripted-writer:" in line and "call(s) for" in line]
    asked = [line for line in lines if line.strip().startswith("explain_") and "rows in" in line]
    assert len(engines) == len(asked) >= 4, lines
    assert sum("its engines started 1x" in line for line in engines) == 1, engines
    assert all("the job's engines, already started" in line for line in engines[1:]), engines
