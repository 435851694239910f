"""The study's `stats` (Table II of a split) and `annotations` jobs with their input and
output on an S3 endpoint: the same files as on a local folder."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from rexeval.pipelines.core.io import read_table, write_parquet_atomic
from rexeval.pipelines.core.schema import REVIEWS
from rexeval.storage import location
from rexeval.pipelines.study.builtin_jobs import AnnotationsConfig, StatsConfig, _annotations, _stats

SAMPLE = Path(__file__).resolve().parents[3] / "pipelines" / "sample"


def _reviews(n: int, start: int) -> pa.Table:
    rows = [{"review_id": f"r{start + i}", "user_id": f"u{i % 3}", "item_id": f"i{i % 4}", "rating": 4.0,
             "timestamp": 1400000000 + start + i, "text": "nice warm tone", "source": "s", "line": start + i,
             "category": "toys" if i % 2 else "sports"} for i in range(n)]
    return pa.table({f.name: [r.get(f.name) for r in rows] for f in REVIEWS}, schema=REVIEWS)


def _split(root: str) -> None:
    """A tiny split folder: train/, valid/, test/ of two categories."""
    for name, (n, start) in {"train": (8, 0), "valid": (3, 100), "test": (3, 200)}.items():
        write_parquet_atomic(location(root) / name / "part-00000.parquet", _reviews(n, start))


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path, ray_session):
    """The stats job reads through Ray Data: on the session's Ray, whose workers have the
    S3 endpoint's variables (a Ray started by the job itself before the endpoint existed
    would not, when this file runs first or alone)."""
    return str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("s3_root")


def test_stats_reads_a_split_and_writes_its_table_where_told(root):
    _split(f"{root}/split")
    m = _stats(StatsConfig(input=f"{root}/split", out=f"{root}/stats", name="all"), progress=lambda s: None)
    assert set(m["stats"]) == {"sports", "toys", "all"} and m["stats"]["all"]["interactions"] == 14
    out = location(f"{root}/stats")
    assert (out / "stats.json").read_json() == m
    assert "Interactions" in (out / "table2.md").read_text()


def test_annotations_become_a_statements_folder_where_told(root):
    m = _annotations(AnnotationsConfig(input=str(SAMPLE / "statements.jsonl"), out=f"{root}/ann"),
                     progress=lambda s: None)
    table = read_table(location(f"{root}/ann") / "statements", "statements")
    assert table.num_rows == m["counts"]["statements"] > 0
    assert (location(f"{root}/ann") / "manifest.json").read_json() == m
