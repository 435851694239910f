"""Dataset statistics in the layout of Table II of the factual-consistency paper (seed 000).

`dataset_stats` counts one dataset (its splits, optionally its statements) with Arrow
kernels only; `format_table` lays several datasets side by side, one column each, with
thousands grouped by a space ("163 711") as the paper prints them, as plain text or as
Markdown.
"""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
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


# -- the same statistics of tables too large for one process ----------------------------
# `dataset_stats_ray` counts tables read as Ray Datasets (`runtime.read_dataset`) on the Ray
# workers: sums, minima and maxima per block, combined here; distinct users, items and
# statements per group of keys (`runtime.map_key_groups`), each key counted in the one
# group that holds it. The driver holds a few rows per block and group, never a table.

_REVIEW_KEYS = ("user_id", "item_id")


def _review_partials(block: pa.Table, split: str, by: str | None) -> pa.Table:
    """Rows, words of the non-null texts, non-null texts and the first and last timestamp
    of one block of a split, per value of `by`."""
    n = block.num_rows
    text = block.column("text")
    words = _word_counts(text) if n else pa.array([], pa.int64())
    t = pa.table({"by": block.column(by) if by else pa.nulls(n, pa.string()), "rows": np.ones(n, np.int64),
                  "words": pc.cast(words, pa.int64()), "texts": pc.cast(pc.is_valid(text), pa.int64()),
                  "ts": pc.cast(block.column("timestamp"), pa.int64())})
    g = t.group_by(["by"], use_threads=False).aggregate(
        [("rows", "sum"), ("words", "sum"), ("texts", "sum"), ("ts", "min"), ("ts", "max")])
    return g.append_column("split", pa.array([split] * g.num_rows, pa.string()))


def _keys(block: pa.Table, kinds: tuple[str, ...], by: str | None) -> pa.Table:
    """The distinct (kind, value, by) of one block, with how many rows each had."""
    n = block.num_rows
    parts = [pa.table({"kind": pa.repeat(pa.scalar(kind), n), "value": pc.cast(block.column(kind), pa.string()),
                       "by": block.column(by) if by else pa.nulls(n, pa.string()), "n": np.ones(n, np.int64)})
             for kind in kinds]
    t = pa.concat_tables(parts)
    return t.group_by(["kind", "value", "by"], use_threads=False).aggregate([("n", "sum")]).rename_columns(
        ["kind", "value", "by", "n"])


def _distinct(group: pa.Table) -> pa.Table:
    """Distinct values and rows per kind, per (kind, by) and in all (`whole`), of a group
    that holds every row of its values."""
    per_by = group.group_by(["kind", "by"], use_threads=False).aggregate([("value", "count_distinct"), ("n", "sum")])
    whole = group.group_by(["kind"], use_threads=False).aggregate([("value", "count_distinct"), ("n", "sum")])
    cols = ["kind", "by", "distinct", "rows"]
    per_by = per_by.select(["kind", "by", "value_count_distinct", "n_sum"]).rename_columns(cols)
    whole = whole.append_column("by", pa.nulls(whole.num_rows, pa.string()))
    whole = whole.select(["kind", "by", "value_count_distinct", "n_sum"]).rename_columns(cols)
    return pa.concat_tables([per_by.append_column("whole", pa.array([False] * per_by.num_rows)),
                             whole.append_column("whole", pa.array([True] * whole.num_rows))])


def _id_rows(block: pa.Table) -> pa.Table:
    n = block.num_rows
    return pa.table({"review_id": block.column("review_id"), "statement": pa.nulls(n, pa.string()),
                     "is_review": pa.array(np.ones(n, bool))})


def _statement_rows(block: pa.Table) -> pa.Table:
    n = block.num_rows
    return pa.table({"review_id": block.column("review_id"), "statement": block.column("statement"),
                     "is_review": pa.array(np.zeros(n, bool))})


def _statements_of_reviews(group: pa.Table) -> pa.Table:
    """The statements of a group (all rows of its review ids) whose review is in it."""
    mask = group.column("is_review")
    ids = group.filter(mask).column("review_id")
    st = group.filter(pc.invert(mask))
    return st.filter(pc.is_in(st.column("review_id"), value_set=ids.combine_chunks())).select(["statement"])


def _count(parts: dict, statements, by: str | None, groups: int) -> dict:
    """The sums, extremes and distinct counts `_from_counts` makes statistics of."""
    from rexeval.pipelines.core.runtime import block_partials, map_key_groups

    # Two passes read the splits: they are read once, into the object store (not here).
    parts = {name: ds.materialize() for name, ds in parts.items()}
    sums = [row for name, ds in parts.items() for row in block_partials(ds, _review_partials, split=name, by=by)]
    keys = [ds.map_batches(_keys, fn_kwargs={"kinds": _REVIEW_KEYS, "by": by}, batch_size=None, batch_format="pyarrow")
            for ds in parts.values()]
    if statements is not None:
        ids = [ds.map_batches(_id_rows, batch_size=None, batch_format="pyarrow") for ds in parts.values()]
        st = statements.map_batches(_statement_rows, batch_size=None, batch_format="pyarrow")
        kept = map_key_groups(st.union(*ids), "review_id", _statements_of_reviews, groups)
        keys.append(kept.map_batches(_keys, fn_kwargs={"kinds": ("statement",), "by": None}, batch_size=None,
                                     batch_format="pyarrow"))
    distinct = map_key_groups(keys[0].union(*keys[1:]) if len(keys) > 1 else keys[0], ["kind", "value"],
                              _distinct, groups).take_all()
    return {"sums": sums, "distinct": distinct, "splits": list(parts), "statements": statements is not None}


def _from_counts(counts: dict, value=None, whole: bool = True) -> dict:
    """`dataset_stats`' dict for all rows (`whole`) or those whose `by` is `value`."""
    sums = [r for r in counts["sums"] if whole or r["by"] == value]

    def total(field: str, split: str | None = None) -> int:
        return sum(int(r[f"{field}_sum"] or 0) for r in sums if split is None or r["split"] == split)

    def distinct(kind: str, field: str = "distinct") -> int:
        return sum(int(r[field]) for r in counts["distinct"]
                   if r["kind"] == kind and r["whole"] == whole and (whole or r["by"] == value))

    users, items = distinct("user_id"), distinct("item_id")
    sizes = {name: total("rows", name) for name in counts["splits"]}
    interactions = sum(sizes.values())
    stats: dict = {
        "users": users,
        "items": items,
        "interactions": interactions,
        **{name: sizes.get(name) for name in SPLIT_NAMES},
        "sparsity_pct": 100.0 * (1.0 - interactions / (users * items)) if users and items else None,
        "avg_words_per_review": total("words") / total("texts") if total("texts") else None,
        "time_first": None,
        "time_last": None,
    }
    firsts = [r["ts_min"] for r in sums if r["ts_min"] is not None]
    if firsts:
        stats["time_first"] = int(min(firsts))
        stats["time_last"] = int(max(r["ts_max"] for r in sums if r["ts_max"] is not None))
    if counts["statements"]:
        n = distinct("statement", "rows")

        def per(d: int) -> float | None:
            return n / d if d else None

        stats.update({"statements_total": n, "statements_unique": distinct("statement"),
                      "statements_per_interaction": per(interactions), "statements_per_user": per(users),
                      "statements_per_item": per(items)})
    return stats


def dataset_stats_ray(splits: dict, statements=None, groups: int = 1) -> dict:
    """`dataset_stats` of a dataset read as Ray Datasets (`runtime.read_dataset`): its splits
    {"train", "valid", "test"}, or {"all": reviews}, and optionally its statements, counted
    on the Ray workers (`groups`: how many groups the distinct counts spread keys over,
    `runtime.key_groups`). The same numbers as `dataset_stats` on the tables."""
    return _from_counts(_count(splits, statements, None, groups))


def dataset_stats_by(splits: dict, by: str, groups: int = 1) -> tuple[dict, dict]:
    """`dataset_stats_ray` (no statements), and the same per value of the column `by` for
    the values the train split has (all splits when there is none): {value: stats}, as
    `dataset_stats` of the splits filtered to that value gives them."""
    counts = _count(splits, None, by, groups)
    source = "train" if "train" in splits else None
    values = sorted({r["by"] for r in counts["sums"] if (source is None or r["split"] == source)
                     and r["by"] is not None and r["rows_sum"]})
    return _from_counts(counts), {v: _from_counts(counts, v, whole=False) for v in values}


def split_stats(path, name: str = "all") -> dict:
    """The study's `stats` job's numbers for a split folder, counted on Ray workers: Table
    II per category of its train split, then `name` for the whole split."""
    from rexeval.pipelines.core.inputs import table_rows
    from rexeval.pipelines.core.io import table_files
    from rexeval.pipelines.core.runtime import key_groups, read_dataset
    from rexeval.storage import location

    root = location(path)
    parts = {n: read_dataset(root / n, "reviews") for n in SPLIT_NAMES}
    groups = key_groups(table_rows([f for n in SPLIT_NAMES for f in table_files(root / n)]))
    whole, per = dataset_stats_by(parts, "category", groups)
    return {**per, name: whole}
