"""The study report of a study folder under a URI: the planted study of test_report.py
copied to the test S3 endpoint reports every table, figure, note and skipped item that
the local folder reports (paths aside), and `rexeval study report` writes its pages to
a URI."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rexeval.storage import location
from tests.pipelines.study.test_report import study  # noqa: F401  (the planted study, a fixture)


def _uploaded(local_dir, root: str) -> str:
    """The planted study folder copied under `root`, its study.json naming the copies."""
    remote = location(f"{root}/runs")
    remote.upload(local_dir)
    data = json.loads((local_dir / "study.json").read_text())
    for rec in data["steps"].values():
        if isinstance(rec, dict) and isinstance(rec.get("out"), str):
            rec["out"] = rec["out"].replace(str(local_dir), str(remote))
    data["out"] = str(remote)
    (remote / "study.json").write_json(data)
    return str(remote)


def _shown(report, here: str) -> dict:
    """Everything the report shows, with its folder's paths written as ROOT."""
    def fix(x):
        return json.loads(json.dumps(x, default=str).replace(here, "ROOT"))
    return fix({"tables": [(t.key, t.title, t.columns, t.rows, t.caption, t.note, t.sources, t.instances)
                           for t in report.tables()],
                "figures": [(f.key, f.title, f.mime, len(f.data), f.sources) for f in report.figures()],
                "sections": [(s.key, s.title, s.notes, s.texts) for s in report.sections],
                "skipped": [(s.where, s.what, s.why) for s in report.skipped],
                "notes": report.notes, "provenance": report.provenance})


@pytest.mark.slow
def test_a_study_folder_on_s3_reports_as_the_local_one(study, s3_root):  # noqa: F811
    from rexeval.pipelines.study.report import build_report
    from rexeval.ray_jobs.study_report import study_report_cmd

    local_dir = study["dir"]
    remote = _uploaded(local_dir, s3_root)
    here, there = build_report(local_dir), build_report(remote)
    assert _shown(there, remote) == _shown(here, str(local_dir))
    assert "Table 1: statement ranking" in [t.title for t in there.tables()]  # results copied down from S3
    assert there.figures()

    res = CliRunner().invoke(study_report_cmd, [remote, "--out", f"{s3_root}/pages"])
    assert res.exit_code == 0, res.output
    pages = location(f"{s3_root}/pages")
    html = (pages / "index.html").read_text()
    assert "Table 1: statement ranking" in html and f"<code>{remote}</code>" in html
    assert (pages / "report.md").is_file() and (pages / "tables").glob("*.csv")
    assert len((pages / "figures").iterdir()) == len(there.figures())

    # DIR/report by default; a URI with no study.json is refused with the reason.
    res = CliRunner().invoke(study_report_cmd, [remote])
    assert res.exit_code == 0 and (location(remote) / "report" / "index.html").is_file()
    res = CliRunner().invoke(study_report_cmd, [f"{s3_root}/pages"])
    assert res.exit_code != 0 and "no study.json" in res.output
