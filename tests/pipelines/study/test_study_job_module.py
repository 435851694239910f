"""A study job is one file: `rexeval.pipelines.<capability>.study_job` registers it, and
the study finds it (the plan, `rexeval study jobs`, a step's own process, the report)
without any other product file naming it. `statement_stats` (pipelines/ingest/study_job.py)
is such a job: seed 000's Table II with its Statements rows, run here in a small study
on the shipped sample (its hand-written statements)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rexeval import LAYERS
from rexeval.pipelines.core.study_registry import STUDY_JOBS, study_job_modules
from tests.pipelines.study.test_runner import SAMPLE, plan_of

REPO = Path(__file__).resolve().parents[3]
MODULE = "rexeval.pipelines.ingest.study_job"


def test_the_job_module_is_found_and_nothing_else_names_it():
    assert MODULE in study_job_modules()
    assert "statement_stats" in STUDY_JOBS.names()
    job = STUDY_JOBS["statement_stats"]
    assert job.target.__module__ == MODULE and job.outputs.paths() == ["manifest.json", "table2.md"]
    product = [f for top in (*LAYERS, "rexeval") for f in (REPO / top).rglob("*.py")]
    name = re.compile(r"\bstatement_stats\b")  # the job's name (not ingest.stats._statement_stats)
    naming = sorted(str(f.relative_to(REPO)) for f in product if name.search(f.read_text(encoding="utf-8")))
    assert naming == ["pipelines/ingest/study_job.py"]


def test_rexeval_study_jobs_lists_it():
    from rexeval.ray_jobs.study import study_jobs_cmd

    res = CliRunner().invoke(study_jobs_cmd, [])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("statement_stats "))
    assert "Statements rows" in line and "StatementStatsConfig" in line


def test_a_fresh_interpreter_finds_it_through_the_plan():
    """Only the study's modules imported, as `rexeval study run` starts: the plan knows
    the job without anything importing its module first."""
    import subprocess

    code = ("import sys; from rexeval.pipelines.study.plan import STUDY_JOBS; "
            f"assert {MODULE!r} not in sys.modules; assert 'statement_stats' in STUDY_JOBS.names(); "
            f"assert {MODULE!r} in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def small_study() -> dict:
    return {"name": "table2", "max_parallel": 2,
            "datasets": {"sample": {"inputs": [str(SAMPLE / "reviews.jsonl")],
                                    "vars": {"statements": str(SAMPLE / "statements.jsonl")}}},
            "steps": {
                "ingest": {"job": "ingest", "with": {"inputs": "{dataset.inputs}"}},
                "split": {"job": "split", "with": {"input": "{ingest}"}},
                "annotated": {"job": "annotations", "with": {"input": "{dataset.statements}"}},
                "table2": {"job": "statement_stats",
                           "with": {"input": "{split}", "statements": "{annotated}", "name": "{dataset}"}}}}


def test_a_plan_checks_its_settings_like_any_job(tmp_path):
    from rexeval.pipelines.study.config import StudyError

    data = small_study()
    plan = plan_of(tmp_path, data)
    assert plan.instances["table2@sample"].deps == {"split@sample", "annotated@sample"}
    data["steps"]["table2"]["with"]["statments"] = "{annotated}"
    with pytest.raises(StudyError, match="steps.table2.with .dataset sample.*statments: unknown key"):
        plan_of(tmp_path, data)


@pytest.mark.slow
def test_statement_stats_runs_in_a_study_and_is_reported(tmp_path, ray_session):
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.core.io import read_table
    from rexeval.pipelines.ingest.stats import dataset_stats
    from rexeval.pipelines.study.report import build_report
    from rexeval.pipelines.study.runner import run_study

    res = run_study(plan_of(tmp_path, small_study()), progress=lambda _: None)
    assert res["failed"] == {} and "table2@sample" in res["ran"]
    folder = tmp_path / "out" / "sample" / "table2"
    manifest = json.loads((folder / "manifest.json").read_text())
    split = tmp_path / "out" / "sample" / "split"
    want = dataset_stats({n: read_table(split / n, "reviews") for n in ("train", "valid", "test")},
                         statements_from_annotations(SAMPLE / "statements.jsonl"))
    got = manifest["stats"]["sample"]
    assert manifest["stage"] == "verified" and got["statements_total"] == want["statements_total"] > 0
    assert got["statements_unique"] == want["statements_unique"]
    assert got["statements_per_interaction"] == pytest.approx(want["statements_per_interaction"])
    assert manifest["counts"]["statements"] == want["statements_total"]
    assert "Avg/interaction" in (folder / "table2.md").read_text()

    report = build_report(tmp_path / "out")
    sec = next(s for s in report.sections if s.instances == ["table2@sample"])
    assert sec.job == "statement_stats" and not sec.notes
    table = next(t for t in sec.tables if t.title == "table2.md (table2@sample)")
    assert table.columns == ["", "sample"]
    total = next(r for r in table.rows if r[0] == "&nbsp;&nbsp;Total")
    assert total[1].replace(" ", "") == str(want["statements_total"])
