"""The planted extensions (tests/extension/planted/), each one file where its kind lives,
reach everything a built-in reaches: the lists `--help` prints, their job, the results.
Copied into a scratch checkout by scripts/check_extension.py; never run in the repository."""
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli
from tests.pipelines.judge.test_jobs import bench  # noqa: F401  (a module fixture)
from tests.pipelines.study.test_runner import SAMPLE, plan_of

pytestmark = pytest.mark.slow


def _help(*args: str) -> str:
    res = CliRunner().invoke(cli, [*args, "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    return res.output


def test_every_list_names_them():
    from tests.test_docs import _registries_hook

    docs = _registries_hook()  # the lists the docs site generates
    assert "`scratch-words`" in docs.metrics_table() and "`scratch_history`" in docs.prompted_methods_table()
    assert "scratch_history" in _help("generate", "llm")
    assert "scratch_shorter" in _help("judge", "pairwise") and "scratch_shorter" in _help("judge", "detect")
    res = CliRunner().invoke(cli, ["study", "jobs"])
    assert res.exit_code == 0 and any(x.startswith("scratch_count ") for x in res.output.splitlines()), res.output


def test_the_metric_is_computed_when_asked(ray_session, tmp_path):
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.inputs import write_flip_benchmark
    from rexeval.pipelines.evaluate.pipeline import run_evaluate
    from tests.pipelines.evaluate.test_pipeline import SCRIPTED_NLI

    flip = write_flip_benchmark(statements_from_annotations(SAMPLE / "statements.jsonl", stage="triplet"),
                                tmp_path / "flip")
    out = tmp_path / "eval"
    rep = run_evaluate(EvaluateConfig(explanations=[flip["explanations"]], references=flip["references"],
                                      statements=[flip["statements"]], out=str(out), limit=8, bootstrap=50,
                                      models={"nli": "scripted"}, nli_scorer=SCRIPTED_NLI,
                                      metrics=["scratch-words"]), progress=lambda s: None)
    assert rep["families_run"] == ["texts"]
    expl = pd.read_parquet(flip["explanations"])
    agg = pd.read_parquet(out / "aggregates.parquet")
    assert set(agg["metric"]) == {"scratch-words"}
    for r in agg.itertuples(index=False):
        mine = expl[expl["system"] == r.system].head(8)["explanation"].str.split().str.len()
        assert r.mean == pytest.approx(mine.mean())
    assert "### Scratch: explanation length" in (out / "tables.md").read_text()


def test_the_evaluator_judges_the_pairs(bench, tmp_path):  # noqa: F811
    from rexeval.pipelines.judge.config import PairwiseJobConfig
    from rexeval.pipelines.judge.jobs import run_pairwise
    from rexeval.pipelines.judge.winrate import read_runs

    expl = pd.read_parquet(bench["explanations"])
    base = sorted(set(expl["system"]) - {"flipped"})[0]
    rep = run_pairwise(PairwiseJobConfig(explanations=[bench["explanations"]], reviews=[bench["reviews"]], limit=3,
                                         baseline=base, evaluators=["scratch_shorter"], out=str(tmp_path / "pw")),
                       progress=lambda m: None)
    v = pd.read_parquet(tmp_path / "pw" / "verdicts_scratch_shorter.parquet")
    words = expl.set_index(["system", "example_id"])["explanation"].str.split().str.len()
    for r in v.itertuples(index=False):
        mine, theirs = words[(r.system, r.example_id)], words[(base, r.example_id)]
        assert r.verdict == ("A" if mine < theirs else "B" if mine > theirs else "C")
    assert rep["usage_scratch_shorter"] == {"pairs": len(v)}
    long, _ = read_runs([str(tmp_path / "pw")])
    assert set(long["judge"]) == {"scratch_shorter"}


def test_the_study_job_runs_in_a_study(ray_session, tmp_path):
    from rexeval.pipelines.study.runner import run_study

    study = {"name": "scratch", "max_parallel": 2,
             "datasets": {"sample": {"inputs": [str(SAMPLE / "reviews.jsonl")]}},
             "steps": {"ingest": {"job": "ingest", "with": {"inputs": "{dataset.inputs}"}},
                       "rows": {"job": "scratch_count", "with": {"input": "{ingest}"}}}}
    res = run_study(plan_of(tmp_path, study), progress=lambda _: None)
    assert res["failed"] == {} and "rows@sample" in res["ran"]
    ingested = json.loads((tmp_path / "out" / "sample" / "ingest" / "manifest.json").read_text())
    manifest = json.loads((tmp_path / "out" / "sample" / "rows" / "manifest.json").read_text())
    assert manifest["counts"]["rows"] == ingested["counts"]["out"] > 0
    assert Path(tmp_path / "out" / "sample" / "rows" / "rows.md").read_text().endswith(f"| {manifest['counts']['rows']} |\n")
