"""Seed 004's dataset curation rules (ALERT, section 3.1), as functions on Arrow tables.

The paper keeps, from the Amazon Reviews 2023 purchases of 15 categories:

1. purchases rated 5 stars only ("exclusively considered 5-star rated purchases");
2. items whose title holds at least six alphabetic characters;
3. users with 5 to 20 such purchases;
4. at most 200 "purchase behaviours" per category, sampled at random; the purchase
   explained for a user is their most recent one ("Recommended Items").

What the paper leaves open, and what we do (our choices, said in the docs):

- Order of the rules: the row rules (1, 2) first, then the users are counted on the
  purchases that pass them, so a user's 5 to 20 are 5-star purchases of titled items:
  the history the generators are shown.
- "Alphabetic": a Unicode letter (`\\pL`, what Python's `str.isalpha` counts for
  almost every character); digits, spaces and punctuation do not count. A missing title
  is its own reason (`title_missing`).
- A user's purchases are counted over every given category file (an Amazon 2023 user
  id is one person across categories), and the user belongs to the category of their
  most recent purchase, the one explained. "Most recent" is the largest (timestamp,
  review_id), the order `core.context.last_interactions` uses, so the generators
  explain the same purchase the curation sampled on.
- "200 per category" counts users (one explained purchase each). The sample is seeded
  and independent of how the rows are split into blocks: each user gets a key, the
  first 8 bytes of BLAKE2b of "<seed>\\x1f<user_id>", and a category keeps the users with
  the `per_category` smallest (key, user_id).
- A row without a category (Amazon 2023 review files carry none) takes the name of its
  source file, which in that dump is the category: ".../All_Beauty.jsonl.gz" ->
  "All_Beauty".

Every row ends with one code (`REASONS[code]`): kept, or the first rule that dropped it.
Every user ends with one status (`USER_STATUS`). Nothing here loops over rows in
Python; the per-user step loops over distinct users only to hash their ids.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REASONS = ("kept", "not_5_stars", "title_missing", "title_short", "user_too_few", "user_too_many", "not_sampled")
KEPT, NOT_RATED, NO_TITLE, SHORT_TITLE, TOO_FEW, TOO_MANY, NOT_SAMPLED = range(len(REASONS))
USER_STATUS = ("no_purchase_left", "too_few", "too_many", "sampled", "not_sampled")
U_NONE, U_FEW, U_MANY, U_SAMPLED, U_NOT_SAMPLED = range(len(USER_STATUS))

CODE, CAT = "_code", "_cat"  # the row's code; its category (or its source file's name)
UCAT, UKEY, USTAT = "_ucat", "_ukey", "_ustat"  # the user's category, sample key, status
UFIRST, TARGET = "_ufirst", "_target"  # one row per user; the user's most recent kept row
WORK_COLUMNS = (CODE, CAT, UCAT, UKEY, USTAT, UFIRST, TARGET)
_EXTENSIONS = (".gz", ".bz2", ".zst", ".xz", ".jsonl", ".json", ".csv", ".parquet")


def source_category(source: str) -> str:
    """The category an Amazon 2023 file name stands for: its name without folders and
    extensions ("data/All_Beauty.jsonl.gz" -> "All_Beauty")."""
    name = str(source).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    changed = True
    while changed:
        changed = False
        for ext in _EXTENSIONS:
            if name.lower().endswith(ext) and len(name) > len(ext):
                name, changed = name[: -len(ext)], True
    return name


def title_letters(titles: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Unicode letters in each title (null for a missing title)."""
    return pc.count_substring_regex(titles, r"\pL")


def row_codes(batch: pa.Table, rating: float = 5.0, min_title_letters: int = 6) -> pa.Table:
    """`batch` with CODE (the row rules: not rated `rating`, title missing, title short)
    and CAT (the row's category, else its source file's name)."""
    n = batch.num_rows
    code = np.full(n, KEPT, np.int8)
    letters = title_letters(batch.column("item_title")).to_numpy(zero_copy_only=False)
    missing = np.asarray(pc.is_null(batch.column("item_title")).to_numpy(zero_copy_only=False), bool)
    rated = np.asarray(pc.equal(batch.column("rating"), pa.scalar(rating, pa.float32())).to_numpy(
        zero_copy_only=False), bool)
    short = ~missing & (np.nan_to_num(letters.astype(np.float64), nan=0.0) < min_title_letters)
    # Later assignments first, so each row keeps the first rule that drops it.
    code[short] = SHORT_TITLE
    code[missing] = NO_TITLE
    code[~rated] = NOT_RATED
    sources = batch.column("source").combine_chunks().dictionary_encode()
    names = pa.array([source_category(s) for s in sources.dictionary.to_pylist()], pa.string())
    cat = pc.coalesce(batch.column("category").combine_chunks(), names.take(sources.indices))
    return batch.append_column(CODE, pa.array(code, pa.int8())).append_column(CAT, cat)


def sample_keys(users: list[str], seed: int) -> np.ndarray:
    """Each user's sample key (uint64): the first 8 bytes of BLAKE2b("<seed>\\x1f<user>")."""
    return np.array([int.from_bytes(hashlib.blake2b(f"{seed}\x1f{u}".encode(), digest_size=8).digest(), "big")
                     for u in users], dtype=np.uint64)


def user_codes(group: pa.Table, min_purchases: int = 5, max_purchases: int = 20, seed: int = 0) -> pa.Table:
    """Rows with CODE and CAT, holding every row of their users: each user's kept rows
    counted (too few or too many -> their kept rows get that code), and for the users
    that qualify their category (of their most recent kept row, TARGET), their sample
    key and status `U_SAMPLED` (until `apply_sample` says otherwise). UFIRST marks one
    row per user, for counting users."""
    n = group.num_rows
    if not n:
        return _with_user_columns(group, np.zeros(0, np.int8), [], np.zeros(0, np.uint64), np.zeros(0, np.int8),
                                  np.zeros(0, np.int8), np.zeros(0, np.int8))
    users = group.column("user_id").combine_chunks().dictionary_encode()
    uid = users.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n_users = len(users.dictionary)
    code = group.column(CODE).to_numpy(zero_copy_only=False).astype(np.int8).copy()
    kept = code == KEPT
    count = np.bincount(uid[kept], minlength=n_users)
    status = np.where(count == 0, U_NONE, np.where(count < min_purchases, U_FEW,
                                                   np.where(count > max_purchases, U_MANY, U_SAMPLED))).astype(np.int8)
    code[kept & (status[uid] == U_FEW)] = TOO_FEW
    code[kept & (status[uid] == U_MANY)] = TOO_MANY
    # The most recent kept row of each qualifying user: largest (timestamp, review_id).
    target = np.zeros(n, np.int8)
    rows = np.flatnonzero(code == KEPT)
    if len(rows):
        picked = pa.table({"u": uid[rows], "t": group.column("timestamp").take(pa.array(rows)),
                           "r": group.column("review_id").take(pa.array(rows)), "row": rows})
        ordered = picked.sort_by([("u", "ascending"), ("t", "ascending"), ("r", "ascending")])
        u, at = ordered.column("u").to_numpy(), ordered.column("row").to_numpy()
        target[at[np.r_[u[1:] != u[:-1], True]]] = 1
    tops = np.flatnonzero(target)
    user_cat = np.full(n_users, None, dtype=object)
    user_cat[uid[tops]] = group.column(CAT).take(pa.array(tops)).to_pylist()
    ucat = user_cat[uid].tolist()
    keys = sample_keys(users.dictionary.to_pylist(), seed)[uid]
    first = np.zeros(n, np.int8)
    first[np.unique(uid, return_index=True)[1]] = 1
    return _with_user_columns(group, code, ucat, keys, status[uid], first, target)


def _with_user_columns(group, code, ucat, keys, status, first, target) -> pa.Table:
    out = group.set_column(group.column_names.index(CODE), CODE, pa.array(code, pa.int8()))
    for name, values in ((UCAT, pa.array(ucat, pa.string())), (UKEY, pa.array(keys, pa.uint64())),
                         (USTAT, pa.array(status, pa.int8())), (UFIRST, pa.array(first, pa.int8())),
                         (TARGET, pa.array(target, pa.int8()))):
        out = out.append_column(name, values)
    return out


def smallest_per_category(block: pa.Table, cap: int) -> pa.Table:
    """The `cap` smallest (key, user_id) of each category among the qualifying users in
    `block` (one row per user: their TARGET row): a block's share of the sample."""
    t = block.filter(pc.equal(block.column(TARGET), 1)).select([UCAT, UKEY, "user_id"])
    t = t.sort_by([(UCAT, "ascending"), (UKEY, "ascending"), ("user_id", "ascending")])
    cats = t.column(UCAT).to_numpy(zero_copy_only=False)
    if not len(cats):
        return t
    start = np.r_[0, np.flatnonzero(cats[1:] != cats[:-1]) + 1]
    rank = np.arange(len(cats)) - np.repeat(start, np.diff(np.r_[start, len(cats)]))
    return t.filter(pa.array(rank < cap))


def thresholds(partials: pa.Table, cap: int) -> dict[str, tuple[int, str]]:
    """Per category with more than `cap` qualifying users, the largest (key, user_id)
    sampled: the merged `smallest_per_category` of every block, cut at `cap`."""
    out = {}
    merged = smallest_per_category(partials.append_column(TARGET, pa.array(np.ones(partials.num_rows, np.int8))),
                                   cap + 1)
    for cat, key, user in zip(*(merged.column(c).to_pylist() for c in (UCAT, UKEY, "user_id"))):
        out.setdefault(cat, []).append((key, user))
    return {cat: pairs[cap - 1] for cat, pairs in out.items() if len(pairs) > cap}


def apply_sample(batch: pa.Table, cut: dict[str, tuple[int, str]]) -> pa.Table:
    """Rows of qualifying users above their category's cut become NOT_SAMPLED (their
    user's status U_NOT_SAMPLED); CAT fills the `category` column."""
    code = batch.column(CODE).to_numpy(zero_copy_only=False).astype(np.int8).copy()
    status = batch.column(USTAT).to_numpy(zero_copy_only=False).astype(np.int8).copy()
    if cut and batch.num_rows:
        keys = batch.column(UKEY).to_numpy(zero_copy_only=False)
        ucat, users = batch.column(UCAT), batch.column("user_id")
        out = np.zeros(batch.num_rows, bool)
        for cat, (key, user) in cut.items():
            mine = (status == U_SAMPLED) & np.asarray(pc.fill_null(pc.equal(ucat, cat), False), bool)
            above = (keys > np.uint64(key)) | ((keys == np.uint64(key)) & np.asarray(
                pc.fill_null(pc.greater(users, user), False), bool))
            out |= mine & above
        code[out & (code == KEPT)] = NOT_SAMPLED
        status[out] = U_NOT_SAMPLED
    batch = batch.set_column(batch.column_names.index(CODE), CODE, pa.array(code, pa.int8()))
    batch = batch.set_column(batch.column_names.index(USTAT), USTAT, pa.array(status, pa.int8()))
    return batch.set_column(batch.column_names.index("category"), "category", batch.column(CAT))


def block_counts(block: pa.Table) -> pa.Table:
    """One block's counts, as rows (kind, name, category, n): rows per reason, users per
    status, and per category (of the user) the sampled users and their kept rows."""
    kinds, names, cats, ns = [], [], [], []
    code = block.column(CODE).to_numpy(zero_copy_only=False)
    for c, n in enumerate(np.bincount(code, minlength=len(REASONS))):
        kinds.append("rows"), names.append(REASONS[c]), cats.append(None), ns.append(int(n))
    status = block.column(USTAT).to_numpy(zero_copy_only=False)
    first = block.column(UFIRST).to_numpy(zero_copy_only=False) == 1
    for s, n in enumerate(np.bincount(status[first], minlength=len(USER_STATUS))):
        kinds.append("users"), names.append(USER_STATUS[s]), cats.append(None), ns.append(int(n))
    ucat = np.array(block.column(UCAT).to_pylist(), dtype=object)
    target = block.column(TARGET).to_numpy(zero_copy_only=False) == 1
    for name, mask in (("qualifying_users", target), ("sampled_users", target & (code == KEPT)),
                       ("kept_rows", code == KEPT)):
        values, counts = np.unique(ucat[mask].astype(str), return_counts=True) if mask.any() else ([], [])
        for v, n in zip(values, counts):
            kinds.append("category"), names.append(name), cats.append(str(v)), ns.append(int(n))
    return pa.table({"kind": pa.array(kinds, pa.string()), "name": pa.array(names, pa.string()),
                     "category": pa.array(cats, pa.string()), "n": pa.array(ns, pa.int64())})
