"""`--overwrite` removes only what the earlier job's manifest lists as its own
(pipelines/core/io.py: ShardedOutput.open, remove_entries)."""
import json

import pyarrow as pa
import pytest

from rexeval.pipelines.core.io import MANIFEST, ShardedOutput, remove_entries


def _job(root, setting: int, tables=("parts", "rejects"), owns=()):  # not schema tables: any columns
    return ShardedOutput(root, "ingest", {"setting": setting}, list(tables), owns=owns)


def _write(out: ShardedOutput) -> None:
    t = pa.table({"x": [1, 2]})
    out.write_shard(0, {name: t for name in out.tables}, {"in": 2, "out": 2})
    (out.root / "report.json").write_json({"done": True})  # a file the job writes beside its tables
    out.finish(1)


def test_overwrite_keeps_what_is_not_the_jobs(tmp_path):
    root = tmp_path / "o"
    _write(_job(root, 1).open())
    manifest = json.loads((root / MANIFEST).read_text())
    assert set(manifest["owns"]) == {"_done", "manifest.json", "parts", "rejects", "report.json"}
    (root / "notes.txt").write_text("mine")  # the user's, written after the job
    (root / "data").mkdir()
    (root / "data" / "r.jsonl").write_text("{}")

    with pytest.raises(FileExistsError, match="different 'ingest' config"):
        _job(root, 2).open()
    assert (root / "parts").is_dir()  # refused: nothing touched

    out = _job(root, 2).open(overwrite=True)
    assert sorted(p.name for p in root.iterdir()) == ["data", MANIFEST, "notes.txt"]
    assert (root / "notes.txt").read_text() == "mine" and (root / "data" / "r.jsonl").exists()
    assert out.kept == ["data", "notes.txt"] and out.kept_now
    _write(out)
    manifest = json.loads((root / MANIFEST).read_text())
    assert manifest["kept"] == ["data", "notes.txt"] and "notes.txt" not in manifest["owns"]

    # A later overwrite still leaves them; so does resuming the same settings.
    assert _job(root, 2).open().kept == ["data", "notes.txt"]
    _job(root, 3).open(overwrite=True)
    assert (root / "notes.txt").exists() and not (root / "parts").exists()


def test_a_folder_without_a_manifest(tmp_path):
    root = tmp_path / "u"
    root.mkdir()
    (root / "r.jsonl").write_text("{}")
    with pytest.raises(FileExistsError, match=r"no rexeval manifest \(it holds r.jsonl\)"):
        _job(root, 1).open()
    out = _job(root, 1).open(overwrite=True)  # written beside the file, which stays
    _write(out)
    assert (root / "r.jsonl").read_text() == "{}" and out.kept == ["r.jsonl"]

    # An entry by the name of one of the job's tables could be read as its output: refused.
    other = tmp_path / "v"
    (other / "parts").mkdir(parents=True)
    (other / "parts" / "part-00000.parquet").write_bytes(b"not ours")
    with pytest.raises(FileExistsError, match="parts/, which no rexeval manifest accounts for"):
        _job(other, 1).open(overwrite=True)
    assert (other / "parts" / "part-00000.parquet").read_bytes() == b"not ours"


def test_a_manifest_from_before_owns_removes_its_tables_only(tmp_path):
    root = tmp_path / "o"
    out = _job(root, 1).open()
    _write(out)
    manifest = json.loads((root / MANIFEST).read_text())
    del manifest["owns"]
    (root / MANIFEST).write_text(json.dumps(manifest))
    _job(root, 2).open(overwrite=True)
    assert sorted(p.name for p in root.iterdir()) == [MANIFEST, "report.json"]


def test_an_output_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        _job(f, 1).open(overwrite=True)
    assert f.read_text() == "x"


def test_remove_entries_removes_only_the_names_given(tmp_path):
    (tmp_path / "tune" / "t1").mkdir(parents=True)
    (tmp_path / "train.json").write_text("{}")
    (tmp_path / ".train.json.abc.tmp").write_text("")  # a killed write's leftover
    (tmp_path / "mine.txt").write_text("x")
    (tmp_path / "train-expgcn.json").write_text("{}")
    assert remove_entries(tmp_path, ["tune", "train.json", "best/state.pt", "train-{name}.json"]) == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
