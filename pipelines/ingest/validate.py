"""Validation of one parse task's raw columns into REVIEWS rows and error rows
(`normalise`): vectorised checks of every field, so no value reaches a conversion that
could fail on it."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.ids import review_ids
from rexeval.pipelines.core.schema import REVIEWS, error_rows
from rexeval.pipelines.ingest.formats import REQUIRED_FIELDS
from rexeval.pipelines.ingest.parsed import STAGE, ParsedChunk, clip

_NUMBER = r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$"
# Timestamps above this are milliseconds (the 2023 dump); seconds stay below it until 5138.
_MS_THRESHOLD = 100_000_000_000
# The latest plausible review time, 2100-01-01 UTC. A fixed bound rather than "a few years
# after now", so that re-running a job years later makes the same decisions.
_LATEST = 4_102_444_800
_LATEST_TEXT = "2100-01-01"


# -- validation ----------------------------------------------------------------------


def normalise(parsed: ParsedChunk, min_rating: float = 1.0, max_rating: float = 5.0,
              category: str | None = None) -> tuple[pa.Table, pa.Table]:
    """Validate raw string columns; return (reviews, errors) for one chunk.

    Checks run as vectorised kernels over the whole chunk; a row fails on its first
    problem, in the order: missing required field, empty text, bad rating (not a finite
    number, or out of range), bad timestamp (not a time, negative, after 2100), bad
    helpful votes. No value reaches a conversion that could fail on it.
    """
    cols = parsed.columns
    n = len(parsed.lines)
    problem = np.full(n, None, dtype=object)
    field_of = np.full(n, None, dtype=object)

    def flag(mask, fld: str, message: str):
        mask = np.asarray(mask, dtype=bool) & (problem == None)  # noqa: E711
        problem[mask] = message
        field_of[mask] = fld

    for f in REQUIRED_FIELDS:
        col = cols.get(f)
        if col is None:
            flag(np.ones(n, bool), f, f"missing field '{f}'")
            continue
        stripped = pc.utf8_trim_whitespace(col)
        empty_ = pc.fill_null(pc.equal(pc.utf8_length(stripped), 0), True)
        flag(empty_.to_numpy(zero_copy_only=False),
             f, "empty text" if f == "text" else f"missing field '{f}'")

    rating, why = _ratings(cols["rating"], min_rating, max_rating)
    for message in _messages(why):
        flag(why == message, "rating", message)

    ts, why = _epoch_seconds(cols["timestamp"], problem == None)  # noqa: E711
    for message in _messages(why):
        flag(why == message, "timestamp", message)

    helpful = cols.get("helpful_votes")
    if helpful is not None:
        helpful, bad = _counts(helpful)
        flag(bad, "helpful_votes", "helpful_votes is not a count (a whole number below 10^9, "
                                   "or the 2014 [votes, total] pair)")

    good = problem == None  # noqa: E711
    err_idx = np.flatnonzero(~good)
    errors = [{"source": parsed.source, "line": int(parsed.lines[i]), "field": field_of[i],
               "error_type": "invalid_field", "message": problem[i],
               "raw": clip(parsed.raw[int(i)]) if parsed.raw is not None else None} for i in err_idx]
    errors = parsed.errors + errors

    keep = pa.array(good)
    g = {f: pc.filter(c, keep) for f, c in cols.items() if c is not None}
    m = int(good.sum())
    users, items = g["user_id"], g["item_id"]
    ts_g = ts[good]
    cat = g.get("category")
    if category is not None:
        cat = pa.array([category] * m, pa.string()) if cat is None else pc.fill_null(cat, category)
    reviews = pa.table({
        "review_id": pa.array(review_ids(users.to_pylist(), items.to_pylist(), ts_g.tolist()), pa.string()),
        "user_id": users,
        "item_id": items,
        "rating": pc.cast(pc.filter(rating, keep), pa.float32()),
        "timestamp": pa.array(ts_g, pa.int64()),
        "text": g["text"],
        "summary": g.get("summary", pa.nulls(m, pa.string())),
        "user_name": g.get("user_name", pa.nulls(m, pa.string())),
        "item_title": pa.nulls(m, pa.string()),
        "category": cat if cat is not None else pa.nulls(m, pa.string()),
        "helpful_votes": pc.filter(helpful, keep) if helpful is not None else pa.nulls(m, pa.int32()),
        "source": pa.array([parsed.source] * m, pa.string()),
        "line": pa.array(parsed.lines[good], pa.int64()),
    })
    return reviews.cast(REVIEWS), error_rows(STAGE, errors)


def _messages(why: np.ndarray) -> list[str]:
    """The distinct problems flagged in `why` (None: no problem), in a stable order."""
    return sorted({w for w in why if w is not None})


def _numbers(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(is a number, its value) per row of a string column; only strings that match
    `_NUMBER` are converted, so no value can make the cast fail (huge ones are inf)."""
    numeric = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
    values = pc.cast(pc.if_else(numeric, pc.utf8_trim_whitespace(col), "0"), pa.float64())
    return numeric.to_numpy(zero_copy_only=False), np.array(values.to_numpy(zero_copy_only=False))


def _ratings(col: pa.Array, lo: float, hi: float) -> tuple[pa.Array, np.ndarray]:
    """Ratings as float64 and per row its problem (None when fine): not a number, not
    finite, or outside [lo, hi]."""
    numeric, r = _numbers(col)
    why = np.full(len(r), None, dtype=object)
    why[numeric & (np.isnan(r) | np.isinf(r))] = "rating is not a finite number"
    why[numeric & np.isfinite(r) & ((r < lo) | (r > hi))] = f"rating out of range [{lo:g}, {hi:g}]"
    why[~numeric] = "rating is not a number"
    return pa.array(np.where(numeric & np.isfinite(r), r, 0.0), pa.float64()), why


def _epoch_seconds(col: pa.Array, todo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whole seconds since 1970 per row, and per row its problem (None when fine).

    Numbers are seconds, or milliseconds from 10^11 on (the 2023 dump); other text is
    parsed as a date (only where `todo`: the rare path, row by row). A time must be
    finite, not before 1970 and not after 2100: 9.3e18 or -5 is a broken value, not a
    review time, and converting it to int64 would overflow."""
    numeric, x = _numbers(col)
    n = len(x)
    why = np.full(n, None, dtype=object)
    dates = ~numeric & todo
    if dates.any():
        idx = np.flatnonzero(dates)
        x[idx] = _date_seconds(pc.take(col, pa.array(idx)).to_pylist())
        why[idx[np.isnan(x[idx])]] = "timestamp is neither seconds/milliseconds since 1970 nor a date"
    known = numeric | (dates & ~np.isnan(x))
    why[numeric & ~np.isfinite(x)] = "timestamp is not a finite number"
    x = np.where(known & np.isfinite(x), x, 0.0)
    secs = np.where(numeric & (x >= _MS_THRESHOLD), x / 1000.0, x)
    why[known & (x < 0)] = "timestamp is before 1970 (negative)"
    why[known & (secs >= _LATEST)] = (f"timestamp is after {_LATEST_TEXT} (expected seconds or "
                                      "milliseconds since 1970)")
    ok = known & (x >= 0) & (secs < _LATEST)
    whole = np.where(ok, x, 0.0).astype(np.int64)  # exact: below 2^53 here
    ts = np.where(numeric & (whole >= _MS_THRESHOLD), whole // 1000, whole)
    return ts, why


def _date_seconds(texts: list) -> np.ndarray:
    """Seconds since 1970 (floored) of date strings; NaN where one is not a date."""
    import pandas as pd

    texts = [t if t is not None and len(t) <= 64 else None for t in texts]  # no date is longer
    try:
        return _seconds(pd.to_datetime(pd.Series(texts, dtype=object), errors="coerce", utc=True,
                                       format="mixed"))
    except (ValueError, TypeError, OverflowError):  # pandas refuses the batch: one by one
        return np.concatenate([_date_seconds_one(t) for t in texts]) if texts else np.zeros(0)


def _date_seconds_one(text) -> np.ndarray:
    import pandas as pd

    try:
        return _seconds(pd.to_datetime(pd.Series([text], dtype=object), errors="coerce", utc=True))
    except (ValueError, TypeError, OverflowError):
        return np.array([np.nan])


def _seconds(dt) -> np.ndarray:
    """Whole seconds of a datetime Series in its own resolution (pandas picks one coarse
    enough for year 1 or 9999: no arithmetic in nanoseconds, which would overflow)."""
    out = np.full(len(dt), np.nan)
    ok = dt.notna().to_numpy()
    if ok.any():
        per = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[dt.dt.unit]
        out[ok] = dt[ok].astype("int64").to_numpy() // per
    return out


def _counts(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Helpful votes as int32 (null where absent or blank) and per row whether a value
    is given but is no count: "12", "1,234" (2018 "vote") or "[12, 15]" (2014 "helpful":
    votes, total)."""
    first = pc.struct_field(pc.extract_regex(col, r"^\s*\[?\s*(?P<n>\d[\d,]{0,11})"), [0])
    digits = pc.replace_substring(first, ",", "")
    ok = pc.fill_null(pc.match_substring_regex(digits, r"^\d{1,9}$"), False)
    blank = pc.fill_null(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0), True)
    bad = ~(ok.to_numpy(zero_copy_only=False) | blank.to_numpy(zero_copy_only=False))
    return pc.cast(pc.if_else(ok, digits, pa.scalar(None, pa.string())), pa.int32()), bad
