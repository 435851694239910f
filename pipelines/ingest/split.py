"""K-core filtering and per-user train / validation / test splits of a reviews table.

Everything here is vectorised (Arrow and NumPy over whole columns, no Python loop over
users or rows) because it runs on tables of millions of reviews.

Row order key
-------------
Whenever "chronological order" is needed, reviews are ordered by

    (user_id, timestamp, source, line)

`(source, line)` is the row id: the file a review came from and its 1-based line in that
file. Two reviews of one user with the same timestamp are common (Amazon timestamps are
often whole days), so the row id breaks those ties; it makes the split a pure function
of the data, independent of how the table was sharded, read or concatenated. Strings
compare by code point (bytes of UTF-8) and `line` compares as a number, so line 10 comes
after line 9. Every table a split returns is sorted by this key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Rational, Real

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.schema import SPLIT_NAMES

ORDER_KEY = ("user_id", "timestamp", "source", "line")
"""Columns that order reviews; (source, line) is the row id that breaks timestamp ties."""

REQUIRED_COLUMNS = ("user_id", "item_id", "timestamp", "source", "line")

COUNT_KEYS = (
    "input",
    "train",
    "valid",
    "test",
    "dropped_min_interactions",
    "dropped_cold_start_valid",
    "dropped_cold_start_test",
    "users_kept",
    "users_dropped_min_interactions",
)
"""Keys of `SplitResult.counts`. The row counts (all but the users_* ones) satisfy
input = train + valid + test + dropped_min_interactions + dropped_cold_start_valid
+ dropped_cold_start_test."""


@dataclass
class SplitResult:
    """The three splits (input columns, sorted by ORDER_KEY) and what was kept or dropped."""

    train: pa.Table
    valid: pa.Table
    test: pa.Table
    counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, pa.Table]:
        """{"train": ..., "valid": ..., "test": ...}, the form `stats.dataset_stats` takes."""
        return dict(zip(SPLIT_NAMES, (self.train, self.valid, self.test)))


# -- column helpers --------------------------------------------------------------------


def _check_columns(table: pa.Table, names=REQUIRED_COLUMNS) -> None:
    if not isinstance(table, pa.Table):
        raise TypeError(f"expected a pyarrow.Table, got {type(table).__name__}")
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise ValueError(f"table lacks column(s) {', '.join(missing)} "
                         f"(has {', '.join(table.column_names)})")
    for name in names:
        nulls = table.column(name).null_count
        if nulls:
            raise ValueError(f"column '{name}' has {nulls} null value(s); the split needs "
                             "every row to have a user, item, timestamp and row id")


def _flat(col: pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def _dense_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Integer codes 0..k-1 for the distinct values, in first-seen order (hash, no sort)."""
    enc = _flat(col).dictionary_encode()
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return codes, len(enc.dictionary)


def _rank_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Codes 0..k-1 whose numeric order is the values' sort order.

    Only the k distinct values are sorted, so a string column becomes an integer sort key
    for the price of one hash pass; NumPy then sorts integers instead of strings.
    """
    enc = _flat(col).dictionary_encode()
    order = pc.sort_indices(enc.dictionary).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    codes = enc.indices.to_numpy(zero_copy_only=False)
    return rank[codes], len(order)


def _numeric_key(col: pa.ChunkedArray) -> np.ndarray:
    """A NumPy sort key for a numeric/temporal column, or rank codes for anything else."""
    arr = _flat(col)
    typ = arr.type
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return arr.to_numpy(zero_copy_only=False)
    if pa.types.is_temporal(typ):
        return arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return _rank_codes(arr)[0]


def _order_key_argsort(users: np.ndarray, n_users: int, table: pa.Table) -> np.ndarray:
    """Stable argsort by ORDER_KEY.

    The four keys are packed, when they fit in int64, into two: (user, timestamp) and
    (source, line); two stable integer sorts are then cheaper than a four-key lexsort.
    """
    ts = _numeric_key(table.column("timestamp"))
    source, n_sources = _rank_codes(table.column("source"))
    line = _numeric_key(table.column("line"))
    if len(users) and ts.dtype.kind in "iu" and line.dtype.kind in "iu":
        ts_min, ts_span = int(ts.min()), int(ts.max()) - int(ts.min()) + 1
        line_min, line_span = int(line.min()), int(line.max()) - int(line.min()) + 1
        limit = np.iinfo(np.int64).max
        if n_users * ts_span <= limit and n_sources * line_span <= limit:
            major = users * ts_span + (ts.astype(np.int64) - ts_min)
            minor = source * line_span + (line.astype(np.int64) - line_min)
            order = np.argsort(minor, kind="stable")
            return order[np.argsort(major[order], kind="stable")]
    return np.lexsort((line, source, ts, users))  # last key is the primary one


def _sorted_by_order_key(table: pa.Table) -> tuple[np.ndarray, np.ndarray, int]:
    """Row indices in ORDER_KEY order (ties keep input order), each sorted row's user
    rank, and the number of users."""
    users, n_users = _rank_codes(table.column("user_id"))
    order = _order_key_argsort(users, n_users, table)
    return order, users[order], n_users


def _group_positions(users_sorted: np.ndarray,
                     n_users: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows sorted by user rank: rows per user, and each row's user size and position."""
    sizes = np.bincount(users_sorted, minlength=n_users)
    starts = np.zeros(n_users, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    n = sizes[users_sorted]
    pos = np.arange(len(users_sorted), dtype=np.int64) - starts[users_sorted]
    return sizes, n, pos


# -- k-core ----------------------------------------------------------------------------


def kcore(table: pa.Table, k_user: int, k_item: int) -> tuple[pa.Table, dict[str, int]]:
    """Keep the largest sub-table where every user has >= k_user rows and every item >= k_item.

    Dropping a sparse item can push one of its users below k_user (and the other way
    round), so rows are removed in rounds until nothing changes; every round removes, at
    once, the rows of all users and items below their threshold in the current table. The
    fixed point does not depend on that order (it is the unique maximal k-core). Each row
    counts as one interaction, repeated (user, item) pairs included. k <= 1 filters nothing.

    Returns the kept rows in input order and info: rounds (rounds that removed rows),
    dropped_rows, dropped_users, dropped_items.
    """
    for name, k in (("k_user", k_user), ("k_item", k_item)):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {k!r}")
        if k < 0:
            raise ValueError(f"{name} must be >= 0, got {k}")
    _check_columns(table, ("user_id", "item_id"))
    users, n_users = _dense_codes(table.column("user_id"))
    items, n_items = _dense_codes(table.column("item_id"))
    info = dict(rounds=0, dropped_rows=0, dropped_users=0, dropped_items=0)
    if k_user <= 1 and k_item <= 1:
        return table, info

    alive = np.arange(table.num_rows, dtype=np.int64)  # indices of rows still kept
    u, i = users, items
    while len(alive):
        bad = np.zeros(len(alive), dtype=bool)
        if k_user > 1:
            bad |= np.bincount(u, minlength=n_users)[u] < k_user
        if k_item > 1:
            bad |= np.bincount(i, minlength=n_items)[i] < k_item
        if not bad.any():
            break
        keep = ~bad
        alive, u, i = alive[keep], u[keep], i[keep]
        info["rounds"] += 1

    info["dropped_rows"] = table.num_rows - len(alive)
    info["dropped_users"] = n_users - int(np.count_nonzero(np.bincount(u, minlength=n_users)))
    info["dropped_items"] = n_items - int(np.count_nonzero(np.bincount(i, minlength=n_items)))
    if info["dropped_rows"] == 0:
        return table, info
    keep = np.zeros(table.num_rows, dtype=bool)
    keep[alive] = True
    return table.filter(pa.array(keep)), info


# -- splits ----------------------------------------------------------------------------


def _ratio(name: str, value) -> Fraction:
    """The exact ratio the user wrote: 0.7 means 7/10, not the binary float 0.69999..."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, Rational):
        frac = Fraction(value)
    else:
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        frac = Fraction(repr(float(value)))  # shortest decimal that round-trips
    if not 0 < frac < 1:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return frac


def _check_min(name: str, value, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < lowest:
        raise ValueError(f"{name} must be >= {lowest}, got {value}")
    return int(value)


def _floor_times(n: np.ndarray, frac: Fraction) -> np.ndarray:
    """floor(n * frac) exactly, for each n, computing once per distinct n in Python ints."""
    if len(n) == 0:
        return n.copy()
    distinct, inverse = np.unique(n, return_inverse=True)
    floors = np.array([int(v) * frac.numerator // frac.denominator for v in distinct.tolist()],
                      dtype=np.int64)
    return floors[inverse.reshape(-1)]


def _finish(table: pa.Table, order: np.ndarray, segment: np.ndarray, n: np.ndarray,
            sizes: np.ndarray, min_interactions: int,
            drop_cold_start_items: bool) -> SplitResult:
    """Cut the rows by segment (0 train, 1 valid, 2 test), drop cold items, count.

    `segment` and `n` are per row in sorted order; each split takes its rows from the input
    table directly through `order`, so the wide columns are copied only once.
    """
    kept = n >= min_interactions
    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts["input"] = table.num_rows
    counts["dropped_min_interactions"] = int(np.count_nonzero(~kept))
    counts["users_kept"] = int(np.count_nonzero(sizes >= min_interactions))
    counts["users_dropped_min_interactions"] = len(sizes) - counts["users_kept"]

    in_train = kept & (segment == 0)
    masks = {"train": in_train, "valid": kept & (segment == 1), "test": kept & (segment == 2)}
    if drop_cold_start_items:
        # Removing valid/test rows never changes train, so one pass is enough.
        items, n_items = _dense_codes(table.column("item_id"))
        items = items[order]
        seen = np.zeros(n_items, dtype=bool)
        seen[items[in_train]] = True
        warm = seen[items]
        for name in ("valid", "test"):
            counts[f"dropped_cold_start_{name}"] = int(np.count_nonzero(masks[name] & ~warm))
            masks[name] = masks[name] & warm
    parts = {}
    for name, mask in masks.items():
        parts[name] = table.take(pa.array(order[mask]))
        counts[name] = parts[name].num_rows
    return SplitResult(parts["train"], parts["valid"], parts["test"], counts)


def _temporal_segments(table: pa.Table, tr: Fraction, va: Fraction) -> tuple[np.ndarray, ...]:
    """`temporal_split`'s cut: rows in ORDER_KEY order, each one's segment (0 train, 1 valid,
    2 test) and user size, the users' sizes, and each row's position in its user."""
    order, users_sorted, n_users = _sorted_by_order_key(table)
    sizes, n, pos = _group_positions(users_sorted, n_users)
    n_train = _floor_times(sizes, tr)[users_sorted]  # per user, then broadcast to rows
    n_end_valid = _floor_times(sizes, tr + va)[users_sorted]
    full = n_end_valid >= n
    n_train = np.where(full, n - 2, n_train)
    n_end_valid = np.where(full, n - 1, n_end_valid)
    segment = (pos >= n_train).astype(np.int8) + (pos >= n_end_valid)
    return order, segment, n, sizes, pos


def _leave_last_two_segments(table: pa.Table) -> tuple[np.ndarray, ...]:
    """`leave_last_two`'s cut, in `_temporal_segments`' form."""
    order, users_sorted, n_users = _sorted_by_order_key(table)
    sizes, n, pos = _group_positions(users_sorted, n_users)
    from_end = n - 1 - pos
    segment = np.where(from_end == 0, 2, np.where(from_end == 1, 1, 0)).astype(np.int8)
    return order, segment, n, sizes, pos


def temporal_split(table: pa.Table, train: float = 0.8, valid: float = 0.1,
                   min_interactions: int = 5,
                   drop_cold_start_items: bool = True) -> SplitResult:
    """Per-user chronological 80/10/10 split, as in the factual-consistency paper (seed 000).

    Users with fewer than `min_interactions` rows are dropped. For a user with n rows in
    ORDER_KEY order: n_train = floor(n*train), n_end_valid = floor(n*(train+valid)), computed
    with exact fractions (0.7 is 7/10, so floor(10*0.7) is 7, not 6). If n_end_valid
    reached n the user would get no test row, so then n_train = n-2 and n_end_valid = n-1
    (a guard: with train+valid < 1 it cannot happen). Rows [0, n_train) go to train,
    [n_train, n_end_valid) to valid, the rest to test. With `drop_cold_start_items`, valid
    and test rows whose item never occurs in train are removed (most recommenders cannot
    score unseen items).
    """
    tr = _ratio("train", train)
    va = _ratio("valid", valid)
    if tr + va >= 1:
        raise ValueError(f"train + valid must be < 1 so that test is not empty, "
                         f"got {train!r} + {valid!r}")
    min_interactions = _check_min("min_interactions", min_interactions, 1)
    _check_columns(table)

    order, segment, n, sizes, _ = _temporal_segments(table, tr, va)
    return _finish(table, order, segment, n, sizes, min_interactions, drop_cold_start_items)


def leave_last_two(table: pa.Table, min_interactions: int = 3,
                   drop_cold_start_items: bool = False) -> SplitResult:
    """Leave-one-out per user (seed 002): last row -> test, the one before -> valid.

    Rows are in ORDER_KEY order, so ties in time are settled by the row id. Users with
    fewer than `min_interactions` (>= 3, so that train is never empty) rows are dropped.
    Cold-start valid/test rows are kept unless `drop_cold_start_items`.
    """
    min_interactions = _check_min("min_interactions", min_interactions, 3)
    _check_columns(table)
    order, segment, n, sizes, _ = _leave_last_two_segments(table)
    return _finish(table, order, segment, n, sizes, min_interactions, drop_cold_start_items)


# -- the same split, part by part --------------------------------------------------------
# A row's fate depends only on its user's rows (and, for cold-start items, on whether its
# item has a train row anywhere), so the split can run on parts of a table that each hold
# all rows of their users (then of their items): the split job does so on Ray workers.

CODE = "_split_code"
"""Where `split_codes` sends a row (TRAIN, VALID, TEST), or why it drops it."""
FIRST = "_user_first"
"""1 on each user's first row in ORDER_KEY order (to count users), else 0."""
TRAIN, VALID, TEST, DROPPED_MIN, COLD_VALID, COLD_TEST = range(6)
CODE_COUNTS = ("train", "valid", "test", "dropped_min_interactions", "dropped_cold_start_valid",
               "dropped_cold_start_test")
"""The COUNT_KEYS that count the rows of each code, in code order."""


def split_codes(table: pa.Table, method: str, min_interactions: int, train: float = 0.8,
                valid: float = 0.1) -> pa.Table:
    """`table`'s rows in ORDER_KEY order (ties in table order) with CODE and FIRST: TRAIN,
    VALID or TEST as `temporal_split` ("temporal") or `leave_last_two` would cut them, or
    DROPPED_MIN. `table` must hold every row of its users; cold-start items are
    `drop_cold_items`' part."""
    if method == "temporal":
        min_interactions = _check_min("min_interactions", min_interactions, 1)
        order, segment, n, _, pos = _temporal_segments(table, _ratio("train", train), _ratio("valid", valid))
    else:
        min_interactions = _check_min("min_interactions", min_interactions, 3)
        order, segment, n, _, pos = _leave_last_two_segments(table)
    code = np.where(n >= min_interactions, segment, DROPPED_MIN).astype(np.int8)
    out = table.take(pa.array(order))
    return out.append_column(CODE, pa.array(code)).append_column(FIRST, pa.array((pos == 0).astype(np.int8)))


def drop_cold_items(table: pa.Table) -> pa.Table:
    """`table` (coded by `split_codes`) with its VALID and TEST rows whose item has no TRAIN
    row recoded COLD_VALID and COLD_TEST. `table` must hold every row of its items."""
    items, n_items = _dense_codes(table.column("item_id"))
    code = table.column(CODE).to_numpy()
    seen = np.zeros(n_items, dtype=bool)
    seen[items[code == TRAIN]] = True
    cold = ~seen[items]
    code = np.where(cold & (code == VALID), COLD_VALID, np.where(cold & (code == TEST), COLD_TEST, code))
    return table.set_column(table.schema.get_field_index(CODE), CODE, pa.array(code.astype(np.int8)))


def key_counts(table: pa.Table, key: str) -> np.ndarray:
    """Per row, how many rows of `table` share its `key` (a k-core round's count, when
    `table` holds every row of its keys)."""
    codes, n = _dense_codes(table.column(key))
    return np.bincount(codes, minlength=n)[codes]
