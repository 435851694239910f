"""Nothing deleted: `--overwrite` never touches a job's inputs, nor anything in its
folder that it did not write, and a run that cannot start leaves the earlier output.

The first three tests are the deletions a hostile user found (issue 45): each job
removed its own input before it failed."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from rexeval.pipelines.core.inputs import statements_from_annotations
from rexeval.storage import location
from rexeval.pipelines.evaluate.inputs import write_flip_benchmark
from rexeval.ray_jobs.cli import cli

SAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "sample"
REVIEW = {"reviewerID": "A1", "asin": "B1", "overall": 5, "unixReviewTime": 1400000000, "reviewText": "good strings"}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(res, *names: str) -> str:
    """The one-line error of an input mistake (exit 2) that names `names`."""
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "Traceback" not in res.output, res.output
    for n in names:
        assert n in line, line
    return line


def test_ingest_into_the_folder_of_its_input_deletes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    u = tmp_path / "u"
    u.mkdir()
    (u / "r.jsonl").write_text(json.dumps(REVIEW) + "\n")
    (u / "notes.txt").write_text("mine")
    before = _tree(u)
    line = _refused(CliRunner().invoke(cli, ["ingest", "u/r.jsonl", "--out", "u", "--overwrite"]), "--out u", "u/r.jsonl")
    assert "holds an input" in line
    assert _tree(u) == before


def test_split_into_its_own_input_deletes_nothing(tmp_path):
    x = tmp_path / "X"
    (x / "reviews").mkdir(parents=True)
    pq.write_table(pa.table({"review_id": ["r1"]}), x / "reviews" / "part-00000.parquet")
    (x / "manifest.json").write_text(json.dumps({"job": "ingest", "config_hash": "abc", "status": "complete"}))
    before = _tree(x)
    _refused(CliRunner().invoke(cli, ["split", str(x), "--out", str(x), "--overwrite"]), str(x), "is an input")
    assert _tree(x) == before


def test_evaluate_into_its_references_deletes_nothing(tmp_path):
    bench = write_flip_benchmark(statements_from_annotations(str(SAMPLE / "statements.jsonl"), stage="triplet"),
                                 str(tmp_path / "bench"))
    refs = Path(bench["references"])
    before = _tree(refs)
    res = CliRunner().invoke(cli, ["evaluate", bench["explanations"], "--references", str(refs),
                                   "--out", str(refs), "--overwrite"])
    _refused(res, f"--out {refs} is an input", "references")
    assert _tree(refs) == before
    # Inside an input folder, or holding one, is refused the same way.
    _refused(CliRunner().invoke(cli, ["evaluate", bench["explanations"], "--references", str(refs),
                                      "--out", str(refs / "eval"), "--overwrite"]), "lies inside an input")
    _refused(CliRunner().invoke(cli, ["evaluate", bench["explanations"], "--out", str(tmp_path), "--overwrite"]),
             "holds an input", "explanations")
    assert _tree(refs) == before


def test_the_same_holds_for_uris(s3_root):
    folder = location(s3_root) / "u"
    (folder / "r.jsonl").write_text(json.dumps(REVIEW) + "\n")
    (folder / "notes.txt").write_text("mine")
    res = CliRunner().invoke(cli, ["ingest", f"{s3_root}/u/r.jsonl", "--out", f"{s3_root}/u", "--overwrite"])
    _refused(res, f"--out {s3_root}/u holds an input")
    assert sorted(f.name for f in folder.iterdir()) == ["notes.txt", "r.jsonl"]


def test_an_output_that_is_a_file_or_a_bad_config_is_one_line(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    review = tmp_path / "r.jsonl"
    review.write_text(json.dumps(REVIEW) + "\n")
    _refused(CliRunner().invoke(cli, ["ingest", str(review), "--out", str(f)]), "is a file")
    assert f.read_text() == "x"
    bad = tmp_path / "bad.yaml"
    bad.write_text("out: [unclosed\n")
    _refused(CliRunner().invoke(cli, ["ingest", str(review), "--config", str(bad)]), str(bad), "line 2", "not valid YAML")
    bad.write_text("- a\n- b\n")
    _refused(CliRunner().invoke(cli, ["ingest", str(review), "--config", str(bad)]), str(bad), "mapping")
    bad.write_bytes(b"\xff\xfe\x00garbage")
    _refused(CliRunner().invoke(cli, ["ingest", str(review), "--config", str(bad)]), str(bad), "not a text file")


def test_overwrite_keeps_the_users_files_and_a_bad_input_keeps_the_old_output(tmp_path, ray_session):
    """An ingest output with the user's notes beside it: --overwrite with other settings
    replaces the job's own files and leaves the notes; --overwrite with an input that
    cannot be read is refused before the old output is touched."""
    runner = CliRunner()
    out = tmp_path / "ing"
    res = runner.invoke(cli, ["ingest", str(SAMPLE / "reviews.jsonl"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    (out / "notes.txt").write_text("mine")
    res = runner.invoke(cli, ["ingest", str(SAMPLE / "reviews.jsonl"), "--out", str(out), "--overwrite",
                              "--category", "music"])
    assert res.exit_code == 0, res.output
    assert (out / "notes.txt").read_text() == "mine" and "notes.txt" in res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["category"] == "music" and manifest["kept"] == ["notes.txt"]
    before = _tree(out)

    unknown = tmp_path / "other.csv"
    unknown.write_text("a,b,c\n1,2,3\n")
    res = runner.invoke(cli, ["ingest", str(unknown), "--out", str(out), "--overwrite"])
    _refused(res, "other.csv")
    assert _tree(out) == before

    split = tmp_path / "split"
    res = runner.invoke(cli, ["split", str(out), "--out", str(split), "--method", "leave-last-two"])
    assert res.exit_code == 0, res.output
    before = _tree(split)
    broken = tmp_path / "broken"
    (broken / "reviews").mkdir(parents=True)
    (broken / "reviews" / "part-00000.parquet").write_bytes(b"PAR1 cut short")
    res = runner.invoke(cli, ["split", str(broken), "--out", str(split), "--overwrite"])
    _refused(res, "part-00000.parquet")
    assert _tree(split) == before


def test_an_output_the_store_refuses_is_one_line(s3_env, ray_session):
    """An `--out` in a bucket the store does not have (as a missing credential or a typo
    in the bucket is met): one line naming the store's answer and where credentials come
    from, exit 2; it was a 52-line traceback."""
    res = CliRunner().invoke(cli, ["ingest", str(SAMPLE / "reviews.jsonl"), "--out", "s3://no-such-bucket-45/run"])
    _refused(res, "no-such-bucket-45", "NO_SUCH_BUCKET", "credentials")
    assert len(res.output.strip().splitlines()) <= 3, res.output
