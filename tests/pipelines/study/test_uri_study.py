"""A study whose folder is a URI (the test S3 endpoint, `s3_root`): the plan's step
folders, the state, every step's output, its logs and the report live under the URI;
a run there gives what the same run gives on a local folder, and a second run does
nothing; input files may be URIs too, checked (and fingerprinted) through storage."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rexeval.pipelines.core.io import read_parquet
from rexeval.storage import location
from rexeval.pipelines.study.config import StudyError, load_study
from rexeval.pipelines.core.study_registry import STUDY_JOBS, StudyJob
from rexeval.pipelines.study.plan import build_plan, read_state, status_of
from rexeval.pipelines.study.runner import run_study
from tests.pipelines.study import uri_jobs

TEXT = "strings are good\nthe case is cheap\n\ntoo loud for a small room\n"
CHARS = sum(len(line) for line in TEXT.splitlines())


@pytest.fixture
def jobs():
    """The storage-only doubles (and a failing step) as study jobs, for one test."""
    from rexeval.pipelines.study.builtin_jobs import StatsConfig
    from tests.doubles.study_jobs import boom

    added = {"t_lines": StudyJob("t_lines", uri_jobs.LinesConfig, uri_jobs.lines),
             "t_total": StudyJob("t_total", uri_jobs.TotalConfig, uri_jobs.total),
             "t_boom": StudyJob("t_boom", StatsConfig, boom)}
    for name, job in added.items():
        STUDY_JOBS.add(name, job)
    yield
    for name in added:
        STUDY_JOBS.pop(name)


def study_file(tmp_path: Path, inputs: list[str], *, fail: bool = False, out: str | None = None) -> Path:
    (tmp_path / "reviews.txt").write_text(TEXT)
    data = {"name": "uri", "max_parallel": 2,
            "datasets": {"d": {"inputs": inputs}},
            "steps": {"lines": {"job": "t_lines", "with": {"inputs": "{dataset.inputs}"}},
                      "total": {"job": "t_total", "with": {"input": "{lines}"}}}}
    if out:
        data["out"] = out
    if fail:
        data["steps"]["fails"] = {"job": "t_boom", "with": {"input": "{lines}"}, "optional": True}
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def plan_for(f: Path, out=None):
    return build_plan(load_study(f), f, out)


def outcome(root) -> dict:
    """What a study run left, independent of where: each instance's status and counts,
    the tables and totals of its steps."""
    root = location(root)
    state = read_state(root)["steps"]
    return {"steps": {k: (v["status"], v.get("summary")) for k, v in sorted(state.items())},
            "lines": read_parquet(root / "d" / "lines" / "table" / "part-00000.parquet").to_pylist(),
            "total": (root / "d" / "total" / "total.json").read_json(),
            "manifest": (root / "d" / "lines" / "manifest.json").read_json()}


# ------------------------------------------------------------------ plans (no Ray)


def test_a_uri_out_gives_uri_step_folders_and_keeps_uri_inputs(tmp_path, s3_root, jobs):
    remote = f"{s3_root}/inputs/more.txt"
    location(remote).write_text("one more line\n")
    f = study_file(tmp_path, ["reviews.txt", remote], out=f"{s3_root}/from-file")
    study = load_study(f)
    assert study.datasets["d"].inputs == [str(tmp_path / "reviews.txt"), remote]  # a URI as written

    plan = plan_for(f)  # the file's `out:` may be a URI
    assert str(plan.out) == f"{s3_root}/from-file"
    plan = plan_for(f, f"{s3_root}/study/")  # --out wins; a trailing slash is the same folder
    assert str(plan.out) == f"{s3_root}/study"
    lines, total = plan.instances["lines@d"], plan.instances["total@d"]
    assert str(lines.out) == f"{s3_root}/study/d/lines"
    assert total.settings["input"] == f"{s3_root}/study/d/lines" and total.deps == {"lines@d"}
    # Inputs outside the study's folder are fingerprinted, local and URI alike; its own
    # steps' folders are not.
    assert lines.reads == sorted([str(tmp_path / "reviews.txt"), remote]) and total.reads == []
    assert status_of(plan, read_state(plan.out)) == {"lines@d": ("run", "never run"),
                                                     "total@d": ("run", "never run")}

    # An edited input under a URI re-runs its readers, as an edited local file does.
    location(remote).write_text("one more line\nand another\n")
    again = plan_for(f, f"{s3_root}/study")
    assert again.instances["lines@d"].fingerprint != lines.fingerprint
    assert again.instances["total@d"].fingerprint != total.fingerprint


def test_missing_uri_inputs_are_found_before_anything_runs(tmp_path, s3_root, jobs):
    gone = f"{s3_root}/inputs/gone.txt"
    f = study_file(tmp_path, ["reviews.txt", gone])
    with pytest.raises(StudyError) as err:
        plan_for(f, f"{s3_root}/study")
    assert f"datasets.d.inputs: {gone} does not exist" in str(err.value)

    # A step's declared read (ReadPath) by URI, outside the study's folder.
    f = study_file(tmp_path, ["reviews.txt"])
    data = yaml.safe_load(f.read_text())
    data["steps"]["elsewhere"] = {"job": "t_total", "with": {"input": f"{s3_root}/other-study/lines"}}
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(StudyError) as err:
        plan_for(f, f"{s3_root}/study")
    assert (f"steps.elsewhere.with.input (dataset d): {s3_root}/other-study/lines does not exist"
            in str(err.value))
    location(f"{s3_root}/other-study/lines/table/part-00000.parquet").write_bytes(b"x")
    assert "elsewhere@d" in plan_for(f, f"{s3_root}/study").order


def test_dry_run_with_a_uri_out_writes_nothing(tmp_path, s3_root, jobs):
    from rexeval.ray_jobs.study import study_group

    f = study_file(tmp_path, ["reviews.txt"])
    res = CliRunner().invoke(study_group, ["run", str(f), "--out", f"{s3_root}/study", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"-> {s3_root}/study" in res.output and "[run ] lines@d" in res.output
    assert location(s3_root).walk_files() == []


# ------------------------------------------------------------------ runs


@pytest.mark.slow
def test_a_study_on_s3_equals_the_local_run_and_a_second_run_does_nothing(tmp_path, s3_root, jobs, ray_session,
                                                                          monkeypatch):
    import tempfile

    local_tmp = tmp_path / "tmp"
    local_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(local_tmp))  # where the driver's temporary log files go
    (tmp_path / "study").mkdir()
    f = study_file(tmp_path / "study", ["reviews.txt"], fail=True)
    here = run_study(plan_for(f, tmp_path / "local"), progress=lambda _: None)
    lines: list[str] = []
    there = run_study(plan_for(f, f"{s3_root}/study"), progress=lines.append)
    for res in (here, there):
        assert sorted(res["ran"]) == ["lines@d", "total@d"] and list(res["failed"]) == ["fails@d"]
    assert outcome(f"{s3_root}/study") == outcome(tmp_path / "local")
    assert outcome(tmp_path / "local")["total"]["counts"] == {"rows": 3, "chars": CHARS}

    # Everything of the S3 run is under the URI: nothing on this machine's disk but the
    # study file and the local run, and the driver's temporary logs are gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "study", "tmp"]
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == ["reviews.txt", "study.yaml"]
    assert [p for p in local_tmp.iterdir() if p.name.startswith("rexeval-")] == []
    root = location(f"{s3_root}/study")
    state = (root / "study.json").read_json()
    assert state["out"] == str(root) and state["steps"]["total@d"]["out"] == f"{root}/d/total"
    # The logs: each step's, copied when it ended, the failed one's too (and named in the state).
    assert f"total: {CHARS} character(s) in 3 row(s)" in (root / "logs" / "total@d.log").read_text()
    assert "the model server is down" in (root / "logs" / "fails@d.log").read_text()
    assert state["steps"]["fails@d"]["log"] == f"{root}/logs/fails@d.log"
    assert any(f"[lines@d] t_lines -> {root}/d/lines" in line for line in lines)

    # A second run: the complete steps are skipped, nothing is rewritten; the failed
    # optional step is tried again and its log grows, as a local log does.
    before = {str(p): p.read_bytes() for p in root.walk_files() if not p.name.startswith("fails@")}
    lines = []
    again = run_study(plan_for(f, f"{s3_root}/study"), progress=lines.append)
    assert again["ran"] == [] and sorted(again["done"]) == ["lines@d", "total@d"]
    assert any("[done] lines@d" in line for line in lines)
    after = {str(p): p.read_bytes() for p in root.walk_files() if not p.name.startswith("fails@")}
    assert {k: v for k, v in after.items() if not k.endswith("study.json")} == \
           {k: v for k, v in before.items() if not k.endswith("study.json")}
    assert (root / "logs" / "fails@d.log").read_text().count(": step fails@d\n") == 2

    # Without the failing step there is nothing to do at all.
    f.write_text(yaml.safe_dump({**yaml.safe_load(f.read_text()),
                                 "steps": {k: v for k, v in yaml.safe_load(f.read_text())["steps"].items()
                                           if k != "fails"}}))
    lines = []
    third = run_study(plan_for(f, f"{s3_root}/study"), progress=lines.append)
    assert third["ran"] == [] and any("nothing to do" in line for line in lines)

    # The report reads the S3 folder, and writes its pages to S3 as they are written
    # locally (paths aside).
    from rexeval.pipelines.study.report import build_report, write_report

    remote, local = build_report(root), build_report(tmp_path / "local")
    remote_pages = write_report(remote, root / "report")
    assert str(remote_pages["html"]) == f"{root}/report/index.html"
    assert "| rows | chars |" in remote_pages["md"].read_text()
    assert f"<code>{root}</code>" in remote_pages["html"].read_text()
    assert sorted(p.name for p in (root / "report" / "tables").iterdir()) == \
           sorted(f"{t.key}.csv" for t in remote.tables())

    def laid_out(report):  # every table as shown, less the steps' times
        return [(t.title, t.columns, [r[:4] + r[6:] if t.title == "Steps" else r for r in t.rows])
                for t in report.tables()]
    assert laid_out(remote) == laid_out(local)
    assert [["3", str(CHARS)]] in [t.rows for t in remote.tables()]  # total.md, read from S3


def test_a_local_out_a_node_cannot_see_stops_the_study_before_any_step(tmp_path, jobs, ray_session, monkeypatch):
    """`rexeval study run` on a cluster where one node has no view of the local folder
    (simulated: the session's Ray reports one more node, which no task reaches): one
    line naming the folder and what to use instead, and no step ran."""
    import ray

    from rexeval.ray_jobs.study import study_group

    real = ray.nodes
    monkeypatch.setattr(ray, "nodes", lambda: real() + [{"NodeID": "cd" * 28, "Alive": True,
                                                         "NodeManagerAddress": "10.9.9.8"}])
    f = study_file(tmp_path, ["reviews.txt"])
    res = CliRunner().invoke(study_group, ["run", str(f), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output  # the user's to fix: a URI or a shared folder
    assert f"{tmp_path / 'out'} is a local folder that 1 node(s) of the Ray cluster cannot see" in res.output
    assert "10.9.9.8 (node cdcdcdcd)" in res.output and "Use a URI (s3://, gs://)" in res.output
    assert not (tmp_path / "out").exists()
