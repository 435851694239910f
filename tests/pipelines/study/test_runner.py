"""Running studies on Ray: a second run does nothing; a changed setting re-runs its step
and what depends on it, nothing else; a failing step skips its dependants and not the
rest; a driver killed mid-study and run again ends with the same results as a run that
was never interrupted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from rexeval.pipelines.study.config import load_study
from rexeval.pipelines.core.study_registry import STUDY_JOBS, StudyJob
from rexeval.pipelines.study.plan import build_plan
from rexeval.pipelines.study.runner import hard_failures, run_study

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "pipelines" / "sample"


def tiny_study(**changes) -> dict:
    steps = {
        "ingest": {"job": "ingest", "with": {"inputs": "{dataset.inputs}", "meta": "{dataset.meta}"}},
        "split": {"job": "split", "with": {"input": "{ingest}"}},
        "stats": {"job": "stats", "with": {"input": "{split}", "name": "{dataset}"}},
        "extract": {"job": "generate_llm", "with": {"input": "{split}", "methods": ["review_extract"],
                                                     "judge_service": "none"}},
    }
    for step, settings in changes.items():
        steps[step]["with"].update(settings)
    return {"name": "tiny", "max_parallel": 2,
            "datasets": {"sample": {"inputs": [str(SAMPLE / "reviews.jsonl")], "meta": [str(SAMPLE / "items.jsonl")]}},
            "steps": steps}


def plan_of(tmp_path, data: dict):
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return build_plan(load_study(f), f, tmp_path / "out")


def run(tmp_path, data: dict, lines: list[str] | None = None, **kw) -> dict:
    return run_study(plan_of(tmp_path, data), progress=(lines.append if lines is not None else lambda _: None), **kw)


@pytest.mark.slow
def test_second_run_nothing_changed_setting_reruns_its_step_and_downstream(tmp_path, ray_session):
    first = run(tmp_path, tiny_study())
    assert sorted(first["ran"]) == ["extract@sample", "ingest@sample", "split@sample", "stats@sample"]
    state = json.loads((tmp_path / "out" / "study.json").read_text())
    assert {k: v["status"] for k, v in state["steps"].items()} == dict.fromkeys(first["ran"], "complete")
    assert state["steps"]["ingest@sample"]["summary"]["out"] == 305
    train0 = state["steps"]["split@sample"]["summary"]["train"]

    lines: list[str] = []
    again = run(tmp_path, tiny_study(), lines)
    assert again["ran"] == [] and again["planned"] == []
    assert any("nothing to do" in line for line in lines)

    # The dry run says what would run and why, and runs nothing.
    lines = []
    dry = run(tmp_path, tiny_study(stats={"name": "renamed"}), lines, dry_run=True)
    assert dry["planned"] == ["stats@sample"]
    assert any("[run ] stats@sample" in line and "settings changed: name" in line for line in lines), lines
    assert json.loads((tmp_path / "out" / "sample" / "stats" / "stats.json").read_text())["config"]["name"] == "sample"

    one = run(tmp_path, tiny_study(stats={"name": "renamed"}))
    assert one["ran"] == ["stats@sample"]
    assert "renamed" in json.loads((tmp_path / "out" / "sample" / "stats" / "stats.json").read_text())["stats"]

    # A split setting: the split and both of its readers, not the ingest.
    two = run(tmp_path, tiny_study(stats={"name": "renamed"}, split={"train": 0.7, "valid": 0.15}))
    assert sorted(two["ran"]) == ["extract@sample", "split@sample", "stats@sample"]
    counts = json.loads((tmp_path / "out" / "sample" / "split" / "manifest.json").read_text())["counts"]
    assert 0 < counts["train"] < train0  # 70% instead of 80% of each user's reviews


@pytest.mark.slow
def test_a_failing_step_skips_its_dependants_only(tmp_path, ray_session):
    from rexeval.pipelines.study.builtin_jobs import StatsConfig
    from tests.doubles.study_jobs import boom

    STUDY_JOBS.add("test_boom", StudyJob("test_boom", StatsConfig, boom))
    try:
        data = tiny_study()
        data["steps"]["fails"] = {"job": "test_boom", "with": {"input": "{split}"}}
        data["steps"]["after_fail"] = {"job": "stats", "with": {"input": "{split}"}, "after": ["fails"]}
        res = run(tmp_path, data)
        assert hard_failures(plan_of(tmp_path, data), res) == ["fails@sample", "after_fail@sample"]
        data["steps"]["fails"]["optional"] = True  # then neither fails the study
        assert hard_failures(plan_of(tmp_path, data), res) == []
    finally:
        STUDY_JOBS.pop("test_boom")
    assert res["failed"] == {"fails@sample": "RuntimeError: the model server is down"}
    assert res["skipped"] == {"after_fail@sample": "upstream fails@sample did not complete"}
    assert sorted(res["ran"]) == ["extract@sample", "ingest@sample", "split@sample", "stats@sample"]
    state = json.loads((tmp_path / "out" / "study.json").read_text())["steps"]
    assert state["fails@sample"]["status"] == "failed" and "model server" in state["fails@sample"]["reason"]
    assert state["after_fail@sample"]["status"] == "skipped"


def _whoami_study(tmp_path, steps: str, **run_kwargs) -> dict:
    """The tiny study with one `test_whoami` step per letter of `steps`, run."""
    from rexeval.pipelines.study.builtin_jobs import StatsConfig
    from tests.doubles.study_jobs import whoami

    STUDY_JOBS.add("test_whoami", StudyJob("test_whoami", StatsConfig, whoami))
    try:
        data = tiny_study()
        del data["steps"]["extract"], data["steps"]["stats"]
        for name in steps:
            data["steps"][name] = {"job": "test_whoami", "with": {"input": "{split}"}}
        res = run_study(plan_of(tmp_path, data), **run_kwargs)
    finally:
        STUDY_JOBS.pop("test_whoami")
    assert res["failed"] == {} and sorted(res["ran"]) == sorted([f"{s}@sample" for s in steps]
                                                                + ["ingest@sample", "split@sample"])
    return {s: json.loads((tmp_path / "out" / "sample" / s / "whoami.json").read_text()) for s in steps}


@pytest.mark.slow
def test_steps_run_in_driver_processes_of_their_own(tmp_path, ray_session):
    """Two independent steps at once: each in a process and a Ray job of its own, never
    in the study driver's (threads of one driver share Tune's, Serve's and Ray Data's
    per-process state). Before the fix both ran as threads of the driver's process."""
    import ray

    got = _whoami_study(tmp_path, "ab", progress=lambda _: None)
    a, b = got["a"], got["b"]
    assert len({a["pid"], b["pid"], os.getpid()}) == 3
    assert len({a["ray_job"], b["ray_job"], ray.get_runtime_context().get_job_id()}) == 3


@pytest.mark.slow
def test_a_finished_steps_process_runs_the_next_step_unless_it_left_an_actor(tmp_path, ray_session):
    """One step at a time (a chain): the process and Ray job of a step that succeeded run
    the next step (its job's warm workers too), with the Ray Data context as the first
    step found it; a step that left an actor of its job alive is not followed in its
    process (the actor would hold its CPUs), and neither is a failed one."""
    from rexeval.pipelines.study.builtin_jobs import StatsConfig
    from tests.doubles.study_jobs import boom, holds_an_actor, tamper, whoami

    jobs = {"test_whoami": whoami, "test_tamper": tamper, "test_holds": holds_an_actor, "test_boom": boom}
    for name, fn in jobs.items():
        STUDY_JOBS.add(name, StudyJob(name, StatsConfig, fn))
    try:
        data = tiny_study()
        del data["steps"]["extract"], data["steps"]["stats"]
        # a -> b -> c -> d, then e and f both after d (e first: the study file's order).
        chain = [("a", "test_tamper", "split"), ("b", "test_whoami", "a"), ("c", "test_holds", "b"),
                 ("d", "test_whoami", "c"), ("e", "test_boom", "d"), ("f", "test_whoami", "d")]
        for name, job, after in chain:
            data["steps"][name] = {"job": job, "with": {"input": f"{{{after}}}"}}
        res = run_study(plan_of(tmp_path, data), progress=lambda _: None, max_parallel=1)
    finally:
        for name in jobs:
            STUDY_JOBS.pop(name)
    assert res["failed"].keys() == {"e@sample"}
    got = {s: json.loads((tmp_path / "out" / "sample" / s / "whoami.json").read_text()) for s in "abcdf"}
    assert got["a"]["pid"] == got["b"]["pid"] == got["c"]["pid"] != os.getpid()
    assert got["a"]["ray_job"] == got["b"]["ray_job"] == got["c"]["ray_job"]
    assert got["b"]["probe"] is None  # tamper's change did not reach the next step
    assert got["d"]["pid"] != got["c"]["pid"] and got["d"]["ray_job"] != got["c"]["ray_job"]
    assert got["f"]["pid"] != got["d"]["pid"]  # d's process ran e, which failed
    logs = tmp_path / "out" / "logs"
    assert (logs / "a@sample.log").read_text().endswith("this process may run a later step of the study\n")
    assert (logs / "c@sample.log").read_text().endswith(
        "this process ends here: 1 actor(s) of its Ray job still alive (Held)\n")


@pytest.mark.slow
def test_a_steps_lines_go_to_its_log_and_job_lines(tmp_path, ray_session):
    """A step's own lines reach `job_lines` (the terminal under --verbose), the study's
    lines `progress`; both are in the step's log file."""
    study_lines: list[str] = []
    job_lines: list[str] = []
    a = _whoami_study(tmp_path, "a", progress=study_lines.append, job_lines=job_lines.append)["a"]
    assert any(line.startswith("[a@sample] whoami: pid") for line in job_lines)
    assert any(line.startswith("[a@sample] done in") for line in study_lines)
    assert not any("whoami: pid" in line for line in study_lines)
    assert f"whoami: pid {a['pid']}" in (tmp_path / "out" / "logs" / "a@sample.log").read_text()


@pytest.mark.slow
def test_one_judge_deployment_serves_every_judge_step(tmp_path, ray_session):
    """Two judge steps (Likert, pairwise) calling the same judge: the study starts the
    judge deployment once, both steps use it, the study stops it at the end; nothing is
    left running. (Each step used to start and stop its own.)"""
    from rexeval.serve.common import running_apps
    from tests.doubles.ports import free_port

    judge = {"backend": "tests.doubles.llm:ScriptedLLM", "models": {"judge_llm": "scripted-judge"},
             "use_cache": False, "serve_port": free_port(),
             "backend_options": {"default": "persuasiveness: 4\ntransparency: 3\naccuracy: 5\nsatisfaction: 2\n"
                                            "The first is better.\n[[A]]"}}
    data = tiny_study()
    del data["steps"]["extract"], data["steps"]["stats"], data["steps"]["split"]
    data["steps"]["flip"] = {"job": "flip_benchmark", "with": {"input": str(SAMPLE / "statements.jsonl")}}
    common = {"explanations": ["{flip}/explanations.parquet"], "reviews": ["{ingest}"], "limit": 2, **judge}
    data["steps"]["likert"] = {"job": "judge_likert", "with": common}
    data["steps"]["pairwise"] = {"job": "judge_pairwise", "with": {**common, "baseline": "ground_truth",
                                                                   "divide": False, "both_orders": False}}
    lines: list[str] = []
    res = run(tmp_path, data, lines)
    assert res["failed"] == {} and {"likert@sample", "pairwise@sample"} <= set(res["ran"]), res
    assert sum("starting the Serve deployment 'rexeval-judge'" in line for line in lines) == 1, lines
    assert sum("stopped the Serve application 'rexeval-judge'" in line for line in lines) == 1, lines
    for step in ("likert", "pairwise"):
        log = (tmp_path / "out" / "logs" / f"{step}@sample.log").read_text()
        assert "using the running Serve application 'rexeval-judge'" in log, log
    assert "rexeval-judge" not in running_apps()
    scores = pd.read_parquet(tmp_path / "out" / "sample" / "likert" / "likert_scores.parquet")
    assert scores["score"].notna().all() and len(scores) == 2 * 2 * 4
    verdicts = pd.read_parquet(tmp_path / "out" / "sample" / "pairwise" / "verdicts.parquet")
    assert set(verdicts["verdict"]) == {"A"}


@pytest.mark.slow
def test_two_tune_steps_at_once(tmp_path, ray_session):
    """Two generators trained on Ray Tune by two steps at the same time (as seed000.yaml
    does): both finish (as threads of one driver, the second could die in Tune's registry
    of trainables, "dictionary changed size during iteration")."""
    data = tiny_study()
    del data["steps"]["extract"], data["steps"]["stats"]
    settings = {"epochs": 2, "batch_size": 64, "max_words": 12}
    data["steps"]["nrt"] = {"job": "generate_train", "with": {
        "data": "{split}", "target": "review", "model": "nrt",
        "settings": {**settings, "dim": 16, "hidden": 32}}}
    data["steps"]["peter"] = {"job": "generate_train", "with": {
        "data": "{split}", "target": "review", "model": "peter",
        "settings": {**settings, "emsize": 32, "nhid": 64, "nlayers": 1}}}
    res = run(tmp_path, data)
    assert res["failed"] == {} and {"nrt@sample", "peter@sample"} <= set(res["ran"])
    state = json.loads((tmp_path / "out" / "study.json").read_text())["steps"]
    nrt, peter = state["nrt@sample"], state["peter@sample"]
    assert nrt["started"] <= peter["finished"] and peter["started"] <= nrt["finished"]  # they overlapped
    for name in ("nrt", "peter"):
        assert json.loads((tmp_path / "out" / "sample" / name / "train.json").read_text())["best"]["epoch"] >= 1


@pytest.mark.slow
def test_changing_one_metric_setting_recomputes_that_metric_alone(tmp_path, ray_session):
    """The NLI model of an evaluate step changes: the study re-runs that step only, and
    the step recomputes the NLI family only (BLEU/ROUGE stay as they were)."""
    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.evaluate.inputs import write_flip_benchmark

    bench = write_flip_benchmark(statements_from_annotations(SAMPLE / "statements.jsonl", stage="triplet"),
                                 tmp_path / "bench")

    def study(nli: str) -> dict:
        data = tiny_study()
        data["steps"]["evaluate"] = {"job": "evaluate", "per_dataset": False, "with": {
            "explanations": [bench["explanations"]], "references": bench["references"],
            "statements": [bench["statements"]], "metrics": ["overlap", "statement_nli"], "limit": 12,
            "bootstrap": 50, "chunk_size": 8, "nli_service": "none", "nli_scorer": "tests.doubles.nli:ScriptedNLI",
            "models": {"nli": nli}}}
        return data

    first = run(tmp_path, study("scripted-nli-a"))
    assert "evaluate" in first["ran"]
    overlap_scores = tmp_path / "out" / "evaluate" / "families" / "overlap" / "scores" / "part-00000.parquet"
    stamp = overlap_scores.stat().st_mtime_ns
    lines: list[str] = []
    second = run(tmp_path, study("scripted-nli-b"), lines)
    assert second["ran"] == ["evaluate"]
    assert any("[evaluate]   overlap: already done" in line for line in lines), lines
    assert any("[evaluate]   statement_nli:" in line and "chunk(s)" in line for line in lines), lines
    assert overlap_scores.stat().st_mtime_ns == stamp  # not rewritten
    nli = json.loads((tmp_path / "out" / "evaluate" / "families" / "statement_nli" / "manifest.json").read_text())
    assert nli["config"]["models"] == {"nli": "scripted-nli-b"}


def tables(root: Path) -> dict[str, pd.DataFrame]:
    """Every Parquet table of a study's outputs, sorted, without timing columns."""
    out = {}
    for sub in ("ingest/reviews", "ingest/errors", "split/train", "split/valid", "split/test"):
        df = pq.read_table(root / "sample" / sub).to_pandas()
        out[sub] = df.sort_values(list(df.columns[:2])).reset_index(drop=True)
    ex = pd.read_parquet(root / "sample" / "extract" / "explanations.parquet")
    out["explanations"] = ex.sort_values("example_id").reset_index(drop=True)
    return out


@pytest.mark.slow
def test_a_killed_driver_resumes_to_the_same_results(tmp_path, ray_session):
    """`rexeval study run` killed (SIGKILL to its process group: the driver, its Ray and
    its steps' processes) while a step runs, then run again, ends with the tables of a
    run that was never interrupted."""
    data = tiny_study()
    data["steps"]["clusters"] = {"job": "cluster", "with": {"input": "{ingest}", "method": "extra",
                                                            "extra_min_count": 1}}
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    whole = run_study(build_plan(load_study(f), f, tmp_path / "whole"), progress=lambda _: None)
    assert whole["failed"] == {}

    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "cut"
    log = open(tmp_path / "cut.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rexeval.ray_jobs.cli", "study", "run", str(f), "--out", str(out)],
                            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:  # kill once the cluster step is running: some steps done, some not
            state = out / "study.json"
            steps = json.loads(state.read_text())["steps"] if state.is_file() else {}
            if steps.get("clusters@sample", {}).get("status") == "running":
                break
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "cut.log").read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    steps = json.loads((out / "study.json").read_text())["steps"]
    assert steps["ingest@sample"]["status"] == "complete" and steps["clusters@sample"]["status"] == "running"

    lines: list[str] = []
    again = run_study(build_plan(load_study(f), f, out), progress=lines.append)
    assert again["failed"] == {}
    assert any("[done] ingest@sample" in line for line in lines)  # finished work is not redone
    assert any("[run ] clusters@sample" in line for line in lines)

    a, b = tables(tmp_path / "whole"), tables(out)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_like=True, obj=name)
    for name in ("clusters", "canonical"):
        x = pq.read_table(tmp_path / "whole" / "sample" / "clusters" / name).to_pandas()
        y = pq.read_table(out / "sample" / "clusters" / name).to_pandas()
        key = list(x.columns[:1])
        pd.testing.assert_frame_equal(x.sort_values(key).reset_index(drop=True),
                                      y.sort_values(key).reset_index(drop=True), obj=name)


@pytest.mark.slow
def test_expscore_train_and_score_are_study_steps(tmp_path, ray_session):
    """Seed 003 in a study: ExpScore trained on rated explanations (the sample reviews'
    summary lines, rated with their stars), then a second step scores the review texts
    with the trained model through `{train}/model`; the study report shows both."""
    from rexeval.pipelines.study.report import build_report, write_report

    data = tiny_study()
    del data["steps"]["extract"], data["steps"]["stats"], data["steps"]["split"]
    common = {"inputs": [str(SAMPLE / "reviews.jsonl")], "reviews": "{ingest}", "item_column": "asin",
              "rating_column": "overall", "max_reviews_per_item": 5, "ray": "never"}
    data["steps"]["train"] = {"job": "expscore_train", "with": {
        **common, "text_column": "summary", "head": "linear", "max_epochs": 300}}
    data["steps"]["score"] = {"job": "expscore_score", "with": {
        **common, "text_column": "reviewText", "model": "{train}/model"}}
    plan = plan_of(tmp_path, data)
    assert plan.instances["score@sample"].deps == {"train@sample", "ingest@sample"}
    got = run_study(plan, progress=lambda _: None)
    assert got["failed"] == {} and sorted(got["ran"]) == ["ingest@sample", "score@sample", "train@sample"]

    out = tmp_path / "out" / "sample"
    trained = json.loads((out / "train" / "report.json").read_text())
    assert trained["counts"]["rows_in"] == 305 and list(trained["heads"]) == ["linear"]
    assert "GC" in trained["unavailable"]  # no LanguageTool here: trained without it, and said so
    scored = pq.read_table(out / "score" / "scores.parquet").to_pandas()
    assert len(scored) + json.loads((out / "score" / "report.json").read_text())["counts"]["errors"] == 305
    assert scored["expscore_linear"].notna().all()
    state = json.loads((tmp_path / "out" / "study.json").read_text())["steps"]
    assert state["train@sample"]["summary"]["train"] == trained["counts"]["train"]

    md = write_report(build_report(tmp_path / "out"), tmp_path / "out" / "report")["md"].read_text()
    assert "ExpScore training (seed 003)" in md and "ExpScore scores (seed 003)" in md
    assert "ExpScore against human ratings" in md


def test_free_slots_go_to_the_critical_path_first(tmp_path):
    """The demo's longest chain (ingest -> split -> peter -> peter_test -> evaluate) starts
    before leaves: once ingest is done, split (3 steps wait on it) takes a slot before
    the LLM extractions (1) and stats (0), and peter (2) before them too. Before the fix the study file's order ran stats, then both extractions, first: flip
    and peter started four minutes into the demo, evaluate six."""
    from rexeval.pipelines.study.runner import start_order

    f = REPO / "studies" / "demo.yaml"
    plan = build_plan(load_study(f), f, tmp_path / "out")
    chains = plan.chains()
    # Counted by hand from studies/demo.yaml's `with:` references.
    assert {k.split("@")[0]: chains[k] for k in ("ingest@sample", "split@sample", "flip@sample", "peter@sample",
                                                 "peter_test@sample", "evaluate@sample", "stats@sample",
                                                 "triplets@sample", "seed004@sample")} == {
        "ingest": 4, "split": 3, "flip": 3, "peter": 2, "peter_test": 1, "evaluate": 0, "stats": 0,
        "triplets": 1, "seed004": 2}
    free = lambda k: 0  # noqa: E731 - no Serve application in the way
    after_ingest = ["split@sample", "stats@sample", "triplets@sample", "star_statements@sample", "extra@sample"]
    assert start_order(plan, sorted(after_ingest), free, chains)[:1] == ["split@sample"]
    assert start_order(plan, ["stats@sample", "peter@sample", "triplets@sample"], free, chains) == [
        "peter@sample", "triplets@sample", "stats@sample"]
    # A step that would start a Serve application still waits behind those that need none.
    assert start_order(plan, ["likert@sample", "stats@sample"], lambda k: int(k.startswith("likert")), chains) == [
        "stats@sample", "likert@sample"]
