"""Where job inputs come from.

Jobs that consume statements (ground truth, clustering, the ranking benchmark) find
the shards, check their columns before any work, and pick which stage's rows to use
the same way, through these functions; tables that several capabilities read
(explanations above all: evaluate, the judges, the prompted generators' tests) are read
in any format by `read_parts` and `read_explanation_rows`. Every input may be a local
path or a URI
(`rexeval/storage.py`); `runtime.reads_here` says where a task reading one must run.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.io import json_lines, read_parquet, read_raw, table_files, told_format, validated
from rexeval.pipelines.core.schema import SchemaError, is_text_type
from rexeval.storage import Location, PathLike, is_uri, location


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
        validated(read_raw(f, schema, rename, schema, head=True, fmt=fmt), schema, str(f), schema, fmt, rename)


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


# -- tables in any format, read by several capabilities (evaluate, judge, prompted generators)

def _table_path(path: PathLike, sub: str) -> Location:
    """A job folder's `sub` table when `path` is one, else `path` itself."""
    p = location(path)
    return p / sub if (p / sub).is_dir() else p


# Columns read as text: a number there is a mistake (a shifted column, a score written
# where the text belongs), never something to score as "3".
TEXT_COLUMNS = ("explanation", "reference", "statement", "topic", "sentiment", "sentence")
# Id columns: text, or integers (written as they are).
ID_COLUMNS = ("example_id", "system", "user_id", "item_id", "review_id", "statement_id")


def check_column_types(schema: pa.Schema, source: str, table: str) -> None:
    """Refuse a file whose text column holds numbers (or anything but text) before its
    rows are read: the schema check alone would cast them to strings and score them."""
    for f in schema:
        if f.name in TEXT_COLUMNS and not is_text_type(f.type):
            raise SchemaError(table, source, f.name, None,
                              f"holds {f.type} values, expected text (string); write the {f.name} column "
                              "as text (a number there is usually a shifted or mislabelled column)")
        if f.name in ID_COLUMNS and not (is_text_type(f.type) or pa.types.is_integer(f.type)):
            raise SchemaError(table, source, f.name, None,
                              f"holds {f.type} values, expected text (string) or integer ids")


def _part_source(given: PathLike, part: Location) -> str:
    """A part file as the user would find it: the path given, plus the part's place
    below it when the user named a folder."""
    top, shown = location(given), given_text(given)
    if part.uri == top.uri:
        return shown
    rest = part.uri[len(top.uri):].lstrip("/") if part.uri.startswith(top.uri) else part.name
    return f"{shown.rstrip('/')}/{rest}"


def read_parts(path: PathLike, schema: str | pa.Schema, name: str, sub: str | None = None,
               rename: dict[str, str] | None = None) -> list[tuple[str, pa.Table]]:
    """(source, table) of each part of a table (a file in any format `io.read_raw`
    reads, a folder of Parquet parts, or a job folder's `sub` table), its columns renamed
    by `rename` (ours -> theirs) and their types checked before its rows are."""
    loc = _table_path(path, sub) if sub else location(path)
    parts = []
    files = table_files(loc)
    if not files:
        raise FileNotFoundError(f"{given_text(path)}: no {name} table there (no *.parquet parts"
                                + (f", nor a {sub}/ table" if sub else "") + ")")
    for f in files:
        source = _part_source(path, f)
        fmt = told_format(f, name)  # a file in no format we read is named there
        raw = read_raw(f, schema, rename, name, fmt=fmt)
        check_column_types(raw.schema, source, name)
        parts.append((source, validated(raw, schema, source, name if isinstance(schema, str) else None, fmt,
                                        rename)))
    return parts


def read_explanation_rows(paths: Sequence[PathLike], rename: dict[str, str] | None = None
                          ) -> tuple[pa.Table, list[tuple[str, int]]]:
    """The EXPLANATIONS rows of every input (Parquet, CSV, TSV or JSON lines; `rename`
    maps our column names to the file's) and, for each, (file, 1-based row in that file),
    so an error row points where the user can look."""
    if not paths:
        raise ValueError("no explanations given")
    tables, origins = [], []
    for p in paths:
        for source, t in read_parts(p, "explanations", "explanations", sub="explanations", rename=rename):
            tables.append(t)
            origins += [(source, n) for n in range(1, t.num_rows + 1)]
    return pa.concat_tables(tables), origins


def read_explanations(paths: Sequence[PathLike]) -> pa.Table:
    """The EXPLANATIONS rows of every input (files, folders of parts, job folders)."""
    return read_explanation_rows(paths)[0]
