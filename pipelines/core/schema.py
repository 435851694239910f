"""The tables every stage reads and writes, defined once, and their boundary checks.

Each schema is an explicit pyarrow schema. `validate_table` is called wherever a table
crosses a boundary (read from disk, handed to the next stage) and raises
`SchemaError` naming the file, the row and the field, so a user can fix the input.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

# -- core tables ---------------------------------------------------------------------

REVIEWS = pa.schema(
    [
        pa.field("review_id", pa.string(), nullable=False),  # hash of user, item, time
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("rating", pa.float32(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),  # seconds since the epoch, UTC
        pa.field("text", pa.string(), nullable=False),
        pa.field("summary", pa.string()),  # the review's title / summary line
        pa.field("user_name", pa.string()),
        pa.field("item_title", pa.string()),  # joined from item metadata when given
        pa.field("category", pa.string()),  # domain (toys, clothes, ...) when known
        pa.field("helpful_votes", pa.int32()),
        pa.field("source", pa.string(), nullable=False),  # file the row came from
        pa.field("line", pa.int64(), nullable=False),  # 1-based line in that file
    ]
)

STATEMENTS = pa.schema(
    [
        pa.field("statement_id", pa.string(), nullable=False),
        pa.field("review_id", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("statement", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("sentiment", pa.string()),  # positive | negative | neutral
        pa.field("stage", pa.string(), nullable=False),  # candidate | verified | triplet
        pa.field("provenance", pa.string()),  # JSON: model, prompt version, sampling
    ]
)

ERRORS = pa.schema(
    [
        pa.field("stage", pa.string(), nullable=False),
        pa.field("source", pa.string()),  # input file (or table) of the row
        pa.field("line", pa.int64()),  # 1-based line in that file, when known
        pa.field("row_id", pa.string()),  # id of the row when it has one
        pa.field("field", pa.string()),  # offending field, when one is to blame
        pa.field("error_type", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("raw", pa.string()),  # raw input row or raw model output
    ]
)

CLUSTERS = pa.schema(
    [
        pa.field("statement_id", pa.string(), nullable=False),
        pa.field("cluster_id", pa.string(), nullable=False),
        pa.field("is_representative", pa.bool_(), nullable=False),
        pa.field("statement", pa.string(), nullable=False),
        pa.field("sentiment", pa.string()),
    ]
)

# The canonical statement set: one row per paraphrase cluster, its representative
# (the member with the highest mean cosine to the others, seed 002 B.3) and its size.
CANONICAL = pa.schema(
    [
        pa.field("cluster_id", pa.string(), nullable=False),
        pa.field("statement", pa.string(), nullable=False),  # the representative's text
        pa.field("sentiment", pa.string()),
        pa.field("size", pa.int64(), nullable=False),  # distinct statements in the cluster
        pa.field("occurrences", pa.int64(), nullable=False),  # statement rows mapped to it
        pa.field("representative_id", pa.string(), nullable=False),  # a statement_id of it
    ]
)

EXPLANATIONS = pa.schema(
    [
        pa.field("example_id", pa.string(), nullable=False),
        pa.field("system", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("explanation", pa.string(), nullable=False),
        pa.field("reference", pa.string()),
    ]
)

SCORES = pa.schema(
    [
        pa.field("example_id", pa.string(), nullable=False),
        pa.field("system", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
    ]
)

SCORE_AGGREGATES = pa.schema(
    [
        pa.field("system", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("mean", pa.float64()),
        pa.field("std", pa.float64()),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("n_missing", pa.int64()),  # examples the metric left NaN (e.g. empty sets)
        pa.field("ci_low", pa.float64()),
        pa.field("ci_high", pa.float64()),
        pa.field("kind", pa.string()),  # per_example | corpus (one value, no std or interval)
    ]
)

# Statements of generated explanations, keyed like the explanations they came from
# (the extraction stage's output mapped back, or a file the user brings).
EXPLANATION_STATEMENTS = pa.schema(
    [
        pa.field("example_id", pa.string(), nullable=False),
        pa.field("system", pa.string(), nullable=False),
        pa.field("statement", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("sentiment", pa.string()),
    ]
)

# One sentence per statement, in the ground-truth pattern ("The user would appreciate
# this product because ..."), which the statement-level metrics score (seed 000, IV-B).
SENTENCES = pa.schema(
    [
        pa.field("statement_id", pa.string(), nullable=False),
        pa.field("review_id", pa.string(), nullable=False),
        pa.field("sentence", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("sentiment", pa.string()),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "reviews": REVIEWS,
    "statements": STATEMENTS,
    "errors": ERRORS,
    "clusters": CLUSTERS,
    "canonical": CANONICAL,
    "explanations": EXPLANATIONS,
    "sentences": SENTENCES,
    "scores": SCORES,
    "score_aggregates": SCORE_AGGREGATES,
    "explanation_statements": EXPLANATION_STATEMENTS,
}

SPLIT_NAMES = ("train", "valid", "test")


# -- validation ----------------------------------------------------------------------


@dataclass
class SchemaError(ValueError):
    """A table does not match its schema; names where, so the user can fix it."""

    table: str
    source: str
    field: str | None
    row: int | None
    problem: str

    def __str__(self) -> str:
        where = f"{self.source}"
        if self.row is not None:
            where += f", row {self.row}"
        if self.field is not None:
            where += f", field '{self.field}'"
        kind = "" if self.table in ("", "table") else f"{self.table} table, "  # not "table table"
        return f"{kind}{where}: {self.problem}"


def is_text_type(t: pa.DataType) -> bool:
    """Whether a column of type `t` holds text (strings, dictionary-encoded strings, or
    only nulls): what a reader checks before it treats a column as texts."""
    if pa.types.is_dictionary(t):
        return is_text_type(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)


def validate_table(table: pa.Table, schema: pa.Schema | str, source: str = "<memory>",
                   name: str | None = None) -> pa.Table:
    """Check `table` against `schema` and return it cast to the schema's exact types.

    Extra columns are an error (they usually mean a mapping went wrong); a missing
    nullable column is added as nulls; a null in a non-nullable column or a value that
    cannot be cast is reported with its row number (1-based within the table, as every
    row and line a user sees is counted).
    """
    if isinstance(schema, str):
        name = name or schema
        schema = TABLES[schema]
    name = name or "table"
    extra = [c for c in table.column_names if schema.get_field_index(c) < 0]
    if extra:
        raise SchemaError(name, source, extra[0], None,
                          f"unexpected column (expected {', '.join(schema.names)})")
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            if not field.nullable:
                raise SchemaError(name, source, field.name, None, "required column is missing")
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        col = table.column(field.name)
        if not col.type.equals(field.type):
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                row = _first_uncastable(col, field.type)
                raise SchemaError(name, source, field.name, None if row is None else row + 1,
                                  f"cannot convert {col.type} to {field.type}: {exc}") from None
        if not field.nullable and col.null_count:
            row = pc.index(pc.is_null(col), True).as_py()
            raise SchemaError(name, source, field.name, row + 1, "null in a required field")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def _first_uncastable(col: pa.ChunkedArray, typ: pa.DataType) -> int | None:
    offset = 0
    for chunk in col.chunks:
        for i, value in enumerate(chunk):
            try:
                pa.array([value.as_py()], type=chunk.type).cast(typ)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return offset + i
        offset += len(chunk)
    return None


def empty(schema: pa.Schema | str) -> pa.Table:
    """An empty table of a schema (a shard with no rows still has the right columns)."""
    if isinstance(schema, str):
        schema = TABLES[schema]
    return schema.empty_table()


def error_rows(stage: str, rows: list[dict]) -> pa.Table:
    """Build an errors table from dicts with the ERRORS fields (missing ones are null)."""
    cols = {f.name: [r.get(f.name) for r in rows] for f in ERRORS}
    return pa.Table.from_pydict({**cols, "stage": [stage] * len(rows)}, schema=ERRORS)
