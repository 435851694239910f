"""A job's driver that may not read a whole table, and a small reviews table that makes the
split and the statistics work (issue 47: no driver materialises a whole table).

`forbid_whole_tables(monkeypatch)` makes every reader that returns a Parquet table's rows
raise `WholeTableRead` in this process, the job's driver. Ray workers are other
processes, so the job's tasks read as they must; footers (`pq.read_metadata`,
`pq.read_schema`) stay allowed: they hold counts and columns, not rows.

`write_reviews(root)` writes `parts` Parquet parts of REVIEWS rows built to reach every
rule of the split: users with one review and users with many, timestamps that tie, rows
that tie on the whole ORDER_KEY in different parts (input order settles them), items
seen only once (cold-start items, k-core rounds), ids beyond ASCII, three categories and
a null one, texts of 0 to 5 words.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import REVIEWS


class WholeTableRead(AssertionError):
    """The driver asked for a whole table's rows."""


def _refuse(name: str):
    def reader(*args, **kwargs):
        raise WholeTableRead(f"the driver read a table's rows with {name}{tuple(str(a) for a in args[:1])}")

    return reader


def forbid_whole_tables(monkeypatch) -> None:
    """Every row reader of this process raises from now on (until the test ends)."""
    import rexeval.pipelines.core.io as io

    for owner, attr, name in [(pq, "read_table", "pyarrow.parquet.read_table"),
                              (pq, "read_pandas", "pyarrow.parquet.read_pandas"),
                              (pq.ParquetFile, "read", "ParquetFile.read"),
                              (pq.ParquetFile, "read_row_group", "ParquetFile.read_row_group"),
                              (pq.ParquetFile, "read_row_groups", "ParquetFile.read_row_groups"),
                              (pq.ParquetFile, "iter_batches", "ParquetFile.iter_batches"),
                              (pq.ParquetDataset, "read", "ParquetDataset.read"),
                              (pd, "read_parquet", "pandas.read_parquet"),
                              (io, "read_table", "io.read_table"),
                              (io, "read_parquet", "io.read_parquet"),
                              (io, "read_part", "io.read_part")]:
        monkeypatch.setattr(owner, attr, _refuse(name), raising=False)


USERS = ["a", "b", "c", "Z", "ü", "u10", "u9", "é", "d", "e", "f", "g", "h", "i"]
ITEMS = [f"i{n}" for n in range(30)]
CATEGORIES = ["toys", "sports", "music", None]
WORDS = ["warm", "tone", "cheap", "loud", "great"]


def reviews_rows(seed: int = 7, parts: int = 3, per_part: int = 40) -> list[list[dict]]:
    """The rows of each part (see the module docstring)."""
    rng = np.random.default_rng(seed)
    user_p = np.array([12, 10, 8, 7, 6, 5, 4, 3, 2, 1, 1, 1, 1, 1], float)
    item_p = 1.0 / np.arange(1, len(ITEMS) + 1)
    out = []
    for p in range(parts):
        rows = []
        for r in range(per_part):
            rows.append({
                "review_id": f"r{p}-{r}", "user_id": USERS[rng.choice(len(USERS), p=user_p / user_p.sum())],
                "item_id": ITEMS[rng.choice(len(ITEMS), p=item_p / item_p.sum())],
                "rating": float(rng.integers(1, 6)), "timestamp": 1_400_000_000 + int(rng.integers(0, 8)) * 86400,
                "text": " ".join(WORDS[: int(rng.integers(0, 6))]), "summary": None, "user_name": None,
                "item_title": None, "category": CATEGORIES[int(rng.integers(0, len(CATEGORIES)))],
                "helpful_votes": None, "source": f"{'ab'[int(rng.integers(0, 2))]}.json",
                "line": int(rng.integers(1, 4))})
        out.append(rows)
    return out


def write_reviews(root: str, seed: int = 7, parts: int = 3, per_part: int = 40) -> pd.DataFrame:
    """`root/part-0000N.parquet` for each part; returns all rows in input order (pandas)."""
    frames = []
    for p, rows in enumerate(reviews_rows(seed, parts, per_part)):
        table = pa.Table.from_pylist(rows, schema=REVIEWS)
        write_parquet_atomic(f"{root}/part-{p:05d}.parquet", table)
        frames.append(table.to_pandas())
    return pd.concat(frames, ignore_index=True)


def write_split(root: str) -> dict[str, pd.DataFrame]:
    """A split folder of `reviews_rows`: train/ (two parts), valid/ and test/ (one each)."""
    rows = [r for part in reviews_rows() for r in part]
    cuts = {"train": [rows[:40], rows[40:80]], "valid": [rows[80:100]], "test": [rows[100:]]}
    frames = {}
    for name, parts in cuts.items():
        for p, part in enumerate(parts):
            write_parquet_atomic(f"{root}/{name}/part-{p:05d}.parquet", pa.Table.from_pylist(part, schema=REVIEWS))
        frames[name] = pa.Table.from_pylist([r for part in parts for r in part], schema=REVIEWS).to_pandas()
    return frames


def write_statements(path: str, review_ids: list[str], seed: int = 3) -> pd.DataFrame:
    """Statements of some of `review_ids` and of reviews that are not there, triplet and
    verified, texts repeating (so unique < total), as one STATEMENTS Parquet file."""
    from rexeval.pipelines.core.schema import STATEMENTS

    rng = np.random.default_rng(seed)
    ids = [review_ids[i] for i in rng.integers(0, len(review_ids), 60)] + ["gone-1", "gone-2", "gone-2"]
    rows = [{"statement_id": f"s{n}", "review_id": rid, "user_id": "u", "item_id": "i",
             "statement": f"{WORDS[int(rng.integers(0, 5))]} {WORDS[int(rng.integers(0, 5))]}", "topic": None,
             "sentiment": None, "stage": "verified" if n % 3 else "triplet", "provenance": None}
            for n, rid in enumerate(ids)]
    write_parquet_atomic(path, pa.Table.from_pylist(rows, schema=STATEMENTS))
    return pd.DataFrame(rows)


def expected_table2(frames: dict[str, pd.DataFrame], statements: pd.DataFrame | None = None) -> dict:
    """Seed 000's Table II numbers worked out with pandas from the rows themselves:
    `frames` {"train", "valid", "test"} or {"all"}; statements count only when their
    review is in the frames."""
    rows = pd.concat(list(frames.values()), ignore_index=True)
    users, items, n = rows["user_id"].nunique(), rows["item_id"].nunique(), len(rows)
    stats = {"users": users, "items": items, "interactions": n,
             **{name: (len(frames[name]) if name in frames else None) for name in ("train", "valid", "test")},
             "sparsity_pct": 100.0 * (1 - n / (users * items)),
             "avg_words_per_review": rows["text"].map(lambda t: len(t.split())).mean(),
             "time_first": int(rows["timestamp"].min()), "time_last": int(rows["timestamp"].max())}
    if statements is not None:
        kept = statements[statements["review_id"].isin(set(rows["review_id"]))]
        total = len(kept)
        stats.update({"statements_total": total, "statements_unique": kept["statement"].nunique(),
                      "statements_per_interaction": total / n, "statements_per_user": total / users,
                      "statements_per_item": total / items})
    return stats


def assert_table2(got: dict, want: dict) -> None:
    """The same keys, integers equal, averages equal to the last bits that printing shows."""
    import pytest

    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key
