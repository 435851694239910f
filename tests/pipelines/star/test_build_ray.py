"""`star build` on Ray workers (issue 47): its driver never reads a table's rows, and the
benchmark it writes is the one the whole-table builder (`build.build_star`, pinned by hand
in test_build.py) makes of the same rows.

The job runs on the session's local Ray with every whole-table reader of this process
(the driver) raising (`tests/doubles/whole_tables.py`); the expected tables are built
before that, in this process, from the same rows. Small inputs are built by one Ray task;
`ROWS_PER_GROUP` lowered makes the job take its keyed steps over several groups.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import write_json_atomic, write_parquet_atomic
from rexeval.pipelines.core.schema import CANONICAL, CLUSTERS, REVIEWS, STATEMENTS
from rexeval.pipelines.star.build import before_clustering_stats, build_star, format_table6
from rexeval.pipelines.star.config import BuildConfig
from rexeval.pipelines.star.pipeline import run_build
from tests.doubles.whole_tables import forbid_whole_tables
from tests.pipelines.star.test_build import CLUSTERS_T, REVIEWS_T, STATEMENTS_T

pytestmark = pytest.mark.slow
TABLES = ("interactions", "triplets", "candidates")


def _parts(rows: list[dict], schema: pa.Schema, n: int) -> list[pa.Table]:
    return [pa.Table.from_pylist([rows[i] for i in cut], schema=schema)
            for cut in np.array_split(np.arange(len(rows)), n)]


def random_inputs(seed: int = 0, n_reviews: int = 60, n_statements: int = 150) -> dict[str, list[pa.Table]]:
    """Statements, reviews, clusters and canonical texts in parts, made to reach every
    rule: reviews that tie on time and on the whole row id, a review_id given twice (the
    first counts) and reviews without statements; statements of unknown reviews, without
    words, without a cluster, of both stages, sharing clusters within one review; a
    statement_id clustered twice; canonical texts for some clusters; ids beyond ASCII."""
    rng = np.random.default_rng(seed)
    users, items = ["a", "b", "ü", "Z", "c10", "c9", "é", "d"], [f"i{k}" for k in range(9)]
    reviews = [{"review_id": f"r{r:03d}", "user_id": users[rng.integers(len(users))],
                "item_id": items[rng.integers(len(items))], "rating": 5.0, "timestamp": int(rng.integers(0, 6)),
                "text": "t", "summary": None, "user_name": None, "item_title": None, "category": None,
                "helpful_votes": None, "source": "ab"[rng.integers(2)] + ".json", "line": int(rng.integers(1, 4))}
               for r in range(n_reviews)]
    reviews.append(dict(reviews[3], user_id="zz", item_id="i0"))
    words = ["sturdy", "loud", "cheap", "warm", "!!", "great tone", "Loud"]
    sentiments = ["positive", "negative", None, "neutral"]
    statements = [{"statement_id": f"s{rng.integers(10 ** 6):06d}", "review_id": f"r{rng.integers(n_reviews + 6):03d}",
                   "user_id": "?", "item_id": "?", "statement": words[rng.integers(len(words))], "topic": None,
                   "sentiment": sentiments[rng.integers(4)], "stage": "verified" if s % 5 else "triplet",
                   "provenance": None} for s in range(n_statements)]
    clusters = [{"statement_id": r["statement_id"], "cluster_id": f"c{rng.integers(12):02d}",
                 "is_representative": False, "statement": "x", "sentiment": None}
                for r in statements if rng.random() < 0.9]
    clusters.append(dict(clusters[0], cluster_id="c99"))
    canonical = [{"cluster_id": f"c{k:02d}", "statement": f"canon {k}", "sentiment": sentiments[k % 4], "size": 1,
                  "occurrences": 1, "representative_id": "s"} for k in range(0, 12, 2)]
    return {"statements": _parts(statements, STATEMENTS, 3), "reviews": _parts(reviews, REVIEWS, 2),
            "clusters": _parts(clusters, CLUSTERS, 2), "canonical": _parts(canonical, CANONICAL, 1)}


FOLDERS = {"statements": "extract/statements", "reviews": "ingest/reviews", "clusters": "clusters/clusters",
           "canonical": "clusters/canonical"}


def write_inputs(root, inputs: dict[str, list[pa.Table]]) -> None:
    for name, parts in inputs.items():
        for i, part in enumerate(parts):
            write_parquet_atomic(f"{root}/{FOLDERS[name]}/part-{i:05d}.parquet", part)


def expected(inputs: dict[str, list[pa.Table]], clustered: bool, source: str):
    """The whole-table build of the inputs (verified statements) and Table 6's halves."""
    st = pa.concat_tables(inputs["statements"])
    st = st.filter(pc.equal(st.column("stage"), "verified"))
    whole = {k: pa.concat_tables(v) for k, v in inputs.items()}
    built = build_star(st, whole["reviews"], whole.get("clusters") if clustered else None,
                       whole.get("canonical") if clustered else None, source=source)
    stats = {"before": before_clustering_stats(st, built), **({"after": built.stats["after"]} if clustered else {})}
    return built, stats


def build_without_reading(tmp_path, monkeypatch, clustered: bool, **cfg) -> dict:
    """`run_build` with every whole-table reader of this process raising."""
    config = BuildConfig(statements=str(tmp_path / "extract"), reviews=str(tmp_path / "ingest"),
                         clusters=str(tmp_path / "clusters") if clustered else None, out=str(tmp_path / "bench"),
                         name="toy", **cfg)
    with monkeypatch.context() as m:
        forbid_whole_tables(m)
        return run_build(config, progress=lambda line: None)


def assert_same_benchmark(tmp_path, manifest: dict, built, stats: dict) -> None:
    out = tmp_path / "bench"
    assert manifest["status"] == "complete" and manifest["counts"] == built.counts
    for name in TABLES:
        assert pq.read_table(out / name).to_pylist() == built.tables[name].to_pylist(), name
    assert pq.read_table(out / "errors").to_pylist() == built.errors.to_pylist()
    write_json_atomic(tmp_path / "expected.json", {"toy": stats})
    assert (out / "stats.json").read_bytes() == (tmp_path / "expected.json").read_bytes()
    assert (out / "stats.md").read_text() == format_table6({"toy": stats})


def test_the_hand_made_benchmark_is_built_on_the_workers(tmp_path, monkeypatch, ray_session):
    """test_build.py's tables (one Ray task): the numbers it works out by hand."""
    inputs = {"statements": [STATEMENTS_T], "reviews": [REVIEWS_T], "clusters": [CLUSTERS_T]}
    write_inputs(tmp_path, inputs)
    built, stats = expected(inputs, True, str(tmp_path / "extract"))
    manifest = build_without_reading(tmp_path, monkeypatch, True)
    assert_same_benchmark(tmp_path, manifest, built, stats)
    c = manifest["counts"]
    assert (c["statement_rows"], c["statement_rows_used"], c["statement_rows_merged"], c["error_rows"]) == (11, 9, 1, 2)
    assert (c["train"], c["valid"], c["test"], c["users_evaluated"]) == (4, 2, 2, 2)
    errors = {r["row_id"]: r["error_type"] for r in pq.read_table(tmp_path / "bench" / "errors").to_pylist()}
    assert errors == {"s10": "unknown_review", "s11": "no_cluster"}
    assert pq.read_table(tmp_path / "bench" / "candidates").column("rows").to_pylist() == [4, 3, 2]
    assert (stats["before"]["statements"], stats["before"]["triplets"]) == (5, 10)


@pytest.mark.parametrize("clustered", [True, False], ids=["clusters-canonical", "polarity-words"])
def test_keyed_steps_over_several_groups_give_the_whole_table_benchmark(clustered, tmp_path, monkeypatch,
                                                                        ray_session):
    """Random inputs over three groups of keys: the keyed steps' tables, counts and
    Table 6 are the whole-table build's."""
    import rexeval.pipelines.core.runtime as runtime

    inputs = random_inputs()
    write_inputs(tmp_path, inputs)
    built, stats = expected(inputs, clustered, str(tmp_path / "extract"))
    assert built.counts["error_rows"] and built.counts["statement_rows_merged"]  # the inputs reach those rules
    monkeypatch.setattr(runtime, "ROWS_PER_GROUP", 80)  # 211 rows: 3 groups
    manifest = build_without_reading(tmp_path, monkeypatch, clustered)
    assert manifest["shards"] == 2  # the largest table (triplets, 99 rows) cut in 2 shards, written by 2 tasks
    assert_same_benchmark(tmp_path, manifest, built, stats)
