"""The split job on Ray Data (issue 47): its driver never holds a whole table, and its
splits are the ones the whole-table split gives.

The job runs on the session's local Ray with every whole-table reader of this process
(the driver) raising (`tests/doubles/whole_tables.py`); the expected splits are computed
here with pandas from the input rows, by the rules `pipelines/ingest/split.py` states:
k-core rounds, rows ordered by (user, time, source, line) with input order settling the
rest, per-user cuts, users under min_interactions dropped, cold-start items dropped.
Groups of 16 rows (ROWS_PER_GROUP) spread the users over several workers' calls and the
output over several shards.
"""
from __future__ import annotations

import pandas as pd
import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.schema import REVIEWS
from rexeval.pipelines.ingest.config import SplitConfig
from rexeval.pipelines.ingest.split_pipeline import run_split
from tests.doubles.whole_tables import forbid_whole_tables, write_reviews

pytestmark = pytest.mark.slow


def kcore_rounds(df: pd.DataFrame, k_user: int, k_item: int) -> tuple[pd.DataFrame, int]:
    rounds = 0
    while len(df):
        bad = pd.Series(False, index=df.index)
        if k_user > 1:
            bad |= df.groupby("user_id")["user_id"].transform("size") < k_user
        if k_item > 1:
            bad |= df.groupby("item_id")["item_id"].transform("size") < k_item
        if not bad.any():
            break
        df, rounds = df[~bad], rounds + 1
    return df, rounds


def expected_split(df: pd.DataFrame, method: str, least: int, cold: bool,
                   k_user: int = 0, k_item: int = 0) -> tuple[dict[str, pd.DataFrame], dict]:
    """train/valid/test and the counts, from the rows in input order (80/10/10 temporal)."""
    df = df.assign(pos_in=range(len(df)))
    df, rounds = kcore_rounds(df, k_user, k_item)
    df = df.sort_values(["user_id", "timestamp", "source", "line", "pos_in"], kind="stable")
    n = df.groupby("user_id")["user_id"].transform("size")
    pos = df.groupby("user_id").cumcount()
    if method == "temporal":
        n_train, n_end = n * 8 // 10, n * 9 // 10
        full = n_end >= n
        n_train, n_end = n_train.where(~full, n - 2), n_end.where(~full, n - 1)
        segment = (pos >= n_train).astype(int) + (pos >= n_end).astype(int)
    else:
        segment = (n - 1 - pos).map(lambda back: 2 if back == 0 else 1 if back == 1 else 0)
    kept = n >= least
    parts = {name: df[kept & (segment == code)] for code, name in enumerate(("train", "valid", "test"))}
    dropped = {"valid": 0, "test": 0}
    if cold:
        for name in ("valid", "test"):
            warm = parts[name]["item_id"].isin(set(parts["train"]["item_id"]))
            dropped[name] = int((~warm).sum())
            parts[name] = parts[name][warm]
    counts = {"train": len(parts["train"]), "valid": len(parts["valid"]), "test": len(parts["test"]),
              "dropped_min_interactions": int((~kept).sum()), "dropped_cold_start_valid": dropped["valid"],
              "dropped_cold_start_test": dropped["test"], "users_kept": int(df[kept]["user_id"].nunique()),
              "users_dropped_min_interactions": int(df[~kept]["user_id"].nunique()), "rounds": rounds}
    return {k: v.drop(columns="pos_in").reset_index(drop=True) for k, v in parts.items()}, counts


@pytest.fixture(scope="module")
def reviews(tmp_path_factory) -> tuple[str, pd.DataFrame]:
    root = str(tmp_path_factory.mktemp("split-on-ray") / "reviews")
    return root, write_reviews(root)


CASES = {
    "temporal": dict(method="temporal"),
    "leave-last-two-kcore": dict(method="leave-last-two", kcore_user=3, kcore_item=3),
    "temporal-kcore-users": dict(method="temporal", kcore_user=4, min_interactions=3, drop_cold_start_items=False),
}


@pytest.mark.parametrize("case", CASES)
def test_the_split_runs_on_workers_and_gives_the_whole_table_split(case, reviews, tmp_path, ray_session,
                                                                   monkeypatch):
    source, rows = reviews
    settings = CASES[case]
    temporal = settings["method"] == "temporal"
    want, counts = expected_split(rows, settings["method"], settings.get("min_interactions", 5 if temporal else 3),
                                  settings.get("drop_cold_start_items", temporal),
                                  settings.get("kcore_user", 0), settings.get("kcore_item", 0))
    # The data reach what the case is about: users and cold items dropped, k-core rounds.
    assert all(len(t) for t in want.values())
    if case == "temporal":
        assert counts["dropped_min_interactions"]
        assert counts["dropped_cold_start_valid"] + counts["dropped_cold_start_test"]
    if "kcore_user" in settings:
        assert counts["rounds"] >= (2 if "kcore_item" in settings else 1)

    monkeypatch.setattr("rexeval.pipelines.core.runtime.ROWS_PER_GROUP", 16)
    lines: list[str] = []
    with monkeypatch.context() as driver:
        forbid_whole_tables(driver)
        manifest = run_split(SplitConfig(input=source, out=str(tmp_path / "split"), **settings), progress=lines.append)

    assert manifest["shards"] > 1  # several workers' shards, read back in part order below
    for name in ("train", "valid", "test"):
        got = read_table(tmp_path / "split" / name, "reviews").to_pandas()
        pd.testing.assert_frame_equal(got, want[name][list(REVIEWS.names)])
    rounds = counts.pop("rounds")
    kcore = {"dropped_kcore": len(rows) - sum(counts[k] for k in counts if not k.startswith("users"))} \
        if "kcore_user" in settings else {}
    assert manifest["counts"] == {"reviews_in": len(rows), **kcore, **counts}
    if kcore:
        assert f"{rounds} round(s), {kcore['dropped_kcore']:,} rows dropped" in "\n".join(lines)
    again = run_split(SplitConfig(input=source, out=str(tmp_path / "split"), **settings), progress=lines.append)
    assert again["counts"] == manifest["counts"] and lines[-1].endswith("is already complete for these settings")


def test_a_second_split_writes_the_same_files(reviews, tmp_path, ray_session, monkeypatch):
    """Ray's sort cuts its blocks at keys it samples at random; the shards are cut by row
    count, so every run (on one node or many) writes the same parts."""
    import pyarrow.parquet as pq

    monkeypatch.setattr("rexeval.pipelines.core.runtime.ROWS_PER_GROUP", 16)
    source, _ = reviews
    files = []
    for out in ("one", "two"):
        run_split(SplitConfig(input=source, out=str(tmp_path / out)), progress=lambda _: None)
        files.append({str(f.relative_to(tmp_path / out)): pq.read_table(f)
                      for f in sorted((tmp_path / out).rglob("part-*.parquet"))})
    assert len(files[0]) > 3 and list(files[0]) == list(files[1])
    assert all(files[0][name].equals(files[1][name]) for name in files[0])
