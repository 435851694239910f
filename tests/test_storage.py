"""The storage module on a local folder and on an S3 endpoint (moto on 127.0.0.1): the
same calls, the same answers."""
from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from rexeval.pipelines.core.io import ShardedOutput, read_table, table_files
from rexeval.storage import is_uri, local_copy, location


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_root")


def test_write_list_read_and_remove_the_same_way_on_both(root):
    base = location(root)
    assert not base.exists()
    (base / "t" / "part-00001.parquet").write_parquet(pa.table({"x": [3]}))
    (base / "t" / "part-00000.parquet").write_parquet(pa.table({"x": [1, 2]}))
    (base / "notes.json").write_json({"a": 1})
    assert base.is_dir() and (base / "notes.json").is_file()
    assert [c.name for c in base.iterdir()] == ["notes.json", "t"]
    assert [f.name for f in table_files(base / "t")] == ["part-00000.parquet", "part-00001.parquet"]
    assert read_table(base / "t", pa.schema([("x", pa.int64())]))["x"].to_pylist() == [1, 2, 3]
    assert (base / "notes.json").read_json() == {"a": 1}
    assert [f.relative_to(base) for f in base.walk_files()] == ["notes.json", "t/part-00000.parquet",
                                                                 "t/part-00001.parquet"]
    with local_copy(base / "t") as here:
        assert sorted(p.name for p in here.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    base.rmtree()
    assert not base.exists() and base.iterdir() == []


def test_a_location_pickles_as_its_text_and_names_its_parts(root):
    loc = location(root) / "a" / "b.json"
    assert pickle.loads(pickle.dumps(loc)) == loc
    assert loc.name == "b.json" and loc.stem == "b" and loc.parent == location(root) / "a"
    assert is_uri(loc) == root.startswith("s3://")
    if is_uri(loc):
        assert str(loc) == f"{root}/a/b.json"
        with pytest.raises(ValueError, match="not a local path"):
            loc.local_path()


def test_a_sharded_output_commits_and_resumes_by_markers(root):
    out = ShardedOutput(root, "job", {"k": 1}, ["t"]).open()
    out.write_shard(0, {"t": pa.table({"x": [1]})}, {"rows": 1})
    (location(root) / "t" / "part-00001.parquet").write_parquet(pa.table({"x": [9]}))  # no marker: not done
    again = ShardedOutput(root, "job", {"k": 1}, ["t"]).open()
    assert again.done_shards() == {0: {"rows": 1}}
    with pytest.raises(FileExistsError, match="different 'job' config"):
        ShardedOutput(root, "job", {"k": 2}, ["t"]).open()
    assert again.finish(1)["counts"] == {"rows": 1}
    assert again.read_manifest()["status"] == "complete"


def test_an_object_replaced_while_read_is_read_again_whole(s3_root):
    """pyarrow reads an object's size, then that many bytes: a study state replaced in
    between came back cut to the old size (`Expecting ',' delimiter`). Such a read is
    seen by its length and repeated."""
    import pyarrow as pa

    f = location(f"{s3_root}/torn/study.json")
    f.write_json({"steps": {"a": "complete", "b": "running"}})

    class ReplacedWhileRead:
        """The real store, but its first read returns the bytes of a shorter, older size."""

        def __init__(self, fs):
            self.fs, self.torn = fs, 1

        def open_input_stream(self, path, compression=None):
            if self.torn:
                self.torn -= 1
                return pa.BufferReader(f.read_bytes()[:20])
            return self.fs.open_input_stream(path, compression=compression)

        def get_file_info(self, path):
            return self.fs.get_file_info(path)

    f.fs = ReplacedWhileRead(f.fs)
    assert f.read_json() == {"steps": {"a": "complete", "b": "running"}} and f.fs.torn == 0


def test_written_files_honour_the_umask(tmp_path):
    """A whole-or-nothing write goes through a private temporary file; the file in place
    gets the mode `open()` would give it (0o666 less the umask), so others on a shared
    volume read outputs as the user's umask allows (issue 45: always 0600 before)."""
    import os
    import stat

    from rexeval.storage import current_umask, location

    location(tmp_path / "a.json").write_json({"x": 1})
    location(tmp_path / "b.parquet").write_parquet(__import__("pyarrow").table({"x": [1]}))
    want = 0o666 & ~current_umask()
    for name in ("a.json", "b.parquet"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == want
    old = os.umask(0o027)
    try:
        import rexeval.storage as storage

        storage._UMASK.clear()  # read again, as a new process would
        location(tmp_path / "c.json").write_json({})
        assert stat.S_IMODE(os.stat(tmp_path / "c.json").st_mode) == 0o640
    finally:
        os.umask(old)
        storage._UMASK.clear()
