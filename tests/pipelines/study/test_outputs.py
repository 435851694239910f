"""Jobs declare what they write (`pipelines/core/outputs.py`), and the study reads those
declarations: every file the report reads from a step's folder is one its job
declares (recorded while the planted study of test_report.py is reported), the report's
sections name no file themselves, what the real jobs wrote there is declared, and a plan
refuses a path into an upstream step's folder that its job does not write."""
from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from rexeval.pipelines.core.outputs import Output, Outputs, table_outputs
from rexeval.pipelines.core.study_registry import STUDY_JOBS
from tests.pipelines.study.test_plan import SAMPLE, plan_of, problems, study_dict
from tests.pipelines.study.test_report import study  # noqa: F401  (the planted study, a fixture)

REPO = Path(__file__).resolve().parents[3]
FILE_NAME = r"^[\w.{}-]+\.(json|md|parquet|csv|png|svg|html)$"


# ------------------------------------------------------------------ the declarations


def test_an_output_is_its_path_and_says_what_it_holds():
    o = Output("aggregates.parquet", "means", columns=["system", "mean"])
    assert o == "aggregates.parquet" and f"{o}" == "aggregates.parquet" and hash(o) == hash("aggregates.parquet")
    assert (o.what, o.columns, o.folder, o.name) == ("means", ("system", "mean"), False, "aggregates.parquet")
    assert pickle.loads(pickle.dumps(o)).columns == ("system", "mean")
    with pytest.raises(AttributeError):
        o.what = "other"
    t = Output("results/{method}/per_interaction.parquet")
    assert t.format(method="EXPGCN") == "results/EXPGCN/per_interaction.parquet" and t.name == "per_interaction.parquet"
    assert t.matches("results/EXPGCN/per_interaction.parquet") and not t.matches("results/EXPGCN/summary.json")
    for bad in ("", "/abs.json", "folder/"):
        with pytest.raises(ValueError):
            Output(bad)


def test_outputs_by_name_and_by_path():
    outs = table_outputs("statements", "errors") | Outputs(report=Output("report.md", "a table"))
    assert outs.statements == "statements" and outs["report"].what == "a table"
    assert list(outs) == ["statements", "errors", "manifest", "report"]
    assert outs.paths() == ["statements", "errors", "manifest.json", "report.md"]
    assert outs.declares("statements/part-00000.parquet") and outs.declares("report.md")
    assert not outs.declares("statement/part-00000.parquet") and not outs.declares("report.json")
    with pytest.raises(AttributeError, match="no output 'repot' is declared"):
        outs.repot
    with pytest.raises(ValueError, match="method of Outputs"):
        Outputs(items=Output("x.json"))


def test_every_study_job_declares_what_it_writes():
    for name in STUDY_JOBS.names():
        outputs = STUDY_JOBS[name].outputs
        assert outputs, f"study job {name} declares no outputs"
        paths = outputs.paths()
        assert len(paths) == len(set(paths)), f"{name}: a path declared twice: {paths}"


def test_report_sections_name_no_file():
    """Every file name a section reads comes from a declaration (patterns such as `*.md`,
    a job folder's own Markdown, are no file names)."""
    import re

    tree = ast.parse((REPO / "pipelines" / "study" / "report_sections.py").read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docstrings and re.match(FILE_NAME, n.value)]
    assert names == []


# ------------------------------------------------------------------ the report reads declared files


@pytest.fixture
def reads(monkeypatch) -> list[tuple[str, tuple | None]]:
    """(path, columns) of every file found or read through the storage module or Parquet
    while the test runs."""
    import rexeval.pipelines.core.io as io
    import rexeval.pipelines.study.report_sections as sections
    from rexeval.storage import Location, location

    seen: list[tuple[str, tuple | None]] = []
    info, read_bytes, open_input, read_parquet = Location._info, Location.read_bytes, Location.open_input, \
        io.read_parquet

    def _info(self):
        got = info(self)
        if got.type != pafs.FileType.NotFound:
            seen.append((self.uri, None))
        return got

    def _read_bytes(self):
        data = read_bytes(self)
        seen.append((self.uri, None))
        return data

    def _open_input(self):
        fh = open_input(self)
        seen.append((self.uri, None))
        return fh

    def _read_parquet(path, columns=None):
        table = read_parquet(path, columns=columns)
        seen.append((location(path).uri, tuple(columns) if columns else None))
        return table

    monkeypatch.setattr(Location, "_info", _info)
    monkeypatch.setattr(Location, "read_bytes", _read_bytes)
    monkeypatch.setattr(Location, "open_input", _open_input)
    monkeypatch.setattr(io, "read_parquet", _read_parquet)
    monkeypatch.setattr(sections, "read_parquet", _read_parquet)
    return seen


def _plant_more(d: Path) -> list[tuple[str, str, str]]:
    """Step folders test_report's study lacks: metric agreement (evaluate), the ensemble
    sweep (meta_evaluate), a reward model's cost (judge_pairwise)."""
    from tests.pipelines.study import test_report_correlations as corr
    from tests.pipelines.study import test_report_judge_cost as cost
    from tests.pipelines.study import test_report_meta_ensemble as meta

    d.mkdir()
    corr._plant(d / "corr", with_correlations=True)
    (d / "sweep").mkdir()
    meta._section(d / "sweep", sweep=True)
    cost._plant(d / "cost", {"job": "judge pairwise", "pairs": 4, "errors": 0, "usage": cost.LLM,
                             "usage_disc": cost.DISC}, with_disc=True)
    return [("evaluate", "corr", "corr"), ("meta_evaluate", "sweep", "sweep/meta"), ("judge_pairwise", "cost", "cost")]


def test_every_file_the_report_reads_is_declared_by_the_job_that_wrote_it(study, reads, tmp_path):  # noqa: F811
    import json

    from rexeval.pipelines.core.io import write_json_atomic
    from rexeval.pipelines.study.report import build_report

    d = tmp_path / "more"
    steps = {name: {"job": job, "out": str(d / out), "status": "complete"} for job, name, out in _plant_more(d)}
    write_json_atomic(d / "study.json", {"name": "more", "steps": steps})
    reads.clear()
    folders: dict[str, str] = {}
    for root in (study["dir"], d):
        state = json.loads((root / "study.json").read_text())
        folders.update({str(Path(rec["out"])): rec["job"] for rec in state["steps"].values()})
        build_report(root)
    assert len(reads) > 50
    checked, undeclared = set(), []
    for path, columns in reads:
        out = max((f for f in folders if path.startswith(f + "/")), key=len, default=None)
        if out is None or folders[out] not in STUDY_JOBS.names():  # the study's own files; a job it does not know
            continue
        job, rel = folders[out], path[len(out) + 1:]
        outputs = STUDY_JOBS[job].outputs
        checked.add(job)
        if not outputs.declares(rel):
            undeclared.append(f"{job}: {rel}")
        for o in (o for o in outputs.values() if columns and o.columns and o.matches(rel)):
            assert set(columns) <= set(o.columns), f"{job}: {rel} read for undeclared columns {columns}"
    assert undeclared == []
    assert checked >= {"stats", "evaluate", "cluster", "star_build", "star_baselines", "star_train", "generate_llm",
                       "judge_likert", "judge_pairwise", "judge_detect", "judge_winrate", "meta_evaluate"}


def test_what_the_real_jobs_wrote_is_declared(study):  # noqa: F811
    """The planted study ran these jobs' own writers (run_winrate, run_meta_evaluate,
    cluster's write_report, the baselines' write_results): every file they left is one
    their job declares."""
    d = study["dir"]
    for job, folder in (("judge_winrate", "winrate"), ("meta_evaluate", "meta"), ("cluster", "cluster@mi"),
                        ("star_baselines", "mi/baselines")):
        root = d / folder
        for f in root.rglob("*"):
            if f.is_file():
                rel = f.relative_to(root).as_posix()
                assert STUDY_JOBS[job].outputs.declares(rel), f"{job} wrote {rel}, which it does not declare"


# ------------------------------------------------------------------ the plan checks paths into other steps


def flip_study(explanations: str) -> dict:
    return study_dict(
        flip={"job": "flip_benchmark", "with": {"input": str(SAMPLE / "statements.jsonl")}, "datasets": ["a"]},
        scores={"job": "evaluate", "datasets": ["a"],
                "with": {"explanations": [explanations], "references": "{flip}/ground_truth"}})


def test_a_path_a_step_reads_from_another_must_be_one_that_step_writes(tmp_path):
    msg = problems(tmp_path, flip_study("{flip}/explanation.parquet"))
    assert "steps.scores.with.explanations (dataset a): " in msg
    assert ("explanation.parquet: job flip_benchmark (step flip) writes no explanation.parquet; it writes "
            "ground_truth, explanations.parquet, statements.parquet, manifest.json") in msg
    plan = plan_of(tmp_path, flip_study("{flip}/explanations.parquet"))
    assert plan.instances["scores@a"].deps == {"flip@a"}
    plan_of(tmp_path, flip_study("{flip}/ground_truth/explanations"))  # inside a declared folder
