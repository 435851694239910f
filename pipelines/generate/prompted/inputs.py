"""What a prompted generator may read: the interactions to explain and the reviews known
before them, with the test interaction's own review kept out.

Seed 004 explains one purchase per user and builds its generators from "the historical
interactions of users and items present in the evaluation dataset, excluding their
mutual interactions". `load_inputs` reads, from a local folder or a URI
(`rexeval/storage.py`), either

- an ingest folder, or a reviews table of yours (Parquet, CSV, TSV or JSON lines,
  gzipped or not, its columns mapped to ours by `columns`): the interactions to explain
  are each user's latest review (users with at least two reviews, seed 004 §3.1,
  `core.context.last_interactions`); or
- a `rexeval split` folder: the interactions of one split (`--split test` by default, the
  same examples `rexeval generate run` decodes, so every system's explanations share
  example ids and can be judged against each other).

`known` holds every other review, minus any review of a target's own (user, item) pair:
no generator can read the review it is explaining (or a second review the user wrote of
the same item). From a split folder, `known` is the training split (plus validation when
the test split is explained), and `valid` is the validation split, which the BiasedMF
uses to pick its best epoch (and so does not train on: `prompted/mf.py` drops its pairs
from the training rows); from an ingest folder `valid` is None (the trainer then holds
out a seeded part of `known`).

The example id of an interaction is its review id, as in every explanations table; the
review text becomes the `reference` column (never shown to a generator).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from rexeval.pipelines.core.inputs import resolved_text, reviews_path
from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.schema import SPLIT_NAMES
from rexeval.storage import PathLike, location

TARGET_COLUMNS = ("example_id", "user_id", "item_id", "timestamp", "rating", "reference")
REVIEW_COLUMNS = ("review_id", "user_id", "item_id", "rating", "timestamp", "text", "summary", "item_title",
                  "category", "helpful_votes")


@dataclass
class Inputs:
    """The interactions to explain (`targets`, TARGET_COLUMNS) and what the generators
    may read (`known` reviews; `valid` reviews for model selection, or None)."""

    targets: pd.DataFrame
    known: pd.DataFrame
    valid: pd.DataFrame | None
    source: str
    kind: str  # "ingest" | "split"


def is_split(path: PathLike) -> bool:
    loc = location(path)
    return all((loc / name).is_dir() for name in SPLIT_NAMES)


def _reviews(path: PathLike, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """A reviews table (a folder of Parquet parts, or a file in any format `io.read_table`
    reads), `columns` (ours -> theirs) renaming its own columns; a missing column names
    the file, the format read and the columns found."""
    t = read_table(path, "reviews", rename=columns or None).to_pandas()
    for c in REVIEW_COLUMNS:
        if c not in t.columns:
            t[c] = None
    t = t[list(REVIEW_COLUMNS)].copy()
    for c in ("review_id", "user_id", "item_id"):
        t[c] = t[c].astype(str)
    return t


def _as_targets(reviews: pd.DataFrame) -> pd.DataFrame:
    t = reviews.rename(columns={"review_id": "example_id", "text": "reference"})
    t = t[list(TARGET_COLUMNS)].drop_duplicates("example_id")
    return t.sort_values(["user_id", "item_id", "example_id"], kind="stable").reset_index(drop=True)


def _without_targets(reviews: pd.DataFrame, targets: pd.DataFrame) -> pd.DataFrame:
    """Reviews that are neither a target nor of a target's (user, item) pair."""
    pairs = pd.MultiIndex.from_frame(targets[["user_id", "item_id"]])
    mutual = pd.MultiIndex.from_frame(reviews[["user_id", "item_id"]]).isin(pairs)
    keep = ~mutual & ~reviews["review_id"].isin(targets["example_id"])
    return reviews[keep].reset_index(drop=True)


def load_inputs(path: PathLike, split: str = "test", min_reviews: int = 2,
                limit: int | None = None, columns: dict[str, str] | None = None) -> Inputs:
    """The Inputs of an ingest or split folder, or of a reviews table as an ingest folder
    holds it (see the module docstring); `limit` keeps the first N interactions (by user,
    item) while `known` stays whole. `columns`: our column names -> the reviews'."""
    from rexeval.pipelines.core.context import last_interactions

    p = location(path)
    if not p.exists():
        raise FileNotFoundError(f"no such input: {p}")
    if is_split(p):
        if split not in SPLIT_NAMES:
            raise ValueError(f"--split must be one of {list(SPLIT_NAMES)}, got {split!r}")
        parts = {name: _reviews(p / name, columns) for name in SPLIT_NAMES}
        targets = _as_targets(parts[split])
        known_parts = [parts["train"]] + ([parts["valid"]] if split == "test" else [])
        known = pd.concat(known_parts, ignore_index=True)
        valid = parts["valid"] if split == "test" else None
        kind = "split"
    else:
        if split != "test":
            raise ValueError(f"{p} is an ingest folder or a reviews table: --split applies to a `rexeval split` "
                             "folder only")
        reviews = _reviews(reviews_path(p), columns)
        last = last_interactions(reviews, min_reviews=min_reviews)
        targets = _as_targets(reviews[reviews["review_id"].isin(last["review_id"])])
        known, valid, kind = reviews, None, "ingest"
    if targets.empty:
        raise ValueError(f"{p}: no interaction to explain (" + (
            f"the {split} split is empty)" if kind == "split"
            else f"no user has {min_reviews} or more reviews)"))
    # Every interaction to explain leaves `known` before --limit picks some, so a limited
    # run gives its interactions the same context as a full run.
    known = _without_targets(known, targets)
    if valid is not None:
        valid = _without_targets(valid, targets)
    if limit:
        targets = targets.head(limit).reset_index(drop=True)
    return Inputs(targets=targets, known=known, valid=valid, source=resolved_text(p), kind=kind)
