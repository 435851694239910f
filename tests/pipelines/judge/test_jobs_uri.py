"""`rexeval judge pairwise` with its inputs and output on S3 (moto on 127.0.0.1), the
scripted LLM in each chunk actor: the same tables as a local run, nothing written to
the local disk, the LLM-call cache beside the output, and re-runs that resume from the
chunk markers in the bucket (no LLM call for a finished chunk)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pytest

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import EXPLANATIONS, REVIEWS
from rexeval.storage import location
from rexeval.pipelines.judge.config import LikertJobConfig, PairwiseJobConfig
from rexeval.pipelines.judge.jobs import run_pairwise

SCRIPTED = "tests.doubles.llm:ScriptedLLM"
CHUNK = 3
EXAMPLES = 7  # the other system's pairs: 3 chunks of at most 3
TABLES = ["verdicts.parquet", "calls.parquet", "errors.parquet", "pairwise.md"]


def _planted(root: Path) -> dict[str, str]:
    """Two systems' explanations (the other system also explains one example the
    baseline does not: an error row) and an ingested reviews table: each user bought
    two items, so the judge sees a one-purchase history and the item's title."""
    expl, reviews = [], []
    for k in range(1, EXAMPLES + 1):
        user, item = f"u{k}", f"i{k}"
        expl.append({"example_id": f"e{k}", "system": "base", "user_id": user, "item_id": item,
                     "explanation": f"You may like item {k}.", "reference": None})
        # Odd examples are "great": the scripted judge prefers whatever it shows first then.
        word = "great" if k % 2 else "fine"
        expl.append({"example_id": f"e{k}", "system": "other", "user_id": user, "item_id": item,
                     "explanation": f"A {word} pick for you, item {k}.", "reference": None})
        for line, (it, ts) in enumerate(((f"i{k + 100}", 1), (item, 2)), start=2 * k):
            reviews.append({"review_id": f"r{k}-{it}", "user_id": user, "item_id": it, "rating": 4.0,
                            "timestamp": ts, "text": f"Review of {it}.", "summary": None, "user_name": None,
                            "item_title": f"Title {it}", "category": "planted", "helpful_votes": None,
                            "source": "planted.jsonl", "line": line})
    expl.append({"example_id": "e99", "system": "other", "user_id": "u99", "item_id": "i99",
                 "explanation": "No baseline here.", "reference": None})
    write_parquet_atomic(root / "expl.parquet", pa.Table.from_pylist(expl, schema=EXPLANATIONS))
    write_parquet_atomic(root / "ingest" / "reviews" / "part-00000.parquet",
                         pa.Table.from_pylist(reviews, schema=REVIEWS))
    return {"explanations": str(root / "expl.parquet"), "reviews": str(root / "ingest")}


def _job(inputs: dict[str, str], out: str, log: Path, **kw) -> PairwiseJobConfig:
    return PairwiseJobConfig(explanations=[inputs["explanations"]], reviews=[inputs["reviews"]], baseline="base",
                             divide=False, out=out, judge_service="none", chunk_size=CHUNK, backend=SCRIPTED,
                             models={"judge_llm": "scripted-judge"},
                             backend_options={"rules": [["great", "Better.\n[[A]]"]], "default": "Fair.\n[[C]]",
                                              "log": str(log)}, **kw)


def _calls(log: Path) -> list[str]:
    return [json.loads(x)["last"] for x in log.read_text().splitlines()] if log.exists() else []


def _bytes(root: str) -> dict[str, bytes]:
    return {name: (location(root) / name).read_bytes() for name in TABLES}


def _same_report(a: dict, b: dict) -> None:
    for key in ("pairs", "errors", "no_context", "win_rates", "position_bias"):
        assert a[key] == b[key], key
    assert a["usage"]["calls"] == b["usage"]["calls"]


@pytest.fixture(scope="module")
def local(tmp_path_factory, ray_session):
    """The planted inputs and the job's output on the local disk."""
    root = tmp_path_factory.mktemp("judge_uri")
    inputs = _planted(root / "inputs")
    report = run_pairwise(_job(inputs, str(root / "out"), root / "calls.jsonl", cache=str(root / "calls.sqlite")),
                          progress=lambda m: None)
    return inputs, root, report


@pytest.mark.slow
def test_the_local_run_judges_every_pair_with_contexts(local):
    _, root, report = local
    assert report["pairs"] == EXAMPLES and report["errors"] == 1 and report["no_context"] == 0
    assert report["usage"]["calls"] == 2 * EXAMPLES == len(_calls(root / "calls.jsonl"))
    assert "Title i" in (root / "out" / "calls" / "payload.parquet").read_bytes().decode("latin-1")


@pytest.mark.slow
def test_inputs_and_out_on_s3_give_the_local_tables_and_resume_from_markers(local, s3_root, tmp_path, monkeypatch):
    inputs, root, report = local
    location(f"{s3_root}/in/expl.parquet").upload(inputs["explanations"])
    location(f"{s3_root}/in/ingest").upload(inputs["reviews"])
    there = {"explanations": f"{s3_root}/in/expl.parquet", "reviews": f"{s3_root}/in/ingest"}
    monkeypatch.chdir(tmp_path)  # a URI mistaken for a local path (Path("s3://...")) would land here
    log = tmp_path.parent / f"{tmp_path.name}-calls.jsonl"
    out = f"{s3_root}/out"

    got = run_pairwise(_job(there, out, log), progress=lambda m: None)
    assert list(tmp_path.iterdir()) == []
    assert _bytes(out) == _bytes(str(root / "out"))
    _same_report(got, report)
    saved = (location(out) / "report.json").read_json()
    _same_report(saved, json.loads((root / "out" / "report.json").read_text()))
    asked = len(_calls(log))
    assert asked == len(_calls(root / "calls.jsonl")) > 0
    # No cache was named and the output is a URI: the calls are kept beside it.
    cache = location(out) / "_llm_cache"
    assert cache.walk_files(), "the LLM-call cache is not under <out>/_llm_cache"

    # Without the cache, a re-run still asks nothing: every chunk's marker is in the bucket.
    cache.rmtree()
    lines: list[str] = []
    again = run_pairwise(_job(there, out, log), progress=lines.append)
    assert len(_calls(log)) == asked and any("already done" in x for x in lines), lines
    assert again["usage"]["calls"] == report["usage"]["calls"]
    assert _bytes(out) == _bytes(str(root / "out"))

    # Without chunk 1's marker (and no cache), only chunk 1's pairs are asked again.
    cache.rmtree()
    (location(out) / "calls" / "_done" / "part-00001.json").unlink()
    lines = []
    run_pairwise(_job(there, out, log), progress=lines.append)
    assert len(_calls(log)) - asked == 2 * CHUNK  # both orders of its 3 pairs
    assert any("in 3 chunk(s), 2 already done" in x for x in lines), lines
    assert _bytes(out) == _bytes(str(root / "out"))
    assert list(tmp_path.iterdir()) == []


def test_a_local_one_shot_pool_is_copied_beside_a_uri_output(s3_root, tmp_path):
    """The chunk actors read the one-shot examples; a local file exists only on this
    node, so with a URI output it is copied there, and the chunks' settings still name
    the user's file."""
    from rexeval.pipelines.judge.inputs import read_examples
    from rexeval.pipelines.judge.jobs import _examples
    from rexeval.pipelines.judge.likert import ASPECTS

    pool = tmp_path / "rated.parquet"
    write_parquet_atomic(pool, pa.table({"user_id": ["u1"], "item_id": ["i1"], "system": ["s"], "explanation": ["e"],
                                         **{f"human_{a}": [4.0] for a in ASPECTS}}))
    cfg = LikertJobConfig(explanations=["x"], shots="one", examples=str(pool), out=f"{s3_root}/likert")
    got = _examples(cfg, location(cfg.out))
    assert got["examples"] == str(pool.resolve())
    assert got["examples_at"] == f"{s3_root}/likert/_inputs/examples.parquet"
    assert location(got["examples_at"]).read_bytes() == pool.read_bytes()
    # A local output (a disk every node mounts) and a pool in the bucket need no copy.
    assert _examples(cfg.model_copy(update={"out": str(tmp_path / "o")}), location(tmp_path / "o")) == {
        "examples": str(pool.resolve())}
    there = f"{s3_root}/rated.parquet"
    location(there).upload(pool)
    assert _examples(cfg.model_copy(update={"examples": there}), location(cfg.out)) == {"examples": there}
    # A pool in another format keeps it in the copy's name (the readers tell the format by it).
    gz = tmp_path / "rated.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"uid": "u1", "item_id": "i1", "system": "s", "explanation": "e", '
                                 b'"human_persuasiveness": 4, "human_transparency": 4, "human_accuracy": 4, '
                                 b'"human_satisfaction": 4}\n'))
    got = _examples(cfg.model_copy(update={"examples": str(gz), "columns": {"user_id": "uid"}}), location(cfg.out))
    assert got["examples_at"] == f"{s3_root}/likert/_inputs/examples.jsonl.gz"
    assert got["examples_columns"] == {"user_id": "uid"}
    assert read_examples(got["examples_at"], ASPECTS, {"user_id": "uid"})["user_id"].tolist() == ["u1"]
