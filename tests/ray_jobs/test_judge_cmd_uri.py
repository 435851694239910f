"""`rexeval judge winrate` on pairwise folders in a bucket, writing its study there:
the CLI takes the URIs (checked through storage) and writes what a local run writes."""
from __future__ import annotations

from click.testing import CliRunner

from rexeval.storage import location
from rexeval.ray_jobs.cli import cli
from tests.pipelines.judge.test_winrate import write_run

SAME = ("winrate.csv", "winrate.md", "table4.md", "table4.csv")


def _winrate(runs: list[str], out: str):
    return CliRunner().invoke(cli, ["judge", "winrate", *runs, "--out", out, "--resamples", "50"])


def test_winrate_reads_and_writes_uris(s3_root, tmp_path, monkeypatch):
    a = write_run(tmp_path / "a", systems=("sysA",))
    b = write_run(tmp_path / "b", systems=("sysB",), disc=False)
    res = _winrate([str(a), str(b)], str(tmp_path / "here"))
    assert res.exit_code == 0, res.output
    for name in ("a", "b"):
        location(f"{s3_root}/runs/{name}").upload(tmp_path / name)
    runs = [f"{s3_root}/runs/a", f"{s3_root}/runs/b"]
    monkeypatch.chdir(tmp_path / "here")
    before = sorted(tmp_path.rglob("*"))
    res = _winrate(runs, f"{s3_root}/study")
    assert res.exit_code == 0, res.output
    assert sorted(tmp_path.rglob("*")) == before  # nothing written here
    out = location(s3_root) / "study"
    for name in SAME:
        assert (out / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name
    for name in ("figure5.png", "figure5.svg"):
        assert (out / name).size() > 0
    report = (out / "report.json").read_json()
    assert [i["folder"] for i in report["inputs"]] == runs
    assert f"{s3_root}/study/winrate.md" in res.output


def test_a_missing_uri_is_refused_by_the_cli(s3_root, tmp_path):
    res = _winrate([f"{s3_root}/nowhere"], str(tmp_path / "o"))
    assert res.exit_code != 0 and "does not exist" in res.output
