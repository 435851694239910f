"""`rexeval generate llm` with its output (and its split folder) on S3 (moto on
127.0.0.1): the same tables as a local run, nothing written to the local disk, and a
re-run that resumes from the chunk markers in the bucket."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexeval.pipelines.core.io import read_parquet
from rexeval.storage import location
from rexeval.pipelines.generate.prompted.config import PromptedJob
from rexeval.pipelines.generate.prompted.job import run_prompted
from tests.doubles.planted_split import planted_split

pytestmark = pytest.mark.slow

METHODS = ["review_extract", "review_summary"]
GOOD = "Other buyers say it sounds clear, stays in tune and survives every gig they take it to."
CHUNK = 3
TABLES = ["explanations.parquet", "errors.parquet", "review_extract/plan.parquet", "review_summary/plan.parquet"]


def _job(split: str, out: str, log: Path, methods: list[str] = METHODS, **kw) -> PromptedJob:
    # Summaries that show review "noise words 5 and 1" get a one-word answer, retries too: error rows.
    rules = [["noise words 5 and 1", "Sure."], ["only 1 word", "Sure."]]
    return PromptedJob(input=split, methods=methods, out=out, backend="tests.doubles.llm:ScriptedLLM",
                       models={"llm": "scripted-writer"},
                       backend_options={"rules": rules, "default": GOOD, "log": str(log)},
                       judge_service="none", chunk_size=CHUNK, use_cache=False, **kw)


def _sent(log: Path) -> list[str]:
    return [json.loads(line)["last"] for line in log.read_text().splitlines()] if log.exists() else []


def _bytes(root: str) -> dict[str, bytes]:
    return {name: (location(root) / name).read_bytes() for name in TABLES}


@pytest.fixture(scope="module")
def local(tmp_path_factory, ray_session):
    """The planted split and the job's output on the local disk."""
    root = tmp_path_factory.mktemp("generate_llm_uri")
    split, _ = planted_split(root, n_users=8, n_items=8)
    report = run_prompted(_job(str(split), str(root / "out"), root / "calls.jsonl"), progress=lambda s: None)
    return split, root, report


def test_the_local_run_has_explanations_and_error_rows(local):
    _, root, report = local
    summary = report["methods"]["review_summary"]
    assert summary["explanations"] and summary["error_types"].get("unparseable"), summary
    assert report["methods"]["review_extract"]["explanations"] == report["interactions"]


def test_out_on_s3_gives_the_local_bytes_writes_nothing_here_and_resumes_from_markers(
        local, s3_root, tmp_path, monkeypatch):
    split, root, report = local
    monkeypatch.chdir(tmp_path)  # a path mistaken for local (Path("s3://...")) would land here
    log = tmp_path.parent / f"{tmp_path.name}-calls.jsonl"
    out = f"{s3_root}/out"
    got = run_prompted(_job(str(split), out, log), progress=lambda s: None)
    assert list(tmp_path.iterdir()) == []
    assert _bytes(out) == _bytes(str(root / "out"))
    assert got["methods"] == report["methods"] and got["input"] == report["input"]
    asked = len(_sent(log))
    assert asked == len(_sent(root / "calls.jsonl")) > 0

    # A re-run finds every chunk's marker in the bucket: no call at all.
    lines: list[str] = []
    run_prompted(_job(str(split), out, log), progress=lines.append)
    assert len(_sent(log)) == asked and any("already done" in x for x in lines)

    # Without chunk 1's marker, only chunk 1's prompts are asked again.
    calls = location(out) / "review_summary" / "calls"
    (calls / "_done" / "part-00001.json").unlink()
    (location(out) / "explanations.parquet").unlink()
    payload = read_parquet(calls / "payload.parquet").to_pandas()
    chunk = {json.loads(m)[-1]["content"][-200:] for m in payload["messages"][CHUNK:2 * CHUNK]}
    lines = []
    run_prompted(_job(str(split), out, log), progress=lines.append)
    again = _sent(log)[asked:]
    assert chunk and chunk <= set(again) and all(s in chunk or "word" in s for s in again)  # + retry feedback
    chunks = -(-len(payload) // CHUNK)
    assert any(f"in {chunks} chunk(s), {chunks - 1} already done" in x for x in lines), lines
    assert _bytes(out) == _bytes(str(root / "out"))
    assert list(tmp_path.iterdir()) == []


def test_a_split_folder_on_s3_gives_the_same_tables(local, s3_root, tmp_path, monkeypatch):
    split, root, _ = local
    location(f"{s3_root}/split").upload(split)
    monkeypatch.chdir(tmp_path)
    out = f"{s3_root}/out"
    report = run_prompted(_job(f"{s3_root}/split", out, tmp_path.parent / f"{tmp_path.name}-calls.jsonl"),
                          progress=lambda s: None)
    assert list(tmp_path.iterdir()) == []
    assert report["input"] == f"{s3_root}/split" and report["kind"] == "split"
    here = _bytes(str(root / "out"))
    there = _bytes(out)
    for name in ("explanations.parquet", "review_extract/plan.parquet", "review_summary/plan.parquet"):
        assert there[name] == here[name], name
    # Error rows name their input: the split's URI instead of the local folder.
    mine = read_parquet(location(out) / "errors.parquet").to_pandas()
    theirs = read_parquet(root / "out" / "errors.parquet").to_pandas()
    assert len(mine) and (mine["source"] == f"{s3_root}/split").all()
    assert mine.drop(columns="source").equals(theirs.drop(columns="source"))
