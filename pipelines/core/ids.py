"""The stable ids that join rexeval's tables, and the key that finds duplicates.

A review is identified by a hash of (user, item, time), so every table derived from the
same review file joins on it whatever the order of rows or shards; a statement by a
hash of its review, stage, surface form (up to case and punctuation) and polarity.
"""
from __future__ import annotations

import hashlib
import re



def dedup_key(statement: str) -> str:
    """Case, space and punctuation-insensitive key for duplicates within one review."""
    return re.sub(r"[^\w]+", " ", statement.lower()).strip()



def statement_id(review_id: str, stage: str, statement: str, sentiment: str | None) -> str:
    """Stable id: the same review, stage, statement and polarity give the same id."""
    raw = "\x1f".join([review_id, stage, dedup_key(statement), sentiment or ""])
    return hashlib.blake2b(raw.encode("utf-8"), digest_size=8).hexdigest()



def review_ids(users: list, items: list, times: list) -> list[str]:
    """The stable review id: a 64-bit BLAKE2b hash of (user, item, time), in hex."""
    h = hashlib.blake2b
    return [h(f"{u}\x1f{i}\x1f{t}".encode(), digest_size=8).hexdigest()
            for u, i, t in zip(users, items, times)]
