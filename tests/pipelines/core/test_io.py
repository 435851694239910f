import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import ShardedOutput, read_table, write_parquet_atomic
from rexeval.pipelines.core.schema import SchemaError, empty, validate_table


def _reviews(n, offset=0):
    return pa.table({
        "review_id": [f"r{i}" for i in range(offset, offset + n)],
        "user_id": ["u"] * n, "item_id": ["i"] * n, "rating": [5.0] * n,
        "timestamp": list(range(n)), "text": ["good"] * n, "source": ["f"] * n,
        "line": list(range(1, n + 1)),
    })


def test_validate_names_file_row_and_field(tmp_path):
    t = _reviews(5)
    users = t.column("user_id").to_pylist()
    users[3] = None
    t = t.set_column(1, "user_id", pa.array(users))
    path = tmp_path / "part.parquet"
    pq.write_table(t, path)
    with pytest.raises(SchemaError) as err:
        read_table(path, "reviews")
    msg = str(err.value)
    assert str(path) in msg and "row 4" in msg  # 1-based: users[3] is the 4th row and "'user_id'" in msg


def test_validate_rejects_unknown_column_and_bad_type():
    with pytest.raises(SchemaError, match="unexpected column"):
        validate_table(_reviews(2).append_column("oops", pa.array([1, 2])), "reviews")
    t = _reviews(3).set_column(3, "rating", pa.array(["5", "x", "4"]))
    with pytest.raises(SchemaError, match="row 2.*'rating'"):
        validate_table(t, "reviews")


def test_missing_nullable_columns_are_filled():
    out = validate_table(_reviews(2), "reviews")
    assert out.column("summary").null_count == 2
    assert out.schema.equals(empty("reviews").schema)


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError):
        write_parquet_atomic(path, _reviews(1))
    assert list(tmp_path.iterdir()) == []


def test_sharded_output_resume_and_config_guard(tmp_path):
    out = ShardedOutput(tmp_path / "o", "job", {"a": 1}, ["reviews"]).open()
    out.write_shard(0, {"reviews": _reviews(2)}, {"in": 2, "out": 2})
    out.write_shard(1, {"reviews": _reviews(3, 2)}, {"in": 3, "out": 3})
    assert set(out.done_shards()) == {0, 1}
    assert out.total_counts() == {"in": 5, "out": 5}
    m = out.finish(2)
    assert m["status"] == "complete" and m["counts"]["out"] == 5
    assert out.read("reviews").num_rows == 5
    # Same config: reopening keeps finished shards.
    again = ShardedOutput(tmp_path / "o", "job", {"a": 1}, ["reviews"]).open()
    assert set(again.done_shards()) == {0, 1}
    # Another config must not mix into the same folder.
    with pytest.raises(FileExistsError, match="different"):
        ShardedOutput(tmp_path / "o", "job", {"a": 2}, ["reviews"]).open()
    fresh = ShardedOutput(tmp_path / "o", "job", {"a": 2}, ["reviews"]).open(overwrite=True)
    assert fresh.done_shards() == {}


def test_an_input_counts_by_its_content_not_by_its_folder(tmp_path):
    """A re-run from another node reads the same input under another folder (the working
    dir unpacked there): it resumes. An input edited in place is another config."""
    first, second = tmp_path / "node0" / "r.jsonl", tmp_path / "node1" / "pkg" / "r.jsonl"
    for f in (first, second):
        f.parent.mkdir(parents=True)
        f.write_text('{"review": "good"}\n')
    os.utime(second, (1_800_000_000, 1_800_000_000))
    out = ShardedOutput(tmp_path / "o", "ingest", {"inputs": [str(first)], "k": 1}, ["reviews"]).open()
    out.write_shard(0, {"reviews": _reviews(2)}, {"in": 2, "out": 2})
    again = ShardedOutput(tmp_path / "o", "ingest", {"inputs": [str(second)], "k": 1}, ["reviews"]).open()
    assert set(again.done_shards()) == {0}
    second.write_text('{"review": "bad"}\n')
    with pytest.raises(FileExistsError, match="different"):
        ShardedOutput(tmp_path / "o", "ingest", {"inputs": [str(second)], "k": 1}, ["reviews"]).open()


def test_shard_without_marker_is_not_done(tmp_path):
    out = ShardedOutput(tmp_path / "o", "job", {}, ["reviews"]).open()
    write_parquet_atomic(out.shard_path("reviews", 0), _reviews(1))  # crash before marker
    assert out.done_shards() == {}
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["status"] == "running"


def test_refuses_foreign_folder(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "precious.txt").write_text("x")
    with pytest.raises(FileExistsError, match="no rexeval manifest"):
        ShardedOutput(tmp_path / "o", "job", {}, ["reviews"]).open()
    assert os.path.exists(tmp_path / "o" / "precious.txt")


def test_a_run_killed_writing_its_first_manifest_resumes(tmp_path):
    """SIGKILL between the manifest's temporary file and its rename (CI caught a study
    killed there): the folder holds only `.manifest.json.XXXX.tmp`, and a re-run must
    start, not call it a foreign folder."""
    folder = tmp_path / "o"
    killed = subprocess.run([sys.executable, "-c", (
        "import os, signal\n"
        "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from rexeval.pipelines.core.io import ShardedOutput\n"
        f"ShardedOutput({str(folder)!r}, 'job', {{'a': 1}}, ['reviews']).open()\n")])
    assert killed.returncode == -signal.SIGKILL
    left = [p.name for p in folder.iterdir()]
    assert len(left) == 1 and left[0].startswith(".manifest.json.") and left[0].endswith(".tmp")

    out = ShardedOutput(folder, "job", {"a": 1}, ["reviews"]).open()
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]
    assert out.read_manifest()["status"] == "running"


def test_a_leftover_beside_foreign_files_is_still_refused(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / ".manifest.json.ab12.tmp").write_text("{")
    (tmp_path / "o" / "precious.txt").write_text("x")
    with pytest.raises(FileExistsError, match="no rexeval manifest"):
        ShardedOutput(tmp_path / "o", "job", {}, ["reviews"]).open()
    assert (tmp_path / "o" / "precious.txt").read_text() == "x"


def test_only_read_settings_count_by_content(tmp_path):
    """Ingest records its inputs as {"path", "size"}: those count by content. A file a
    setting names for writing (a call log) changes every run: it counts by its name."""
    from rexeval.pipelines.core.io import config_hash

    a, b, log = tmp_path / "a" / "r.csv", tmp_path / "b" / "r.csv", tmp_path / "calls.log"
    for f in (a, b):
        f.parent.mkdir()
        f.write_text("u,i,5,1,good\n")
    log.write_text("1\n")
    conf = lambda f: {"inputs": [{"path": str(f), "size": 13}], "backend_options": {"log": str(log)}}  # noqa: E731
    before = config_hash(conf(a))
    assert config_hash(conf(b)) == before
    log.write_text("1\n2\n")
    assert config_hash(conf(a)) == before


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    from rexeval.pipelines.core.io import UnreadableParquet, parquet_schema, read_parquet

    cut = tmp_path / "part-00000.parquet"
    pq.write_table(pa.table({"x": list(range(100))}), cut)
    cut.write_bytes(cut.read_bytes()[:40] + b"PAR1")  # both magics, the middle gone
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"\x00\x01 not parquet at all")
    for path in (cut, garbage):
        for read in (read_parquet, parquet_schema):
            with pytest.raises(UnreadableParquet, match=f"{path}: not a readable Parquet file"):
                read(path)
    with pytest.raises(SchemaError, match=r"garbage.parquet: not a readable Parquet file \(") as err:
        read_table(garbage, "reviews")
    assert str(err.value).count("not a readable") == 1


def test_an_undeclared_table_whose_column_is_all_none_in_one_part_reads_whole(tmp_path):
    import pandas as pd

    # A chunk task's table from pandas: a column that held only None in one chunk is of
    # type null in that part; the other parts give its type.
    out = ShardedOutput(tmp_path / "o", "job", {}, ["detail"]).open()
    out.write_shard(0, {"detail": pa.Table.from_pandas(pd.DataFrame({"k": [1, 2], "problem": [None, None]}))},
                    {"rows": 2})
    out.write_shard(1, {"detail": pa.Table.from_pandas(pd.DataFrame({"k": [3], "problem": [float("nan")]}))},
                    {"rows": 1})
    out.write_shard(2, {"detail": pa.Table.from_pandas(pd.DataFrame({"k": [4], "problem": [2.5]}))}, {"rows": 1})
    t = out.read("detail")
    assert t.schema.field("problem").type == pa.float64() and t.column("k").to_pylist() == [1, 2, 3, 4]
    assert t.column("problem").to_pylist()[:2] == [None, None] and t.column("problem").to_pylist()[3] == 2.5
