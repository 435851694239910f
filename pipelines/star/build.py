"""Statements + clusters + reviews -> the STAR ranking benchmark (seed 002 section 4.3).

Pure functions over Arrow/pandas; `pipelines.star.pipeline` does the reading, writing
and resuming.

What the builder decides (each choice is ours where the seed is silent):
- A statement row counts under its cluster (`clusters` table of `rexeval cluster`),
  whose text is the cluster's representative. Without clusters, rows with the same
  polarity and the same words (`statements.dedup_key`) are one statement: that is the
  "before clustering" column of Table 6.
- An interaction is a review with at least one statement. A statement counts once per
  interaction even when two of its rows fall in one cluster (seed 002 eq. 2-4 use
  delta(s in S_ui)); the merged rows are counted, not lost.
- Split: leave-last-two per user in time order (the split module's order key, ties by
  row id): last -> test, the one before -> valid, the rest -> train. Users with fewer
  than `min_user_interactions` (3) interactions are not evaluated; all their
  interactions go to train, where they still feed the counts and the models.
- Statement indices follow the cluster id, a hash, so the evaluator's tie rule (lower
  index first, `metrics.ranking.top_k`) is unrelated to popularity or time. Users and
  items are indexed in id order.
- Rows that cannot be placed become error rows with a reason: a statement whose
  `statement_id` has no cluster (`no_cluster`), or whose review is not in the reviews
  table (`unknown_review`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.pipelines.paraphrase.nodes import NO_SENTIMENT
from rexeval.pipelines.core.schema import error_rows
from rexeval.pipelines.ingest.split import leave_last_two
from rexeval.pipelines.core.ids import dedup_key

STAGE = "star-build"
SPLIT_CODES = {"train": 0, "valid": 1, "test": 2}

INTERACTIONS = pa.schema([
    pa.field("interaction", pa.int64(), nullable=False),
    pa.field("review_id", pa.string(), nullable=False),
    pa.field("user_id", pa.string(), nullable=False),
    pa.field("item_id", pa.string(), nullable=False),
    pa.field("timestamp", pa.int64(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("user", pa.int64(), nullable=False),
    pa.field("item", pa.int64(), nullable=False),
])
TRIPLETS = pa.schema([
    pa.field("interaction", pa.int64(), nullable=False),
    pa.field("user", pa.int64(), nullable=False),
    pa.field("item", pa.int64(), nullable=False),
    pa.field("statement", pa.int64(), nullable=False),
])
CANDIDATES = pa.schema([
    pa.field("statement", pa.int64(), nullable=False),
    pa.field("cluster_id", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
    pa.field("sentiment", pa.string()),
    pa.field("rows", pa.int64(), nullable=False),  # statement rows mapped to it
])
BUILD_TABLES = {"interactions": INTERACTIONS, "triplets": TRIPLETS, "candidates": CANDIDATES}


@dataclass
class BuiltStar:
    """The benchmark tables, the error rows, the counts and Table 6's statistics."""

    tables: dict[str, pa.Table]
    errors: pa.Table
    counts: dict[str, int]
    stats: dict[str, dict] = field(default_factory=dict)


def unclustered_ids(statements: pd.DataFrame) -> pd.Series:
    """The statement identity before clustering: a hash of polarity and words."""
    sent = statements["sentiment"].fillna(NO_SENTIMENT)
    keys = [dedup_key(t) for t in statements["statement"]]
    return pd.Series([hashlib.blake2b(f"{s}\x1f{k}".encode(), digest_size=8).hexdigest()
                      for s, k in zip(sent, keys)], index=statements.index)


ERROR_KINDS = {
    "empty_statement": ("statement", "statement has no words once case, spaces and punctuation are ignored"),
    "no_cluster": ("statement_id", "statement_id is not in the clusters table (was it clustered from these "
                                   "statements? rows the cluster job rejected are in its errors table)"),
    "unknown_review": ("review_id", "review_id is not in the reviews table (pass the ingest output the "
                                    "statements were extracted from)"),
}
"""Error type -> (the field it names, its message)."""


def error_dicts(error_type: str, ids, raws, source: str) -> list[dict]:
    """Error rows of one type for statement ids and their raw texts."""
    field_, message = ERROR_KINDS[error_type]
    return [{"source": source, "row_id": sid, "field": field_, "error_type": error_type,
             "message": message, "raw": text} for sid, text in zip(ids, raws)]


def _errors(rows: pd.DataFrame, error_type: str, source: str) -> list[dict]:
    return error_dicts(error_type, rows["statement_id"], rows["statement" if "statement" in rows else "text"], source)


def assign_statements(statements: pa.Table, clusters: pa.Table | None,
                      canonical: pa.Table | None, source: str) -> tuple[pd.DataFrame, list[dict]]:
    """Each statement row -> (review_id, key, text, sentiment); unplaceable rows -> errors."""
    df = statements.select(["statement_id", "review_id", "statement", "sentiment"]).to_pandas()
    errors: list[dict] = []
    if clusters is None:
        df["key"] = unclustered_ids(df)
        empty = np.array([dedup_key(t) == "" for t in df["statement"]], dtype=bool)
        errors += _errors(df[empty], "empty_statement", source)
        df = df[~empty]
        df["text"] = df["statement"]
        return df[["statement_id", "review_id", "key", "text", "sentiment"]], errors
    cmap = clusters.select(["statement_id", "cluster_id"]).to_pandas().drop_duplicates("statement_id")
    df = df.merge(cmap, on="statement_id", how="left")
    missing = df["cluster_id"].isna()
    errors += _errors(df[missing], "no_cluster", source)
    df = df[~missing].rename(columns={"cluster_id": "key"})
    if canonical is not None and canonical.num_rows:
        canon = canonical.select(["cluster_id", "statement", "sentiment"]).to_pandas()
        canon = canon.rename(columns={"cluster_id": "key", "statement": "text", "sentiment": "c_sent"})
        df = df.merge(canon, on="key", how="left")
        df["text"] = df["text"].fillna(df["statement"])
        df["sentiment"] = df["c_sent"].where(df["c_sent"].notna(), df["sentiment"])
    else:
        df["text"] = df["statement"]
    return df[["statement_id", "review_id", "key", "text", "sentiment"]], errors


def split_interactions(inter: pd.DataFrame, min_user_interactions: int = 3) -> np.ndarray:
    """Split name per interaction row: leave-last-two, short histories all in train."""
    table = pa.Table.from_pandas(inter[["review_id", "user_id", "item_id", "timestamp", "source", "line"]],
                                 preserve_index=False)
    res = leave_last_two(table, min_interactions=min_user_interactions)
    split = pd.Series("train", index=inter["review_id"].to_numpy())
    for name in ("valid", "test"):
        split.loc[getattr(res, name).column("review_id").to_numpy(zero_copy_only=False)] = name
    return split.to_numpy(dtype=object)


def build_star(statements: pa.Table, reviews: pa.Table, clusters: pa.Table | None = None,
               canonical: pa.Table | None = None, min_user_interactions: int = 3,
               source: str = "statements") -> BuiltStar:
    """Build the benchmark (see the module docstring for every rule)."""
    rows, errors = assign_statements(statements, clusters, canonical, source)
    rev = reviews.select(["review_id", "user_id", "item_id", "timestamp", "source", "line"]).to_pandas()
    rev = rev.drop_duplicates("review_id")
    rows = rows.merge(rev, on="review_id", how="left")
    unknown = rows["user_id"].isna()
    errors += _errors(rows[unknown], "unknown_review", source)
    rows = rows[~unknown].reset_index(drop=True)

    inter = rows.drop_duplicates("review_id")[["review_id", "user_id", "item_id", "timestamp", "source", "line"]]
    inter = inter.sort_values(["user_id", "timestamp", "source", "line"], kind="mergesort").reset_index(drop=True)
    if len(inter):
        inter["split"] = split_interactions(inter, min_user_interactions)
    else:
        inter["split"] = pd.Series(dtype=object)
    users = np.sort(inter["user_id"].unique())
    items = np.sort(inter["item_id"].unique())
    inter["interaction"] = np.arange(len(inter), dtype=np.int64)
    inter["user"] = np.searchsorted(users, inter["user_id"].to_numpy()).astype(np.int64)
    inter["item"] = np.searchsorted(items, inter["item_id"].to_numpy()).astype(np.int64)

    keys = np.sort(rows["key"].unique())
    rows["statement"] = np.searchsorted(keys, rows["key"].to_numpy()).astype(np.int64)
    rows = rows.merge(inter[["review_id", "interaction", "user", "item"]], on="review_id")
    trip = (rows[["interaction", "user", "item", "statement"]].drop_duplicates()
            .sort_values(["interaction", "statement"], kind="mergesort").reset_index(drop=True))

    first = rows.sort_values(["statement", "statement_id"], kind="mergesort").drop_duplicates("statement")
    cand = pd.DataFrame({"statement": np.arange(len(keys), dtype=np.int64), "cluster_id": keys,
                         "text": first["text"].to_numpy(dtype=object),
                         "sentiment": first["sentiment"].to_numpy(dtype=object),
                         "rows": np.bincount(rows["statement"], minlength=len(keys)).astype(np.int64)})
    tables = {
        "interactions": pa.Table.from_pandas(inter[[f.name for f in INTERACTIONS]], schema=INTERACTIONS,
                                             preserve_index=False),
        "triplets": pa.Table.from_pandas(trip, schema=TRIPLETS, preserve_index=False),
        "candidates": pa.Table.from_pandas(cand, schema=CANDIDATES, preserve_index=False),
    }
    err = error_rows(STAGE, errors)
    counts = {
        "statement_rows": statements.num_rows,
        "statement_rows_used": len(rows),
        "statement_rows_merged": len(rows) - len(trip),
        "error_rows": err.num_rows,
        "interactions": len(inter),
        "users": len(users),
        "items": len(items),
        "statements": len(keys),
        "triplets": len(trip),
        **{s: int((inter["split"] == s).sum()) for s in SPLIT_CODES},
        "users_evaluated": int(inter.loc[inter["split"] == "test", "user"].nunique()),
    }
    return BuiltStar(tables, err, counts, {"after": statistics(inter, trip, cand)})


def _min_mean_max(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"min": 0, "mean": 0.0, "max": 0}
    return {"min": int(values.min()), "mean": float(values.mean()), "max": int(values.max())}


def statistics(inter: pd.DataFrame, trip: pd.DataFrame, cand: pd.DataFrame) -> dict:
    """Seed 002 Table 6 for one statement identity: users, items, interactions per split,
    distinct statements (per polarity), min/mean/max distinct statements per interaction,
    per item and per user, and the total of (interaction, statement) triplets."""
    sent = cand["sentiment"].fillna(NO_SENTIMENT)
    per_item = trip[["item", "statement"]].drop_duplicates().groupby("item").size().to_numpy()
    per_user = trip[["user", "statement"]].drop_duplicates().groupby("user").size().to_numpy()
    return {
        "users": int(inter["user_id"].nunique()),
        "items": int(inter["item_id"].nunique()),
        "interactions": len(inter),
        **{s: int((inter["split"] == s).sum()) for s in SPLIT_CODES},
        "statements": len(cand),
        "by_sentiment": {str(k): int(v) for k, v in sent.value_counts().sort_index().items()},
        "per_interaction": _min_mean_max(trip.groupby("interaction").size().to_numpy()),
        "per_item": _min_mean_max(per_item),
        "per_user": _min_mean_max(per_user),
        "triplets": len(trip),
    }


def before_clustering_stats(statements: pa.Table, built: BuiltStar) -> dict:
    """Table 6's "before clustering" half: the same interactions, statements identified by
    polarity + words instead of by cluster."""
    inter = built.tables["interactions"].to_pandas()
    df = statements.select(["statement_id", "review_id", "statement", "sentiment"]).to_pandas()
    df = df[df["review_id"].isin(inter["review_id"])]
    df = df[[dedup_key(t) != "" for t in df["statement"]]]
    df["key"] = unclustered_ids(df)
    df = df.merge(inter[["review_id", "interaction", "user", "item"]], on="review_id")
    trip = df[["interaction", "user", "item", "key"]].drop_duplicates().rename(columns={"key": "statement"})
    cand = df.drop_duplicates("key")[["key", "sentiment"]]
    return statistics(inter, trip, cand)


def format_table6(stats: dict[str, dict]) -> str:
    """Markdown in the layout of seed 002 Table 6 (one column per dataset)."""
    names = list(stats)

    def row(label: str, get) -> str:
        return "| " + label + " | " + " | ".join(get(stats[n]) for n in names) + " |"

    def mmm(d: dict) -> str:
        return f"{d['min']}/{d['mean']:.2f}/{d['max']}"

    def red(before: float, after: float) -> str:
        return f"{after:,} ({100.0 * (1 - after / before):.1f}%)" if before else f"{after:,}"

    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    first = {n: stats[n].get("after") or stats[n]["before"] for n in names}
    lines.append("| **Basic statistics** |" + " |" * len(names))
    for key, label in (("users", "Users"), ("items", "Items"), ("interactions", "Interactions"),
                       ("train", "Train"), ("valid", "Valid"), ("test", "Test")):
        lines.append("| " + label + " | " + " | ".join(f"{first[n][key]:,}" for n in names) + " |")
    for half, title in (("before", "Before clustering"), ("after", "After clustering")):
        if not all(half in stats[n] for n in names):
            continue
        lines.append(f"| **{title}** |" + " |" * len(names))
        base = {n: stats[n].get("before", stats[n][half]) for n in names}
        lines.append("| Unique statements | " + " | ".join(
            red(base[n]["statements"], stats[n][half]["statements"]) if half == "after" and "before" in stats[n]
            else f"{stats[n][half]['statements']:,}" for n in names) + " |")
        sents = sorted({s for n in names for s in stats[n][half]["by_sentiment"]})
        for s in sents:
            cells = []
            for n in names:
                a = stats[n][half]["by_sentiment"].get(s, 0)
                b = base[n]["by_sentiment"].get(s, 0)
                cells.append(red(b, a) if half == "after" and "before" in stats[n] else f"{a:,}")
            lines.append(f"| *{s}* | " + " | ".join(cells) + " |")
        for key, label in (("per_interaction", "Min/Mean/Max per interaction"),
                           ("per_item", "Min/Mean/Max per item"), ("per_user", "Min/Mean/Max per user")):
            lines.append(row(label, lambda s, k=key, h=half: mmm(s[h][k])))
        lines.append(row("Total triplets", lambda s, h=half: f"{s[h]['triplets']:,}"))
    return "\n".join(lines) + "\n"
