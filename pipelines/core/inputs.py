"""Where statement tables come from: an `rexeval extract` folder or Parquet files.

Jobs that consume statements (ground truth, clustering, the ranking benchmark) find
the shards, check their columns before any work, and pick which stage's rows to use
the same way, through these functions.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rexeval.pipelines.core.io import json_lines, table_files
from rexeval.pipelines.core.schema import SchemaError, validate_table


def statement_files(path: str | Path) -> list[Path]:
    """The statement shards of an extract folder (its statements/), a folder, or a file."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"statements input not found: {p} (expected an `rexeval "
                                "extract` output folder or a statements Parquet file)")
    src = p / "statements" if (p / "statements").is_dir() else p
    files = table_files(src)
    if not files:
        raise FileNotFoundError(f"no statements shards (*.parquet) in {src}")
    return files


def check_schemas(files: list[Path]) -> None:
    """Fail before any work when a file's columns do not fit STATEMENTS (reads footers only)."""
    for f in files:
        try:
            schema = pq.read_schema(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError("statements", str(f), None, None,
                              f"not a readable Parquet file: {exc}") from None
        validate_table(schema.empty_table(), "statements", source=str(f))


def resolve_stage(files: list[Path], stage: str) -> str:
    """"auto" -> "verified" if any verified row exists (in any shard), else "triplet"."""
    if stage != "auto":
        return stage
    for f in files:
        col = pq.read_table(f, columns=["stage"]).column("stage")
        if pc.any(pc.equal(col, "verified")).as_py():
            return "verified"
    return "triplet"


ANNOTATION_KEYS = (("reviewerID", "asin", "unixReviewTime"), ("user_id", "item_id", "timestamp"))
SENTIMENTS = ("positive", "negative", "neutral")


def statements_from_annotations(path: str | Path, stage: str = "verified") -> pa.Table:
    """Hand-written statements (JSON lines: a review's user, item and time, plus
    "statements": [{"statement", "sentiment"}]) -> a STATEMENTS table.

    The review is identified exactly as ingest identifies it (hash of user, item, time),
    so the table joins the ingested reviews. Malformed lines raise an error naming the
    file, line and field: annotations are curated input, not model output.
    """
    import json

    from rexeval.pipelines.core.ids import review_ids
    from rexeval.pipelines.core.schema import STATEMENTS
    from rexeval.pipelines.core.ids import statement_id

    p = Path(path)
    cols: dict[str, list] = {f.name: [] for f in STATEMENTS}
    for n, obj in json_lines(p, "statements"):
        keys = next((k for k in ANNOTATION_KEYS if all(x in obj for x in k)), None)
        if keys is None:
            raise SchemaError("statements", str(p), "reviewerID", n,
                              "needs reviewerID, asin, unixReviewTime (or user_id, item_id, timestamp)")
        user, item, ts = (obj[k] for k in keys)
        rid = review_ids([str(user)], [str(item)], [int(ts)])[0]
        items = obj.get("statements")
        if not isinstance(items, list):
            raise SchemaError("statements", str(p), "statements", n, "must be a list")
        for i, st in enumerate(items):
            text, sent = (st.get("statement"), st.get("sentiment")) if isinstance(st, dict) else (None, None)
            if not isinstance(text, str) or not text.strip():
                raise SchemaError("statements", str(p), f"statements[{i}].statement", n, "missing or empty")
            if sent not in SENTIMENTS:
                raise SchemaError("statements", str(p), f"statements[{i}].sentiment", n,
                                  f"{sent!r} is not one of {', '.join(SENTIMENTS)}")
            cols["statement_id"].append(statement_id(rid, stage, text, sent))
            cols["review_id"].append(rid)
            cols["user_id"].append(str(user))
            cols["item_id"].append(str(item))
            cols["statement"].append(text.strip())
            cols["topic"].append(None)
            cols["sentiment"].append(sent)
            cols["stage"].append(stage)
            cols["provenance"].append(json.dumps({"source": str(p), "line": n, "by": "annotation"}))
    return pa.table(cols, schema=STATEMENTS)



def reviews_path(path: str | Path) -> Path:
    """Accept an ingest output folder (its reviews/) or a reviews table directly."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such input: {p}")
    return p / "reviews" if (p / "reviews").is_dir() else p
