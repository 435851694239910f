"""The planted explanation data (`planted_text.planted_rows`) as a `rexeval split` output
and a `rexeval ground-truth` output, so the generate jobs run on it as on real data.

Pairs that are not held out are training reviews; held-out pairs alternate between
valid and test. The review text is noise unrelated to the planted sentence (so a model
trained with --target explanation learns the ground truth, not the review); one extra
test review has no ground-truth explanation (it must end in an error row).
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import EXPLANATIONS, REVIEWS
from tests.doubles.planted_text import planted_rows

NO_TRUTH = "r-no-truth"


def _review(rid: str, u: int, i: int, rating: float, text: str, line: int) -> dict:
    return {"review_id": rid, "user_id": f"u{u}", "item_id": f"i{i}", "rating": rating, "timestamp": line,
            "text": text, "summary": None, "user_name": None, "item_title": None, "category": "planted",
            "helpful_votes": None, "source": "planted.jsonl", "line": line}


def planted_split(root: str | Path, n_users: int = 12, n_items: int = 12, seed: int = 0) -> tuple[Path, Path]:
    """Write `<root>/split` and `<root>/truth`; return both paths."""
    root = Path(root)
    splits: dict[str, list[dict]] = {"train": [], "valid": [], "test": []}
    truth = []
    held = 0
    for line, r in enumerate(planted_rows(n_users, n_items, seed), 1):
        rid = f"r{r['user']}-{r['item']}"
        if r["held_out"]:
            name = "valid" if held % 2 == 0 else "test"
            held += 1
        else:
            name = "train"
        splits[name].append(_review(rid, r["user"], r["item"], float(r["rating"]),
                                    f"noise words {line % 7} and {line % 5}", line))
        truth.append({"example_id": rid, "system": "ground_truth", "user_id": f"u{r['user']}",
                      "item_id": f"i{r['item']}", "explanation": r["text"], "reference": None})
    splits["test"].append(_review(NO_TRUTH, 0, 0, 3.0, "a review nobody extracted statements from", 99999))
    for name, rows in splits.items():
        write_parquet_atomic(root / "split" / name / "part-00000.parquet", pa.Table.from_pylist(rows, schema=REVIEWS))
    write_parquet_atomic(root / "truth" / "explanations" / "part-00000.parquet",
                         pa.Table.from_pylist(truth, schema=EXPLANATIONS))
    return root / "split", root / "truth"
