"""Dataset statistics in the layout of Table II of the factual-consistency paper (seed 000).

`dataset_stats` counts one dataset (its splits, optionally its statements) with Arrow
kernels only; `format_table` lays several datasets side by side, one column each, with
thousands grouped by a space ("163 711") as the paper prints them, as plain text or as
Markdown.
"""
from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.schema import SPLIT_NAMES

_SPLIT_ALIASES = {"train": "train", "valid": "valid", "validation": "valid", "test": "test"}

# (label, key, kind) in display order; kind picks the formatting. Labels indented by two
# spaces belong to the section header before them.
ROWS = (
    ("Users", "users", "int"),
    ("Items", "items", "int"),
    ("Interactions", "interactions", "int"),
    ("Train", "train", "int"),
    ("Validation", "valid", "int"),
    ("Test", "test", "int"),
    ("Statements", None, "section"),
    ("  Avg/interaction", "statements_per_interaction", "float"),
    ("  Avg/user", "statements_per_user", "float"),
    ("  Avg/item", "statements_per_item", "float"),
    ("  Unique", "statements_unique", "int"),
    ("  Total", "statements_total", "int"),
    ("Sparsity %", "sparsity_pct", "float"),
    ("Avg words/review", "avg_words_per_review", "float"),
    ("Time range", None, "section"),
    ("  First review", "time_first", "date"),
    ("  Last review", "time_last", "date"),
)
MISSING = "-"


def _splits(splits) -> dict[str, pa.Table | None]:
    """Normalise the accepted inputs to {"train"|"valid"|"test"|"all": table}."""
    if isinstance(splits, pa.Table):
        return {"all": splits}
    if all(hasattr(splits, name) for name in SPLIT_NAMES):  # a split.SplitResult
        return {name: getattr(splits, name) for name in SPLIT_NAMES}
    if not isinstance(splits, dict) or not splits:
        raise ValueError("splits must be a pyarrow Table or a non-empty dict of split name "
                         "to Table (train, valid/validation, test)")
    out: dict[str, pa.Table] = {}
    for name, table in splits.items():
        key = _SPLIT_ALIASES.get(name)
        if key is None:
            raise ValueError(f"unknown split '{name}' (expected train, valid or test)")
        if key in out:
            raise ValueError(f"split '{key}' given twice")
        if not isinstance(table, pa.Table):
            raise ValueError(f"split '{name}' is a {type(table).__name__}, not a pyarrow Table")
        out[key] = table
    return out


def _column(tables: list[pa.Table], name: str) -> pa.ChunkedArray | None:
    """One column gathered from all tables (None when any table lacks it)."""
    if not tables or any(name not in t.column_names for t in tables):
        return None
    cols = [t.column(name) for t in tables]
    typ = cols[0].type
    chunks = [c for col in cols for c in col.cast(typ).chunks]
    return pa.chunked_array(chunks, type=typ)


def dataset_stats(splits: dict[str, pa.Table] | pa.Table,
                  statements: pa.Table | None = None) -> dict:
    """Counts for one dataset: users, items, interactions, split sizes, statements, ...

    `splits` is a reviews table, or its splits as {"train", "valid" (or "validation"),
    "test"} (a `SplitResult` works too). Users, items and interactions are counted over all
    splits together. Sparsity % = 100 * (1 - interactions / (users * items)).

    `statements` (columns review_id, user_id, item_id, statement; pass the stage you want
    counted) is first restricted to the reviews present in the splits, when both have
    review_id, so that statements of reviews the split dropped do not count. The paper does
    not define its averages; here Avg/interaction, Avg/user and Avg/item are the total
    number of statements divided by interactions, users and items, and Unique counts
    distinct statement texts.

    Values that cannot be computed (no text column, no rows) are None; split sizes are
    None for a table given alone.
    """
    parts = _splits(splits)
    tables = list(parts.values())
    for name, table in parts.items():
        missing = [c for c in ("user_id", "item_id") if c not in table.column_names]
        if missing:
            raise ValueError(f"split '{name}' lacks column(s) {', '.join(missing)}")

    users = pc.count_distinct(_column(tables, "user_id")).as_py()
    items = pc.count_distinct(_column(tables, "item_id")).as_py()
    interactions = sum(t.num_rows for t in tables)
    stats: dict = {
        "users": users,
        "items": items,
        "interactions": interactions,
        **{name: (parts[name].num_rows if name in parts else None) for name in SPLIT_NAMES},
        "sparsity_pct": (100.0 * (1.0 - interactions / (users * items))
                         if users and items else None),
        "avg_words_per_review": None,
        "time_first": None,
        "time_last": None,
    }

    text = _column(tables, "text")
    if text is not None and len(text) - text.null_count > 0:
        stats["avg_words_per_review"] = pc.mean(_word_counts(text)).as_py()

    ts = _column(tables, "timestamp")
    if ts is not None and len(ts) - ts.null_count > 0:
        if pa.types.is_timestamp(ts.type):
            ts = ts.cast(pa.timestamp("s")).cast(pa.int64())
        bounds = pc.min_max(ts).as_py()
        stats["time_first"], stats["time_last"] = int(bounds["min"]), int(bounds["max"])

    if statements is not None:
        stats.update(_statement_stats(statements, tables, interactions, users, items))
    return stats


def _word_counts(text: pa.ChunkedArray) -> pa.ChunkedArray:
    """Words per text: runs of Unicode whitespace separate words ("" has none).

    Splitting the trimmed text is several times faster than counting regex matches.
    """
    trimmed = pc.utf8_trim_whitespace(text)
    pieces = pc.list_value_length(pc.utf8_split_whitespace(trimmed))
    return pc.subtract(pieces, pc.equal(trimmed, "").cast(pieces.type))


def _statement_stats(statements: pa.Table, tables: list[pa.Table], interactions: int,
                     users: int, items: int) -> dict:
    if "statement" not in statements.column_names:
        raise ValueError("statements table lacks the 'statement' column")
    review_ids = _column(tables, "review_id")
    if review_ids is not None and "review_id" in statements.column_names:
        inside = pc.is_in(statements.column("review_id"),
                          value_set=review_ids.combine_chunks().cast(
                              statements.column("review_id").type))
        statements = statements.filter(inside)
    total = statements.num_rows

    def per(n: int) -> float | None:
        return total / n if n else None

    return {
        "statements_total": total,
        "statements_unique": pc.count_distinct(statements.column("statement")).as_py(),
        "statements_per_interaction": per(interactions),
        "statements_per_user": per(users),
        "statements_per_item": per(items),
    }


# -- formatting ------------------------------------------------------------------------


def group_thousands(n: int, sep: str = " ") -> str:
    """163711 -> "163 711": digits in groups of three, as the paper prints counts."""
    return f"{int(n):,}".replace(",", sep)


def _cell(value, kind: str, sep: str) -> str:
    if value is None:
        return MISSING
    if kind == "int":
        return group_thousands(value, sep)
    if kind == "float":
        return f"{value:.2f}"
    if kind == "date":
        return datetime.fromtimestamp(int(value), tz=timezone.utc).strftime("%Y-%m-%d")
    raise ValueError(kind)


def _rows(stats_by_name: dict[str, dict], sep: str) -> list[tuple[str, list[str] | None]]:
    """(label, cells) per displayed row; cells None for a section header.

    A row is shown when at least one dataset has a value for it, a section header when
    at least one of its rows is shown.
    """
    names = list(stats_by_name)
    out: list[tuple[str, list[str] | None]] = []
    pending_section: str | None = None
    for label, key, kind in ROWS:
        if kind == "section":
            pending_section = label
            continue
        if not label.startswith("  "):
            pending_section = None
        values = [stats_by_name[n].get(key) for n in names]
        if all(v is None for v in values):
            continue
        if pending_section is not None:
            out.append((pending_section, None))
            pending_section = None
        out.append((label, [_cell(v, kind, sep) for v in values]))
    return out


def format_table(stats_by_name: dict[str, dict], markdown: bool = False,
                 sep: str = " ") -> str:
    """Datasets as columns, statistics as rows, like the paper's Table II.

    Plain text right-aligns the numbers under each dataset name; `markdown=True` gives a
    GitHub table instead (same rows). `sep` groups thousands (use "\\u2009" for a thin space).
    """
    if not stats_by_name:
        raise ValueError("no datasets to format")
    names = [str(n) for n in stats_by_name]
    rows = _rows(stats_by_name, sep)
    if markdown:
        lines = ["| | " + " | ".join(names) + " |",
                 "|---|" + "---:|" * len(names)]
        for label, cells in rows:
            if cells is None:
                lines.append(f"| **{label}** |" + " |" * len(names))
            else:
                shown = "&nbsp;&nbsp;" + label.strip() if label.startswith("  ") else label
                lines.append(f"| {shown} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    label_w = max(len(label) for label, _ in rows) if rows else 0
    widths = [len(n) for n in names]
    for _, cells in rows:
        for j, cell in enumerate(cells or ()):
            widths[j] = max(widths[j], len(cell))
    lines = [" " * label_w + "".join("  " + n.rjust(w) for n, w in zip(names, widths))]
    for label, cells in rows:
        if cells is None:
            lines.append(label)
        else:
            lines.append(label.ljust(label_w)
                         + "".join("  " + c.rjust(w) for c, w in zip(cells, widths)))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def format_markdown(stats_by_name: dict[str, dict], sep: str = " ") -> str:
    """The Markdown variant of `format_table`."""
    return format_table(stats_by_name, markdown=True, sep=sep)
