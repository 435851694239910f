"""Where job inputs come from.

Jobs that consume statements (ground truth, clustering, the ranking benchmark) find
the shards, check their columns before any work, and pick which stage's rows to use
the same way, through these functions. Every input may be a local path or a URI
(`pipelines/core/storage.py`); `runtime.reads_here` says where a task reading one must run.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.io import json_lines, read_parquet, table_files
from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.storage import Location, PathLike, is_uri, location


def given_text(path: PathLike) -> str:
    """A path as the user gave it, for provenance and messages: a URI unchanged, a local
    path as pathlib writes it (relative stays relative: ingested rows' `source` and
    annotations' provenance have always recorded it so)."""
    text = str(path)
    if is_uri(text):
        return text
    return str(Path(text.removeprefix("file://")))


def resolved_text(path: PathLike) -> str:
    """A path as a configuration records it to tell inputs apart: a URI unchanged, a
    local path absolute with its links resolved."""
    loc = location(path)
    return str(Path(loc.path).resolve()) if loc.is_local else loc.uri


def file_record(path: PathLike) -> dict:
    """{"path", "size"} of one input file, for a job's output configuration (a changed
    or replaced input changes the configuration, and so the output folder's)."""
    return {"path": resolved_text(path), "size": location(path).size()}


def statement_files(path: PathLike) -> list[Location]:
    """The statement shards of an extract folder (its statements/), a folder, or a file."""
    p = location(path)
    if not p.exists():
        raise FileNotFoundError(f"statements input not found: {given_text(path)} (expected an `rexeval "
                                "extract` output folder or a statements table: Parquet, CSV, TSV or JSON lines)")
    src = p / "statements" if (p / "statements").is_dir() else p
    files = table_files(src)
    if not files:
        raise FileNotFoundError(f"no statements shards (*.parquet) in {src}")
    return files


def check_schemas(files: list[PathLike], rename: dict[str, str] | None = None, schema: str = "statements") -> None:
    """Fail before any work when a file's columns do not fit `schema` (STATEMENTS): of a
    Parquet file its footer, of a CSV, TSV or JSON-lines file (gzipped or not) its first
    block of rows, read as `io.read_raw` reads it (`rename`: our names -> the file's);
    the SchemaError names the file, the format read and the columns found."""
    from rexeval.pipelines.core.io import read_raw, told_format, validated

    for f in files:
        fmt = told_format(f, schema, head=True)
        validated(read_raw(f, schema, rename, schema, head=True, fmt=fmt), schema, str(f), schema, fmt)


def resolve_stage(files: list[PathLike], stage: str, rename: dict[str, str] | None = None) -> str:
    """"auto" -> "verified" if any verified row exists (in any shard), else "triplet".
    A Parquet shard's stage column only is read; another format's file whole."""
    from rexeval.pipelines.core.io import read_part, told_format

    if stage != "auto":
        return stage
    for f in files:
        if told_format(f, "statements", head=True) == "parquet":
            col = read_parquet(f, columns=[(rename or {}).get("stage", "stage")]).column(0)
        else:
            col = read_part(f, "statements", ["stage"], rename).column("stage")
        if pc.any(pc.equal(col, "verified")).as_py():
            return "verified"
    return "triplet"


ANNOTATION_KEYS = (("reviewerID", "asin", "unixReviewTime"), ("user_id", "item_id", "timestamp"))
SENTIMENTS = ("positive", "negative", "neutral")


def statements_from_annotations(path: PathLike, stage: str = "verified") -> pa.Table:
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

    p = given_text(path)
    cols: dict[str, list] = {f.name: [] for f in STATEMENTS}
    for n, obj in json_lines(path, "statements"):
        keys = next((k for k in ANNOTATION_KEYS if all(x in obj for x in k)), None)
        if keys is None:
            raise SchemaError("statements", p, "reviewerID", n,
                              "needs reviewerID, asin, unixReviewTime (or user_id, item_id, timestamp)")
        user, item, ts = (obj[k] for k in keys)
        rid = review_ids([str(user)], [str(item)], [int(ts)])[0]
        items = obj.get("statements")
        if not isinstance(items, list):
            raise SchemaError("statements", p, "statements", n, "must be a list")
        for i, st in enumerate(items):
            text, sent = (st.get("statement"), st.get("sentiment")) if isinstance(st, dict) else (None, None)
            if not isinstance(text, str) or not text.strip():
                raise SchemaError("statements", p, f"statements[{i}].statement", n, "missing or empty")
            if sent not in SENTIMENTS:
                raise SchemaError("statements", p, f"statements[{i}].sentiment", n,
                                  f"{sent!r} is not one of {', '.join(SENTIMENTS)}")
            cols["statement_id"].append(statement_id(rid, stage, text, sent))
            cols["review_id"].append(rid)
            cols["user_id"].append(str(user))
            cols["item_id"].append(str(item))
            cols["statement"].append(text.strip())
            cols["topic"].append(None)
            cols["sentiment"].append(sent)
            cols["stage"].append(stage)
            cols["provenance"].append(json.dumps({"source": p, "line": n, "by": "annotation"}))
    return pa.table(cols, schema=STATEMENTS)



def reviews_path(path: PathLike) -> Location:
    """Accept an ingest output folder (its reviews/) or a reviews table directly."""
    p = location(path)
    if not p.exists():
        raise FileNotFoundError(f"no such input: {given_text(path)}")
    return p / "reviews" if (p / "reviews").is_dir() else p


REVIEWS_EXPECTED = "an `rexeval ingest` output folder (with reviews/) or a reviews Parquet file or folder of parts"


def table_rows(files: list[Location]) -> int | None:
    """Rows of a table's parts: of Parquet from their footers (no data read), of CSV,
    TSV or JSON lines (gzipped or not) counted block by block (`table_formats.count_rows`);
    None when a part is unreadable, which reading the table then reports with its file."""
    import pyarrow.parquet as pq

    from rexeval.pipelines.core.table_formats import UnknownTableFormat, count_rows, table_format

    total = 0
    for f in files:
        try:
            fmt = "parquet" if location(f).name.lower().endswith(".parquet") else table_format(f)
            if fmt != "parquet":
                total += count_rows(f, fmt)
                continue
            with location(f).open_input() as fh:
                total += pq.read_metadata(fh).num_rows
        except (pa.ArrowInvalid, OSError, UnknownTableFormat, UnicodeDecodeError):
            return None
    return total


def reviews_input(path: PathLike) -> Location:
    """The reviews table `path` names (an ingest folder's reviews/, or the table itself),
    refused when it holds no review: a split or a statistics table of nothing would
    look like a result. Raises FileNotFoundError (no table there) or ValueError (no rows)."""
    src = reviews_path(path)
    files = table_files(src)
    if not files:
        raise FileNotFoundError(f"{given_text(path)} holds no reviews table (no *.parquet files): "
                                f"expected {REVIEWS_EXPECTED}")
    if table_rows(files) == 0:
        errors = location(path) / "errors"
        if src != location(path) and errors.is_dir():
            bad = table_rows(table_files(errors))
            raise ValueError(f"{given_text(path)}: the ingest kept no reviews (reviews/ has 0 rows"
                             + (f", errors/ has {bad:,}" if bad else "") + f"); see {errors} for why each "
                             "row was refused, fix the input or the ingest settings and ingest again")
        raise ValueError(f"{given_text(src)}: the reviews table has 0 rows; expected {REVIEWS_EXPECTED} with reviews")
    return src


def of_stage(batch: pa.Table, stage: str) -> pa.Table:
    """The statement rows of `stage` in a block (a Ray Data batch)."""
    return batch.filter(pc.equal(batch.column("stage"), stage))


def _verified(block: pa.Table) -> pa.Table:
    return pa.table({"verified": [pc.sum(pc.equal(block.column("stage"), "verified")).as_py() or 0]})


def dataset_stage(statements, stage: str) -> str:
    """`resolve_stage`'s rule on a Ray dataset of statements: "auto" -> "verified" if any
    row is (counted by the workers, `runtime.block_partials`), else "triplet"."""
    from rexeval.pipelines.core.runtime import block_partials

    if stage != "auto":
        return stage
    return "verified" if any(r["verified"] for r in block_partials(statements, _verified)) else "triplet"

