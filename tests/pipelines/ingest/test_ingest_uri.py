"""Ingest and split with their inputs and outputs on an object store (moto S3 on
127.0.0.1): the same tables as a run on a local folder, resumable from the markers on
the store, and bad rows still named by file, line and field."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.storage import location
from rexeval.pipelines.ingest.config import IngestConfig, SplitConfig
from rexeval.pipelines.ingest.pipeline import run_ingest
from rexeval.pipelines.ingest.split_pipeline import run_split


def _r2014(user, item, t, text="Warm tone, clean frets.", rating=5.0):
    return {"reviewerID": user, "asin": item, "reviewerName": "Ann", "helpful": [1, 2],
            "reviewText": text, "overall": rating, "summary": "ok", "unixReviewTime": t}


def _inputs(folder: Path) -> dict[str, Path]:
    """One file of each kind a reader handles differently: JSON lines with a duplicate
    and a broken line, the same reviews gzipped (all duplicates of the first file), a
    headerless CSV with quoted newlines, a Parquet file of several row groups, and
    item metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [_r2014(f"U{i % 7}", f"I{i % 5}", 1400000000 + i) for i in range(40)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(12, json.dumps(rows[3]))  # a duplicate of line 4
    lines.insert(25, '{"reviewerID": "U9", "asin": ')  # not JSON
    lines.insert(30, json.dumps(_r2014("U8", "I1", 1400000500, rating=9.0)))  # rating out of range
    (folder / "reviews.json").write_text("\n".join(lines) + "\n")
    (folder / "again.json.gz").write_bytes(gzip.compress(("\n".join(lines[:10]) + "\n").encode()))
    csv = []
    for i in range(30):
        text = f'first line {i}\nsecond ""quoted"" line' if i % 4 == 1 else f"plain {i}"
        csv.append(f'C{i % 6},B{i % 3},N,"[0, 0]","{text}",{1 + i % 5},S,{1393545600 + i},"d"')
    (folder / "kaggle.csv").write_text("\n".join(csv) + "\n")
    table = pa.table({"user": [f"P{i % 4}" for i in range(24)], "item": [f"Q{i % 6}" for i in range(24)],
                      "stars": [float(1 + i % 5) for i in range(24)], "body": [f"text {i}" for i in range(24)],
                      "time": [1500000000 + i for i in range(24)]})
    pq.write_table(table, folder / "table.parquet", row_group_size=12)
    (folder / "meta.json").write_text("\n".join([json.dumps({"asin": "I1", "title": "Nylon strings"}),
                                                 repr({"asin": "B2", "title": "Capo"})]) + "\n")
    return {p.name: p for p in folder.iterdir()}


def _upload(files: dict[str, Path], to: str) -> dict[str, str]:
    out = {}
    for name, path in files.items():
        (location(to) / name).upload(path)
        out[name] = f"{to}/{name}"
    return out


PARQUET_COLUMNS = {"user_id": "user", "item_id": "item", "rating": "stars", "text": "body", "timestamp": "time"}


def _configs(files: dict, out: str) -> list[IngestConfig]:
    """Two ingest runs: the review dumps with titles, and the Parquet table by --columns."""
    dumps = [str(files[n]) for n in ("reviews.json", "again.json.gz", "kaggle.csv")]
    return [IngestConfig(inputs=dumps, meta=[str(files["meta.json"])], out=f"{out}/dumps",
                         chunk_mb=0.003, category="instruments"),
            IngestConfig(inputs=[str(files["table.parquet"])], out=f"{out}/table", chunk_mb=0.0001,
                         columns=PARQUET_COLUMNS)]


def _tables(root: str, names=("reviews", "errors")) -> dict[str, pa.Table]:
    return {n: read_table(location(root) / n, "reviews" if n != "errors" else "errors") for n in names}


def _renamed(table: pa.Table, old: str, new: str) -> pa.Table:
    """`table` with `old` replaced by `new` in its source and message columns."""
    for name in ("source", "message"):
        if name in table.column_names:
            i = table.schema.get_field_index(name)
            table = table.set_column(i, table.field(name), pc.replace_substring(table.column(name), old, new))
    return table


def _quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module")
def local(tmp_path_factory, ray_session) -> dict:
    """The inputs, and both ingests and a split of them run on a local folder."""
    root = tmp_path_factory.mktemp("ingest-local")
    files = _inputs(root / "in")
    out = str(root / "local")
    manifests = {location(c.out).name: run_ingest(c, progress=_quiet) for c in _configs(files, out)}
    run_split(SplitConfig(input=f"{out}/dumps", out=f"{out}/split"), progress=_quiet)
    return {"root": root, "files": files, "out": out, "manifests": manifests}


SPLITS = ("train", "valid", "test")


@pytest.mark.slow
def test_ingest_and_split_to_s3_give_the_local_tables_and_bytes(local, s3_root):
    before = sorted(local["root"].rglob("*"))
    for cfg in _configs(local["files"], s3_root):  # inputs on this disk, output on the store
        m = run_ingest(cfg, progress=_quiet)
        name = location(cfg.out).name
        assert m["counts"] == local["manifests"][name]["counts"] and m["shards"] >= 2
        assert m["config"] == local["manifests"][name]["config"]
        assert _tables(cfg.out) == _tables(f"{local['out']}/{name}")
        assert _tree(cfg.out) == _tree(f"{local['out']}/{name}")  # files, markers, manifest: same bytes
        assert not (location(cfg.out) / "_stage").exists()
    assert local["manifests"]["dumps"]["counts"] == {"in": 83, "out": 70, "errors": 13}
    split = run_split(SplitConfig(input=f"{s3_root}/dumps", out=f"{s3_root}/split"), progress=_quiet)
    assert split["counts"]["train"] > 0
    assert _tables(f"{s3_root}/split", SPLITS) == _tables(f"{local['out']}/split", SPLITS)
    # Nothing was written to this disk: every shard, marker and staged file went to the store.
    assert sorted(local["root"].rglob("*")) == before


@pytest.mark.slow
def test_inputs_on_s3_give_the_same_tables_naming_their_uris(local, s3_root):
    uris = _upload(local["files"], f"{s3_root}/in")
    here = str(local["root"] / "in")
    for cfg in _configs(uris, f"{s3_root}/out"):
        m = run_ingest(cfg, progress=_quiet)
        assert [f["path"] for f in m["config"]["inputs"]] == cfg.inputs  # URIs kept as given
        got = {k: _renamed(t, f"{s3_root}/in", here) for k, t in _tables(cfg.out).items()}
        assert got == _tables(f"{local['out']}/{location(cfg.out).name}")
    errors = _tables(f"{s3_root}/out/dumps")["errors"].to_pylist()
    dup = next(e for e in errors if e["error_type"] == "duplicate" and e["source"].endswith("reviews.json"))
    assert dup["message"].endswith(f"of {s3_root}/in/reviews.json line 4")
    run_split(SplitConfig(input=f"{s3_root}/out/dumps/reviews", out=f"{s3_root}/out/split"), progress=_quiet)
    got = {k: _renamed(t, f"{s3_root}/in", here) for k, t in _tables(f"{s3_root}/out/split", SPLITS).items()}
    assert got == _tables(f"{local['out']}/split", SPLITS)


def test_a_bad_row_on_s3_is_an_error_row_naming_file_line_and_field(s3_root, ray_session):
    rows = [json.dumps(_r2014("U1", "I1", 1400000000)), json.dumps(_r2014("U2", "I1", 1400000001, rating="five")),
            json.dumps(_r2014("U3", "I2", "yesterday"))]
    src = f"{s3_root}/in/bad.json"
    location(src).write_text("\n".join(rows) + "\n")
    m = run_ingest(IngestConfig(inputs=[src], out=f"{s3_root}/out"), progress=_quiet)
    assert m["counts"] == {"in": 3, "out": 1, "errors": 2}
    errors = {e["line"]: e for e in _tables(f"{s3_root}/out")["errors"].to_pylist()}
    assert errors[2]["source"] == src and errors[2]["field"] == "rating"
    assert "not a number" in errors[2]["message"] and "five" in errors[2]["raw"]
    assert errors[3]["source"] == src and errors[3]["field"] == "timestamp"


def _tree(root: str) -> dict[str, bytes]:
    base = location(root)
    return {f.relative_to(base): f.read_bytes() for f in base.walk_files() if "_stage" not in f.relative_to(base)}


class _Stop(Exception):
    pass


def _stop_after(text: str, k: int):
    """A progress callback that stops the job at its k-th line containing `text` (as a
    killed driver would: what workers committed stays, the rest is missing)."""
    seen = []

    def progress(line: str) -> None:
        if text in line:
            seen.append(line)
            if len(seen) == k:
                raise _Stop(line)
    return progress


@pytest.mark.slow
@pytest.mark.parametrize("after", [2, "all"], ids=["mid-parse", "before-commit"])
def test_an_interrupted_ingest_on_s3_resumes_from_its_markers(local, s3_root, after):
    cfg = _configs(local["files"], s3_root)[0]
    reference = _tree(f"{local['out']}/dumps")
    shards = len([k for k in reference if k.startswith("_done/")])
    with pytest.raises(_Stop):
        run_ingest(cfg, progress=_stop_after("parse: chunk", shards if after == "all" else after))
    root = location(cfg.out)
    assert not (root / "_done").exists() and (root / "_stage" / "parse" / "_done").iterdir()
    lines: list[str] = []
    assert run_ingest(cfg, progress=lines.append)["status"] == "complete"
    assert any("resuming:" in line for line in lines)
    if after == "all":  # every chunk was parsed: only the commit is left
        assert f"  resuming: {shards} of {shards} chunk(s) already done" in lines
        assert not any("parse: chunk" in line for line in lines)
    assert _tree(cfg.out) == reference

    # A run killed while committing: two shards committed, the others to parse again.
    for marker in (root / "_done").iterdir()[2:]:
        marker.unlink()
    again: list[str] = []
    run_ingest(cfg, progress=again.append)
    assert f"  resuming: 2 of {shards} chunk(s) already done" in again
    assert _tree(cfg.out) == reference


def test_the_parse_actors_are_pinned_to_this_node_only_for_local_paths(local, s3_root, ray_session, monkeypatch):
    from rexeval.pipelines.ingest import pipeline

    placed: list[dict] = []

    class Placed(pipeline.ParseStage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            placed.append(self.ray_remote_args)
            raise _Stop("placed")

    monkeypatch.setattr(pipeline, "ParseStage", Placed)
    src = location(f"{s3_root}/in/r.json")
    src.upload(local["files"]["reviews.json"])
    for inputs in ([str(local["files"]["reviews.json"])], [str(src)]):
        with pytest.raises(_Stop):
            run_ingest(IngestConfig(inputs=inputs, out=f"{s3_root}/out-{len(placed)}"), progress=_quiet)
    here = ray_session.get_runtime_context().get_node_id()
    strategy = placed[0]["scheduling_strategy"]
    assert strategy.node_id == here and strategy.soft is False
    assert placed[1] == {}  # every path a URI: the actors may run on any node
