"""A study step as a Ray job, its pieces without a cluster (tests/doubles/job_server.py
stands in for Ray's job server): the entrypoint and call a step becomes, the step's
job run by that entrypoint with its counts read back through the storage module (the
study's folder on S3 here), a failed job as a failed step with its own reason, a job
whose driver's node was lost as a transport failure, and where the steps run by
default (`steps_as`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from ray.job_submission import JobStatus

from rexeval.storage import location
from rexeval.pipelines.study import step_job as sj
from rexeval.pipelines.study.config import DriverResources, load_study
from rexeval.pipelines.core.study_registry import STUDY_JOBS, StudyJob
from rexeval.pipelines.study.builtin_jobs import AnnotationsConfig, StatsConfig
from rexeval.pipelines.study.step_process import StepCall, StepFailed
from tests.doubles.job_server import Ending, JobServer

REPO = Path(__file__).resolve().parents[3]
STATEMENTS = REPO / "pipelines" / "sample" / "statements.jsonl"


def annotations_call(out: str, log: Path, **kw) -> StepCall:
    """The `annotations` step (hand-written statements -> a statements folder): a
    registered job that needs no model."""
    job = STUDY_JOBS["annotations"]
    return StepCall("ann@sample", job.target, job.config, {"input": str(STATEMENTS), "out": out}, False,
                    str(log), **kw)


def test_a_step_becomes_a_call_file_and_an_entrypoint_that_names_it(tmp_path):
    call = annotations_call(str(tmp_path / "out"), tmp_path / "ann.log")
    spec = sj.call_spec(call, location("s3://b/st/_step_jobs/ann@sample/result.json"), {})
    assert spec["target"] == "rexeval.pipelines.study.builtin_jobs:_annotations"  # registered by decorator: by name
    assert spec["config"] == "rexeval.pipelines.study.builtin_jobs:AnnotationsConfig"
    assert spec["result"] == "s3://b/st/_step_jobs/ann@sample/result.json"
    assert spec["cwd"] is not None  # no working dir travels with the study: the job starts where it did
    assert sj.call_spec(call, location("s3://b/r.json"), {"working_dir": "gcs://_ray_pkg_x.zip"})["cwd"] is None
    assert json.loads(json.dumps(spec)) == spec
    assert sj.entrypoint(location("s3://b/st/_step_jobs/ann@sample/call.json")) == \
        "rexeval study step s3://b/st/_step_jobs/ann@sample/call.json"
    assert sj.entrypoint(location("/runs/my study/c.json")) == "rexeval study step '/runs/my study/c.json'"
    assert sj.entrypoint_resources(DriverResources()) == {
        "entrypoint_num_cpus": 1, "entrypoint_num_gpus": None, "entrypoint_memory": None,
        "entrypoint_resources": None}
    assert sj.entrypoint_resources(DriverResources(num_cpus=0, memory=2 << 30, resources={"driver": 1})) == {
        "entrypoint_num_cpus": None, "entrypoint_num_gpus": None, "entrypoint_memory": 2 << 30,
        "entrypoint_resources": {"driver": 1}}
    with pytest.raises(StepFailed, match="NotImportable"):
        sj.call_spec(StepCall("x", lambda cfg, progress: {}, AnnotationsConfig, {}, False, "l"),
                     location("s3://b/r.json"), {})


def test_a_step_job_runs_its_registered_job_and_its_counts_come_back(s3_root, tmp_path, ray_session, monkeypatch):
    """The real entrypoint (`run_call`) runs in the double's job: it reads the call the
    study wrote under the S3 folder, runs the `annotations` job, writes its result
    there; the study reads the counts back, the progress lines reach it, unmarked, and
    every line of the job's log is in the step's log file."""
    monkeypatch.setenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
    server = JobServer()
    jobs = sj.StepJobs(server, location(s3_root), {"env_vars": {"X": "1"}})
    lines: list[str] = []
    ids: list[str] = []
    log = tmp_path / "logs" / "ann@sample.log"
    call = annotations_call(f"{s3_root}/sample/ann", log)
    counts, node = jobs.run(call, DriverResources(resources={"driver": 1}), lines.append, ids.append)

    made = location(f"{s3_root}/sample/ann/statements").walk_files()
    assert set(counts) == {"statements"} and counts["statements"] > 0 and made
    [sub] = server.submitted
    assert sub["entrypoint"] == f"rexeval study step {s3_root}/_step_jobs/ann@sample/call.json"
    assert sub["entrypoint_num_cpus"] == 1 and sub["entrypoint_resources"] == {"driver": 1}
    assert sub["runtime_env"] == {"env_vars": {"X": "1"}} and ids == [sub["submission_id"]]
    assert sub["submission_id"].startswith("rexeval-ann-sample-")
    assert node == "node-w"
    result = location(f"{s3_root}/_step_jobs/ann@sample/result.json").read_json()
    assert result["status"] == "done" and result["counts"] == counts
    said = [line for line in lines if line.startswith("annotations: ")]
    assert said and not any(sj.MARK in line for line in lines), lines
    text = log.read_text()
    assert said[0] in text and sj.MARK not in text and sub["submission_id"] in text


def test_a_job_whose_step_raised_is_a_failed_step_with_its_reason(s3_root, tmp_path, ray_session, monkeypatch):
    monkeypatch.setenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
    jobs = sj.StepJobs(JobServer(), location(s3_root), {})
    settings = {"input": str(STATEMENTS), "out": str(tmp_path / "x")}
    call = StepCall("boom@d", "tests.doubles.study_jobs:boom", StatsConfig, settings, False, str(tmp_path / "boom.log"))
    with pytest.raises(StepFailed) as got:
        jobs.run(call, DriverResources(), lambda _: None)
    assert got.value.reason == "RuntimeError: the model server is down" and not got.value.transport
    assert "Traceback" in got.value.details and "the model server is down" in (tmp_path / "boom.log").read_text()

    call = StepCall("rerun@d", "tests.doubles.job_server:calls_fail_in_transport", StatsConfig, settings, False,
                    str(tmp_path / "rerun.log"))
    with pytest.raises(StepFailed, match="AwaitingRerun: 3 row") as got:
        jobs.run(call, DriverResources(), lambda _: None)
    assert got.value.transport  # left for a re-run, as the job's own exit code 75 says
    assert jobs.client.jobs[jobs.client.submitted[-1]["submission_id"]].driver_exit_code == 75


CALL = StepCall("split@mi", "m:f", dict, {}, False, "/tmp/x.log", log_shown="s3://b/logs/split@mi.log")


def scripted(tmp_path, ending: Ending):
    jobs = sj.StepJobs(JobServer(ends=[ending]), location(tmp_path), {})
    return jobs.run(CALL, DriverResources(), lambda _: None)


@pytest.mark.parametrize("ending, reason, transport", [
    (Ending(error_type="JOB_SUPERVISOR_ACTOR_DIED", message="Job supervisor actor died: node n2 died"),
     r"StepLost: the driver of its Ray job \S+ on node node-w was lost \(Job supervisor actor died: node n2 "
     r"died\); nothing is wrong with the step", True),
    (Ending(error_type="JOB_ENTRYPOINT_COMMAND_ERROR", exit_code=-9, message="exit code -9"),
     r"StepDied: .*\(killed by signal 9\) before it reported a result .*s3://b/logs/split@mi.log", False),
    (Ending(error_type="RUNTIME_ENV_SETUP_FAILURE", node=None, message="runtime_env setup failed: no pip\nmore"),
     r"StepNotStarted: its Ray job \S+ did not start \(RUNTIME_ENV_SETUP_FAILURE: runtime_env setup failed: "
     r"no pip\)", False),
    (Ending(status=JobStatus.STOPPED), r"StepStopped: ", False),
    (Ending(result={"status": "error", "reason": "AwaitingRerun: 2 rows", "transport": True}, exit_code=75),
     r"^AwaitingRerun: 2 rows$", True),
])
def test_how_a_jobs_end_is_read(tmp_path, ending, reason, transport):
    with pytest.raises(StepFailed, match=reason) as got:
        scripted(tmp_path, ending)
    assert got.value.transport is transport


def test_a_result_written_is_the_steps_outcome_however_its_process_ended(tmp_path):
    got = scripted(tmp_path, Ending(status=JobStatus.FAILED, exit_code=-11,
                                    result={"status": "done", "counts": {"out": 3}}, log="::step:: done\n"))
    assert got == ({"out": 3}, "node-w")


def test_the_log_is_read_line_by_line_whatever_the_chunks(tmp_path):
    server = JobServer(ends=[Ending(status=JobStatus.SUCCEEDED, result={"status": "done", "counts": {}},
                                    log=f"{sj.MARK}one\nray noise\n{sj.MARK}two\n{sj.MARK}three")])
    lines: list[str] = []
    log = tmp_path / "s.log"
    sj.StepJobs(server, location(tmp_path), {}).run(
        StepCall("s", "m:f", dict, {}, False, str(log)), DriverResources(), lines.append)
    assert lines == ["one", "two", "three"]
    assert log.read_text().splitlines()[1:] == ["one", "ray noise", "two", "three"]


def test_which_way_steps_run(monkeypatch, ray_session):
    monkeypatch.delenv(sj.STEPS_AS_ENV, raising=False)
    monkeypatch.delenv("REXEVAL_STAGES_AS", raising=False)  # its old name, still read
    assert sj.wanted_mode(None, "auto") == "auto"
    assert sj.wanted_mode("process", "job") == "process"
    monkeypatch.setenv(sj.STEPS_AS_ENV, "job")
    assert sj.wanted_mode(None, "process") == "job" and sj.wanted_mode("process", "auto") == "process"
    monkeypatch.setenv(sj.STEPS_AS_ENV, "jobs")
    with pytest.raises(ValueError, match="expected one of auto, process, job"):
        sj.wanted_mode(None, "auto")
    # This session's Ray was started here (a laptop): processes; it has no job server.
    assert sj.resolve_mode("auto") == ("process", "Ray was started by this study")
    with pytest.raises(ValueError, match="job server"):
        sj.resolve_mode("job")


def test_the_old_name_of_the_variable_is_still_read_and_the_new_one_wins(monkeypatch):
    """REXEVAL_STAGES_AS (its name when a step was a "stage") still chooses where steps
    run, in a launcher or CI job set up before the rename; REXEVAL_STEPS_AS, when both
    are set, wins over it, and `--steps-as` over both."""
    monkeypatch.delenv("REXEVAL_STEPS_AS", raising=False)
    monkeypatch.setenv("REXEVAL_STAGES_AS", "job")
    assert sj.wanted_mode(None, "process") == "job"
    assert sj.wanted_mode("process", "auto") == "process"
    monkeypatch.setenv("REXEVAL_STEPS_AS", "process")
    assert sj.wanted_mode(None, "job") == "process"
    monkeypatch.setenv("REXEVAL_STAGES_AS", "jobs")  # a bad old value under a good new one is not read
    assert sj.wanted_mode(None, "auto") == "process"
    monkeypatch.delenv("REXEVAL_STEPS_AS")
    with pytest.raises(ValueError, match="steps as 'jobs': expected one of auto, process, job"):
        sj.wanted_mode(None, "auto")


def test_the_study_file_says_where_drivers_run_and_what_they_ask_for(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({
        "name": "s", "steps_as": "job", "driver_resources": {"num_cpus": 2, "resources": {"driver": 1}},
        "steps": {"a": {"job": "stats", "with": {"input": "x"}},
                  "b": {"job": "stats", "with": {"input": "x"}, "driver_resources": {"num_gpus": 1}}}}))
    study = load_study(f)
    assert study.steps_as == "job"
    assert study.driver_of("a") == DriverResources(num_cpus=2, resources={"driver": 1})
    assert study.driver_of("b") == DriverResources(num_cpus=2, num_gpus=1, resources={"driver": 1})
    f.write_text(yaml.safe_dump({"name": "s", "steps_as": "cluster", "steps": {"a": {"job": "stats"}}}))
    assert any("steps_as" in p for p in load_study(f).load_problems)


def test_a_study_whose_failures_were_all_in_transport_exits_75(tmp_path, ray_session):
    """A step whose calls failed in transport (here in a step process) fails the study
    with exit code 75, as a job left for a re-run does, not 1."""
    from rexeval.ray_jobs.study import study_run_cmd

    STUDY_JOBS.add("test_transport", StudyJob("test_transport", StatsConfig,
                                              "tests.doubles.job_server:calls_fail_in_transport"))
    try:
        f = tmp_path / "s.yaml"
        f.write_text(yaml.safe_dump({"name": "s", "steps": {"llm": {"job": "test_transport",
                                                                    "with": {"input": str(STATEMENTS)}}}}))
        res = CliRunner().invoke(study_run_cmd, [str(f), "--out", str(tmp_path / "out"), "--steps-as", "process"])
    finally:
        STUDY_JOBS.pop("test_transport")
    assert res.exit_code == 75, res.output
    assert "FAILED in transport (left for a re-run): AwaitingRerun: 3 row(s)" in res.output, res.output
    state = json.loads((tmp_path / "out" / "study.json").read_text())["steps"]["llm"]
    assert state["status"] == "failed" and state["transport"] is True


def test_an_interrupted_study_stops_its_running_jobs_and_only_those(tmp_path):
    server = JobServer(ends=[Ending(status=JobStatus.RUNNING), Ending(status=JobStatus.SUCCEEDED)])
    for sid in ("rexeval-a-1", "rexeval-b-2"):
        server.submit_job(entrypoint="x", submission_id=sid)
    jobs = sj.StepJobs(server, location(tmp_path), {})
    jobs.running.update({"a@d": "rexeval-a-1", "b@d": "rexeval-b-2"})
    said: list[str] = []
    jobs.stop_all(said.append)
    assert server.stopped == ["rexeval-a-1"]  # the one still running; the ended one is left alone
    assert said == ["[a@d] stopping Ray job rexeval-a-1 (the study was interrupted)"]
