"""K-core and split tests; every expected number is worked out by hand in the comments."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from rexeval.pipelines.ingest.split import (COUNT_KEYS, ORDER_KEY, SplitResult, kcore, leave_last_two,
                             temporal_split)

ROW_KEYS = ("train", "valid", "test", "dropped_min_interactions",
            "dropped_cold_start_valid", "dropped_cold_start_test")


def make(rows):
    """rows: (user, item, timestamp[, source, line]); source/line default to a unique id."""
    cols = {"user_id": [], "item_id": [], "timestamp": [], "source": [], "line": []}
    for n, row in enumerate(rows):
        user, item, ts, *rest = row
        source, line = rest if rest else ("f.csv", n + 1)
        for key, value in zip(cols, (user, item, ts, source, line)):
            cols[key].append(value)
    return pa.table({
        "user_id": pa.array(cols["user_id"], pa.string()),
        "item_id": pa.array(cols["item_id"], pa.string()),
        "timestamp": pa.array(cols["timestamp"], pa.int64()),
        "source": pa.array(cols["source"], pa.string()),
        "line": pa.array(cols["line"], pa.int64()),
    })


def per_user(table, user):
    """(timestamp, source, line) of a user's rows, in table order."""
    d = table.to_pydict()
    return [(t, s, ln) for u, t, s, ln in zip(d["user_id"], d["timestamp"], d["source"],
                                              d["line"]) if u == user]


def sizes(result: SplitResult, user):
    return tuple(len(per_user(t, user)) for t in (result.train, result.valid, result.test))


def assert_conserved(result: SplitResult):
    assert set(result.counts) == set(COUNT_KEYS)
    assert result.counts["input"] == sum(result.counts[k] for k in ROW_KEYS)
    for name in ("train", "valid", "test"):
        assert result.counts[name] == getattr(result, name).num_rows


def assert_sorted(table):
    d = table.to_pydict()
    keys = list(zip(*(d[k] for k in ORDER_KEY)))
    assert keys == sorted(keys)


# -- k-core ----------------------------------------------------------------------------


def test_kcore_needs_several_rounds():
    # k_user = k_item = 2.
    #   A: 1, 2     B: 1, 2     C: 2, 3     D: 3
    # round 1: D has 1 row (< 2)                       -> drop D-3
    # round 2: item 3 now has 1 row (C-3)              -> drop C-3
    # round 3: user C now has 1 row (C-2)              -> drop C-2
    # round 4: A, B have 2 rows; items 1, 2 have 2     -> stable
    t = make([("A", "1", 1), ("A", "2", 2), ("B", "1", 3), ("B", "2", 4),
              ("C", "2", 5), ("C", "3", 6), ("D", "3", 7)])
    out, info = kcore(t, 2, 2)
    assert list(zip(out["user_id"].to_pylist(), out["item_id"].to_pylist())) == [
        ("A", "1"), ("A", "2"), ("B", "1"), ("B", "2")]
    assert info == {"rounds": 3, "dropped_rows": 3, "dropped_users": 2, "dropped_items": 1}
    assert out.schema == t.schema


def test_kcore_users_only_and_items_only():
    t = make([("A", "1", 1), ("A", "2", 2), ("B", "1", 3), ("B", "2", 4),
              ("C", "2", 5), ("C", "3", 6), ("D", "3", 7)])
    # k_user=2, k_item=1: only D (1 row) goes; C keeps 2 rows since items are not checked.
    out, info = kcore(t, 2, 1)
    assert out.num_rows == 6 and info["rounds"] == 1 and info["dropped_rows"] == 1
    # k_user=1, k_item=3: item 2 has A, B, C (3) and stays; item 1 (2 rows) and
    # item 3 (2 rows) go; left A-2, B-2, C-2 -> item 2 still 3 -> stable after 1 round.
    out, info = kcore(t, 1, 3)
    assert out["item_id"].to_pylist() == ["2", "2", "2"]
    assert info == {"rounds": 1, "dropped_rows": 4, "dropped_users": 1, "dropped_items": 2}


def test_kcore_can_empty_the_table():
    # a path A-1, B-1, B-2: with k=2 round 1 drops A (1 row) and item 2 (1 row),
    # round 2 drops B and item 1 -> nothing left.
    t = make([("A", "1", 1), ("B", "1", 2), ("B", "2", 3)])
    out, info = kcore(t, 2, 2)
    assert out.num_rows == 0 and info["rounds"] == 2 and info["dropped_rows"] == 3


@pytest.mark.parametrize("k", [0, 1])
def test_kcore_small_k_is_noop(k):
    t = make([("A", "1", 1), ("B", "2", 2)])
    out, info = kcore(t, k, k)
    assert out.equals(t) and info["rounds"] == 0 and info["dropped_rows"] == 0


def test_kcore_matches_a_slow_reference_on_random_data():
    rng = np.random.default_rng(0)
    rows = [(f"u{rng.integers(60)}", f"i{rng.integers(40)}", n) for n in range(400)]
    out, _ = kcore(make(rows), 3, 4)

    kept = list(range(len(rows)))  # straightforward loop: drop one sparse user/item at a time
    changed = True
    while changed:
        changed = False
        for col, k in ((0, 3), (1, 4)):
            deg = {}
            for r in kept:
                deg[rows[r][col]] = deg.get(rows[r][col], 0) + 1
            bad = {key for key, d in deg.items() if d < k}
            if bad:
                kept = [r for r in kept if rows[r][col] not in bad]
                changed = True
    assert out["timestamp"].to_pylist() == [rows[r][2] for r in kept]


def test_kcore_rejects_bad_k():
    t = make([("A", "1", 1)])
    with pytest.raises(ValueError, match="k_user"):
        kcore(t, -1, 2)
    with pytest.raises(ValueError, match="k_item"):
        kcore(t, 2, 2.5)


# -- temporal split ----------------------------------------------------------------------


def users_of_sizes(*ns):
    """User "n<k>" gets k rows with timestamps 1..k, given in reverse (newest first)."""
    rows = []
    for n in ns:
        rows += [(f"n{n:02d}", "shared", ts) for ts in range(n, 0, -1)]
    return make(rows)


def test_temporal_split_sizes_per_user():
    # floor(0.8 n) = n_train, floor(0.9 n) = n_end_valid:
    #   n=4 : dropped (< 5)
    #   n=5 : 4, 4   -> 4 / 0 / 1
    #   n=9 : 7, 8   -> 7 / 1 / 1   (7.2, 8.1)
    #   n=10: 8, 9   -> 8 / 1 / 1
    #   n=11: 8, 9   -> 8 / 1 / 2   (8.8, 9.9)
    #   n=20: 16, 18 -> 16 / 2 / 2
    # totals: input 59, train 43, valid 5, test 7, dropped 4 (1 user)
    res = temporal_split(users_of_sizes(4, 5, 9, 10, 11, 20), drop_cold_start_items=False)
    assert sizes(res, "n04") == (0, 0, 0)
    assert sizes(res, "n05") == (4, 0, 1)
    assert sizes(res, "n09") == (7, 1, 1)
    assert sizes(res, "n10") == (8, 1, 1)
    assert sizes(res, "n11") == (8, 1, 2)
    assert sizes(res, "n20") == (16, 2, 2)
    assert res.counts == {"input": 59, "train": 43, "valid": 5, "test": 7,
                          "dropped_min_interactions": 4, "dropped_cold_start_valid": 0,
                          "dropped_cold_start_test": 0, "users_kept": 5,
                          "users_dropped_min_interactions": 1}
    assert_conserved(res)
    # chronological: n11 trains on t=1..8, validates on 9, tests on 10, 11
    assert [r[0] for r in per_user(res.train, "n11")] == list(range(1, 9))
    assert [r[0] for r in per_user(res.valid, "n11")] == [9]
    assert [r[0] for r in per_user(res.test, "n11")] == [10, 11]
    for part in (res.train, res.valid, res.test):
        assert_sorted(part)
        assert part.schema == res.train.schema


def test_temporal_split_uses_exact_fractions():
    # n = 10, train 0.7, valid 0.2: exactly 7 / 2 / 1. The binary float 0.7 is
    # 0.69999..., so a float floor(10 * 0.7) risks 6.
    res = temporal_split(users_of_sizes(10), train=0.7, valid=0.2,
                         drop_cold_start_items=False)
    assert sizes(res, "n10") == (7, 2, 1)
    # 0.6 + 0.3 in floats is 0.8999999999999999; exactly it is 9/10 -> 6 / 3 / 1.
    res = temporal_split(users_of_sizes(10), train=0.6, valid=0.3,
                         drop_cold_start_items=False)
    assert sizes(res, "n10") == (6, 3, 1)
    # Fractions are taken as given: 1/3, 1/3 of n=6 -> 2 / 2 / 2
    res = temporal_split(users_of_sizes(6), train=Fraction(1, 3), valid=Fraction(1, 3),
                         drop_cold_start_items=False)
    assert sizes(res, "n06") == (2, 2, 2)


def test_temporal_split_breaks_timestamp_ties_by_row_id():
    # one user, 5 rows. Order key (timestamp, source, line):
    #   (50, z, 9) < (100, a, 3) < (100, a, 7) < (100, a, 10) < (100, b, 1)
    # line compares as a number (7 before 10). n=5 -> 4 train / 0 valid / 1 test,
    # so the test row is (100, b, 1) although it is listed first.
    t = make([("u", "i", 100, "b", 1), ("u", "i", 100, "a", 7), ("u", "i", 50, "z", 9),
              ("u", "i", 100, "a", 10), ("u", "i", 100, "a", 3)])
    res = temporal_split(t)
    assert per_user(res.train, "u") == [(50, "z", 9), (100, "a", 3), (100, "a", 7),
                                        (100, "a", 10)]
    assert per_user(res.test, "u") == [(100, "b", 1)]
    # and the result does not depend on input order
    again = temporal_split(t.take(pa.array([4, 3, 2, 1, 0])))
    assert again.train.equals(res.train) and again.test.equals(res.test)


def cold_start_table():
    # u1 (n=10 -> 8/1/1): train items i1..i8; valid i9; test i1
    # u2 (n=5  -> 4/0/1): train i1..i4;             test x
    # u3 (n=5  -> 4/0/1): train i5 i5 i6 i6;        test i9
    rows = [("u1", f"i{k}", k) for k in range(1, 9)] + [("u1", "i9", 9), ("u1", "i1", 10)]
    rows += [("u2", f"i{k}", k) for k in range(1, 5)] + [("u2", "x", 5)]
    rows += [("u3", it, k) for k, it in enumerate(["i5", "i5", "i6", "i6", "i9"], 1)]
    return make(rows)


def test_temporal_split_drops_cold_start_items():
    # train items: i1..i8. valid: u1-i9 cold (i9 is only in valid/test) -> dropped.
    # test: u1-i1 warm (kept), u2-x cold, u3-i9 cold -> 2 dropped.
    # 20 = 16 train + 0 valid + 1 test + 0 min + 1 cold valid + 2 cold test
    res = temporal_split(cold_start_table())
    assert res.counts == {"input": 20, "train": 16, "valid": 0, "test": 1,
                          "dropped_min_interactions": 0, "dropped_cold_start_valid": 1,
                          "dropped_cold_start_test": 2, "users_kept": 3,
                          "users_dropped_min_interactions": 0}
    assert res.test["item_id"].to_pylist() == ["i1"]
    assert_conserved(res)
    # without the filter: 16 / 1 / 3
    res = temporal_split(cold_start_table(), drop_cold_start_items=False)
    assert (res.counts["train"], res.counts["valid"], res.counts["test"]) == (16, 1, 3)
    assert res.counts["dropped_cold_start_valid"] == res.counts["dropped_cold_start_test"] == 0
    assert_conserved(res)


def test_temporal_split_keeps_extra_columns_and_handles_empty():
    t = users_of_sizes(5).append_column("text", pa.array(["a b"] * 5))
    res = temporal_split(t)
    assert res.train.column_names == t.column_names
    empty = temporal_split(t.slice(0, 0))
    assert empty.counts == dict.fromkeys(COUNT_KEYS, 0)
    assert empty.train.schema == t.schema


@pytest.mark.parametrize("kwargs, message", [
    (dict(train=0), "train"),
    (dict(train=1.0), "train"),
    (dict(train=-0.5), "train"),
    (dict(valid=0), "valid"),
    (dict(valid=float("nan")), "valid"),
    (dict(train=0.8, valid=0.2), "train \\+ valid"),
    (dict(train=0.9, valid=0.3), "train \\+ valid"),
    (dict(train="0.8"), "train"),
    (dict(min_interactions=0), "min_interactions"),
    (dict(min_interactions=2.0), "min_interactions"),
    (dict(min_interactions=True), "min_interactions"),
])
def test_temporal_split_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        temporal_split(users_of_sizes(5), **kwargs)


def test_split_rejects_missing_columns_and_nulls():
    t = users_of_sizes(5)
    with pytest.raises(ValueError, match="line"):
        temporal_split(t.drop_columns(["line"]))
    nulls = t.set_column(0, "user_id", pa.array([None, "a", "a", "a", "a"], pa.string()))
    with pytest.raises(ValueError, match="user_id"):
        leave_last_two(nulls)


# -- leave last two --------------------------------------------------------------------


def leave_table():
    # a: 3 rows                        -> 1 / 1 / 1
    # b: 2 rows                        -> dropped (< 3)
    # c: 5 rows, ties at t=3. Order:
    #    (1,s,1) (2,s,2) (3,r,9) (3,s,4) (3,s,5)
    #    -> train the first three, valid (3,s,4), test (3,s,5)
    return make([
        ("c", "i3", 3, "s", 5), ("a", "i1", 10, "f", 1), ("c", "i1", 1, "s", 1),
        ("b", "i1", 5, "f", 2), ("c", "i2", 3, "s", 4), ("a", "i2", 20, "f", 3),
        ("c", "i4", 3, "r", 9), ("b", "i2", 6, "f", 4), ("a", "i9", 30, "f", 5),
        ("c", "i1", 2, "s", 2),
    ])


def test_leave_last_two_orders_ties_by_row_id():
    res = leave_last_two(leave_table())
    assert per_user(res.train, "c") == [(1, "s", 1), (2, "s", 2), (3, "r", 9)]
    assert per_user(res.valid, "c") == [(3, "s", 4)]
    assert per_user(res.test, "c") == [(3, "s", 5)]
    assert sizes(res, "a") == (1, 1, 1) and sizes(res, "b") == (0, 0, 0)
    # 10 = 4 train + 2 valid + 2 test + 2 dropped (b); cold start is kept by default
    assert res.counts == {"input": 10, "train": 4, "valid": 2, "test": 2,
                          "dropped_min_interactions": 2, "dropped_cold_start_valid": 0,
                          "dropped_cold_start_test": 0, "users_kept": 2,
                          "users_dropped_min_interactions": 1}
    assert_conserved(res)
    for part in (res.train, res.valid, res.test):
        assert_sorted(part)


def test_leave_last_two_min_interactions_and_cold_start():
    # min 4 also drops a (3 rows): only c is left -> 3 / 1 / 1, 5 dropped
    res = leave_last_two(leave_table(), min_interactions=4)
    assert [res.counts[k] for k in ROW_KEYS] == [3, 1, 1, 5, 0, 0]
    # with the cold-start filter: train items {i1 (a, c), i4 (c)}.
    #   valid: a-i2 cold, c-i2 cold -> 2 dropped.  test: a-i9 cold, c-i3 cold -> 2 dropped.
    res = leave_last_two(leave_table(), drop_cold_start_items=True)
    assert [res.counts[k] for k in ROW_KEYS] == [4, 0, 0, 2, 2, 2]
    assert_conserved(res)


@pytest.mark.parametrize("bad", [2, 0, -1, 3.0])
def test_leave_last_two_rejects_small_min(bad):
    with pytest.raises(ValueError, match="min_interactions"):
        leave_last_two(leave_table(), min_interactions=bad)


def test_counts_conserved_on_random_data():
    rng = np.random.default_rng(1)
    n = 5000
    t = pa.table({
        "user_id": pa.array([f"u{v}" for v in rng.integers(0, 700, n)]),
        "item_id": pa.array([f"i{v}" for v in rng.integers(0, 300, n)]),
        "timestamp": pa.array(rng.integers(0, 50, n), pa.int64()),  # many ties
        "source": pa.array(rng.choice(["a", "b"], n)),
        "line": pa.array(np.arange(n)[::-1].copy(), pa.int64()),
    })
    for res in (temporal_split(t), temporal_split(t, 0.5, 0.25, 2),
                leave_last_two(t), leave_last_two(t, 5, drop_cold_start_items=True)):
        assert_conserved(res)
        for part in (res.train, res.valid, res.test):
            assert_sorted(part)
        # each kept user's rows partition chronologically: train <= valid <= test
        keys = {}
        for rank, part in enumerate((res.train, res.valid, res.test)):
            d = part.to_pydict()
            for u, *k in zip(*(d[c] for c in ORDER_KEY)):
                keys.setdefault(u, []).append((rank, tuple(k)))
        for rows in keys.values():
            assert [k for _, k in rows] == sorted(k for _, k in rows)


def test_sort_fallbacks_give_the_same_order():
    # Float timestamps, or (source, line) too wide to pack into one int64, take the
    # plain four-key lexsort path; the split must be the same.
    t = leave_table()
    base = leave_last_two(t)
    as_float = t.set_column(2, "timestamp", t["timestamp"].cast(pa.float64()))
    res = leave_last_two(as_float)
    assert res.test["line"].to_pylist() == base.test["line"].to_pylist()
    assert res.train["line"].to_pylist() == base.train["line"].to_pylist()
    # shift every line by 2**62 except one: span ~2**62, times 2 sources > int64
    lines = [ln + 2**62 for ln in t["line"].to_pylist()]
    lines[1] = 0  # user a's first row (t=10), still its first after the shift
    wide = t.set_column(4, "line", pa.array(lines, pa.int64()))
    res = leave_last_two(wide)
    assert [r[:2] for r in per_user(res.train, "c")] == [(1, "s"), (2, "s"), (3, "r")]
    assert [r[:2] for r in per_user(res.valid, "c")] == [(3, "s")]
    assert per_user(res.test, "c") == [(3, "s", 5 + 2**62)]
    assert res.counts == base.counts


# -- inputs with no review ---------------------------------------------------------------


def _ingest_folder(root, reviews: pa.Table, errors: int):
    """What `rexeval ingest` leaves: reviews/ and errors/ parts (here: `errors` error rows)."""
    import pyarrow.parquet as pq

    from rexeval.pipelines.core.schema import ERRORS

    (root / "reviews").mkdir(parents=True)
    (root / "errors").mkdir()
    pq.write_table(reviews, root / "reviews" / "part-00000.parquet")
    rows = [{"stage": "ingest", "source": "r.jsonl", "line": n + 1, "row_id": None, "field": "rating",
             "error_type": "invalid_field", "message": "rating out of range", "raw": "{}"} for n in range(errors)]
    pq.write_table(pa.Table.from_pylist(rows, schema=ERRORS), root / "errors" / "part-00000.parquet")
    return root


def test_split_refuses_a_folder_with_no_reviews_table(tmp_path):
    from rexeval.pipelines.ingest.config import SplitConfig
    from rexeval.pipelines.ingest.split_pipeline import run_split

    (tmp_path / "empty").mkdir()
    cfg = SplitConfig(input=str(tmp_path / "empty"), out=str(tmp_path / "split"))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'empty'} holds no reviews table.*rexeval ingest"):
        run_split(cfg, progress=lambda _: None)
    assert not (tmp_path / "split").exists()  # no empty "complete" split


def test_split_refuses_an_ingest_that_kept_no_review_and_points_at_its_errors(tmp_path):
    from rexeval.pipelines.core.schema import REVIEWS
    from rexeval.pipelines.ingest.config import SplitConfig
    from rexeval.pipelines.ingest.split_pipeline import run_split

    ing = _ingest_folder(tmp_path / "ing", REVIEWS.empty_table(), errors=3)
    cfg = SplitConfig(input=str(ing), out=str(tmp_path / "split"))
    with pytest.raises(ValueError, match=f"kept no reviews .*errors/ has 3.*see {ing / 'errors'}"):
        run_split(cfg, progress=lambda _: None)
    assert not (tmp_path / "split").exists()


def test_a_split_that_keeps_nothing_says_so(tmp_path):
    """Seven reviews by users with one or two each: nothing survives min_interactions 3.
    The split is written (it is what the settings give) but not silently: a warning line
    and the manifest's `warnings` say why it is empty (issue 45)."""
    from rexeval.pipelines.ingest.config import SplitConfig
    from rexeval.pipelines.ingest.split_pipeline import run_split
    from rexeval.pipelines.core.io import write_parquet_atomic
    from rexeval.pipelines.core.schema import REVIEWS
    import pyarrow as pa

    rows = [{"review_id": f"r{i}", "user_id": f"u{i % 4}", "item_id": "i", "rating": 5.0, "timestamp": 1400000000 + i,
             "text": "ok", "source": "x", "line": i + 1} for i in range(7)]
    write_parquet_atomic(tmp_path / "ing" / "reviews" / "part-00000.parquet",
                         pa.Table.from_pylist(rows).cast(pa.schema([REVIEWS.field(n) for n in rows[0]])))
    lines = []
    manifest = run_split(SplitConfig(input=str(tmp_path / "ing"), out=str(tmp_path / "s"), method="leave-last-two"),
                         progress=lines.append)
    assert manifest["counts"]["reviews_in"] == 7
    assert any(line.startswith("  warning: the split kept none of the 7 reviews") for line in lines), lines
    assert manifest["warnings"] and "min_interactions" in manifest["warnings"][0]


# -- the split part by part (what the split job runs on Ray workers) -------------------------


@pytest.mark.parametrize("method", ["temporal", "leave-last-two"])
def test_split_codes_on_groups_of_users_give_the_whole_table_split(method):
    """Users spread over three groups, each coded alone; then the cold-start items marked
    on all rows: every row lands where `temporal_split` / `leave_last_two` put it."""
    from rexeval.pipelines.ingest.split import (CODE, COLD_TEST, COLD_VALID, DROPPED_MIN, FIRST, TEST, TRAIN,
                                                VALID, drop_cold_items, split_codes)

    rng = np.random.default_rng(4)
    n = 600
    t = pa.table({"user_id": pa.array([f"u{v}" for v in rng.integers(0, 90, n)]),
                  "item_id": pa.array([f"i{v}" for v in rng.integers(0, 120, n)]),
                  "timestamp": pa.array(rng.integers(0, 9, n), pa.int64()),
                  "source": pa.array(rng.choice(["a", "b"], n)), "line": pa.array(np.arange(n), pa.int64())})
    if method == "temporal":
        least, whole = 5, temporal_split(t)
    else:
        least, whole = 3, leave_last_two(t, drop_cold_start_items=True)
    group = np.array([hash(u) % 3 for u in t.column("user_id").to_pylist()])
    coded = pa.concat_tables([split_codes(t.filter(pa.array(group == g)), method, least) for g in range(3)])
    coded = drop_cold_items(coded).sort_by([(k, "ascending") for k in ORDER_KEY])
    code = coded.column(CODE).to_numpy()
    for name, c in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        assert coded.filter(pa.array(code == c)).select(t.column_names).equals(getattr(whole, name))
    got = {"dropped_min_interactions": DROPPED_MIN, "dropped_cold_start_valid": COLD_VALID,
           "dropped_cold_start_test": COLD_TEST}
    assert {k: int((code == c).sum()) for k, c in got.items()} == {k: whole.counts[k] for k in got}
    first = coded.column(FIRST).to_numpy() == 1
    assert int((first & (code != DROPPED_MIN)).sum()) == whole.counts["users_kept"]
