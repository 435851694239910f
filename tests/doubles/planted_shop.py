"""A small planted shop for seed 004's prompted generators: two taste groups, marked text.

Guitarists (g0..g3) love guitar items (G0..G2) and dislike drum items; drummers (d0..d3)
the other way round. Every review's headline and text carry a marker naming its user
and item ("HL-g0-G1", "TXT-g0-G1"), so a test can tell exactly which reviews reached a
prompt. Each user's latest review is the interaction seed 004 explains. Edge cases:
- `loner` reviewed one ordinary item, then `SOLO` (an item nobody else has): no
  neighbour, no other review, so user-based, review extraction and summarisation must
  end in error rows; item-based still works from loner's earlier purchase;
- the item `SOLO` also has no factors (its only rating is the explained one): item-based
  gives `cold_item` for it.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import REVIEWS

GUITAR, DRUM = ["G0", "G1", "G2"], ["D0", "D1", "D2"]
GUITARISTS, DRUMMERS = [f"g{i}" for i in range(4)], [f"d{i}" for i in range(4)]
SENTENCES = {
    "G": "The neck is smooth and the strings stay in tune for weeks.",
    "D": "The drum heads sound warm and the shells resonate nicely.",
}


def _review(user: str, item: str, t: int, rating: float) -> dict:
    kind = SENTENCES[item[0]] if item[0] in SENTENCES else "It does what the listing says."
    text = f"TXT-{user}-{item}. {kind} I bought it for my band."
    return {"review_id": f"r-{user}-{item}", "user_id": user, "item_id": item, "rating": rating, "timestamp": t,
            "text": text, "summary": f"HL-{user}-{item}", "user_name": None, "item_title": None,
            "category": "instruments", "helpful_votes": 0, "source": "planted.jsonl", "line": t}


def planted_reviews() -> list[dict]:
    rows, t = [], 0
    for group, own, other in ((GUITARISTS, GUITAR, DRUM), (DRUMMERS, DRUM, GUITAR)):
        for n, u in enumerate(group):
            order = own[n % 3:] + own[:n % 3]  # each user ends on another item of their kind
            for item in [other[n % 3]] + order:
                t += 1
                rows.append(_review(u, item, t, 1.0 if item in other else 5.0))
    rows.append(_review("loner", "G0", 100, 4.0))
    rows.append(_review("loner", "SOLO", 101, 5.0))
    return rows


def planted_ingest(root: str | Path) -> Path:
    """Write the planted reviews as an ingest folder (`<root>/ingest/reviews/`)."""
    out = Path(root) / "ingest"
    write_parquet_atomic(out / "reviews" / "part-00000.parquet", pa.Table.from_pylist(planted_reviews(), schema=REVIEWS))
    return out
