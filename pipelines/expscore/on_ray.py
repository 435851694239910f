"""ExpScore on Ray workers (`ray: always`, or `auto` at `ray_min_rows`): the driver holds
settings, counts, error rows and the report, never a table.

1. a Ray task reads and checks the explanation inputs (`inputs.load_examples`) and leaves
   the clean rows in the object store;
2. the reviews are read as a Ray Dataset: WI's word counts summed per word by a keyed step
   (`runtime.map_key_groups`), and each item's first reviews joined onto its rows by
   another (as `inputs.attach_reviews` does on the whole table); with a reviews column,
   the task of step 1 does that part;
3. the factors on a Ray Data actor pool (`pipeline.FactorStage`), with the rows' own
   columns carried beside them;
4. one Ray task splits, trains or applies the heads and writes the outputs: what the
   in-process run does with the same rows and factors (`pipeline.finish_train`,
   `finish_score`).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.metrics.expscore_factors import term_frequencies, words
from rexeval.storage import location
from rexeval.pipelines.expscore.config import ExpScoreInputs

ORDER = "_order"
"""A review's place in its table (`runtime.read_dataset`'s order column)."""
ROW, REVIEW = 0, 1
META = ["example_id", "source", "line", "item_id", "rating"]
"""What the heads' task needs of each row besides its factors."""
_S, _TEXTS = pa.string(), pa.list_(pa.string())
ROWS = pa.schema([("row", pa.int64()), ("example_id", _S), ("source", _S), ("line", pa.int64()),
                  ("explanation", _S), ("item_id", _S), ("rating", pa.float64()), ("features", _TEXTS),
                  ("item_reviews", _TEXTS)])
WIDE = pa.schema([("_kind", pa.int8()), *ROWS, ("review_id", _S), ("text", _S), (ORDER, pa.int64()),
                  ("missing", pa.bool_())])
"""Explanation rows and review rows in one schema, for the join by item."""


# -- how many rows -------------------------------------------------------------------------

def _rows_in(path) -> int:
    """Rows of a Parquet table from its footers, or lines of a text file (gunzipped when
    named .gz; read in chunks, never held); 0 for what is not there (the job's read names
    it)."""
    from rexeval.pipelines.core.inputs import table_rows
    from rexeval.pipelines.core.io import table_files

    loc = location(path)
    if not loc.exists():
        return 0
    if loc.is_dir() or loc.suffix == ".parquet":
        return table_rows(table_files(loc)) or 0
    lines = 0
    with loc.open_input() as fh:
        stream = pa.CompressedInputStream(fh, "gzip") if loc.name.lower().endswith(".gz") else fh
        try:
            while chunk := stream.read(1 << 24):
                lines += chunk.count(b"\n")
        except (OSError, pa.ArrowInvalid):  # not gzip after all: the job's read names it
            pass
    return lines


def review_table(path):
    """The reviews table of a REVIEWS file or folder, or of an ingest folder."""
    loc = location(path)
    return loc / "reviews" if (loc / "reviews").is_dir() else loc


def input_rows(cfg: ExpScoreInputs) -> int:
    """The larger of the explanations' rows and the reviews' rows."""
    explanations = sum(_rows_in(p) for p in cfg.inputs)
    return max(explanations, _rows_in(review_table(cfg.reviews)) if cfg.reviews else 0)


# -- 1. the explanation rows -----------------------------------------------------------------

def _load(cfg: ExpScoreInputs, rating: str, scale: tuple[float, float], want_tf: bool):
    """(the clean rows as a table, the rest: error rows, counts, and with a reviews
    column the rows' reviews attached and WI's word counts). A Ray task."""
    from rexeval.pipelines.expscore.inputs import attach_reviews, load_examples

    rows, errors, has_features = load_examples(cfg, rating, scale)
    info = {"n_in": len(rows) + len(errors), "has_features": has_features, "tf": None}
    if cfg.reviews_column:
        rows, more, corpus, _ = attach_reviews(rows, cfg)
        errors += more
        info["tf"] = dict(term_frequencies(corpus)) if want_tf else None
    table = pa.Table.from_pylist([{**r, "row": i} for i, r in enumerate(rows)], schema=ROWS)
    return table, {**info, "errors": errors}


def _cause(exc: Exception) -> Exception:
    """What a Ray task raised (a bad input's ValueError), without Ray's wrapping."""
    return getattr(exc, "cause", None) or exc


# -- 2. the reviews ---------------------------------------------------------------------------

def _block_words(block: pa.Table) -> pa.Table:
    """Word counts of a block of reviews and where each word first appears (review, place)."""
    counts: dict[str, int] = {}
    first: dict[str, tuple[int, int]] = {}
    block = block.sort_by(ORDER)
    for order, text in zip(block.column(ORDER).to_pylist(), block.column("text").to_pylist()):
        for place, word in enumerate(words(text) if text else ()):
            if word not in counts:
                counts[word], first[word] = 0, (order, place)
            counts[word] += 1
    return pa.table({"word": pa.array(list(counts), _S), "n": pa.array(list(counts.values()), pa.int64()),
                     "first": pa.array([first[w][0] for w in counts], pa.int64()),
                     "place": pa.array([first[w][1] for w in counts], pa.int64())})


def _sum_words(group: pa.Table) -> pa.Table:
    df = group.to_pandas().sort_values(["first", "place"], kind="mergesort")
    totals = df.groupby("word", sort=False)["n"].sum()
    firsts = df.drop_duplicates("word").set_index("word")
    return pa.table({"word": pa.array(list(totals.index), _S), "n": totals.to_numpy(np.int64),
                     "first": firsts.loc[totals.index, "first"].to_numpy(np.int64),
                     "place": firsts.loc[totals.index, "place"].to_numpy(np.int64)})


def word_counts(reviews, groups: int) -> dict[str, int]:
    """`term_frequencies` of the reviews' texts, summed on the workers; the words in the
    order they first appear, as the whole-table count lists them."""
    from rexeval.pipelines.core.runtime import map_key_groups

    per_block = reviews.map_batches(_block_words, batch_size=None, batch_format="pyarrow")
    rows = map_key_groups(per_block, "word", _sum_words, groups).take_all()
    rows.sort(key=lambda r: (r["first"], r["place"]))
    return {r["word"]: int(r["n"]) for r in rows}


def _wide(batch: pa.Table, kind: int) -> pa.Table:
    n = batch.num_rows
    cols = [pa.array(np.full(n, kind, np.int8)) if f.name == "_kind"
            else batch.column(f.name).cast(f.type) if f.name in batch.column_names else pa.nulls(n, f.type)
            for f in WIDE]
    return pa.Table.from_arrays(cols, schema=WIDE)


def _with_reviews(group: pa.Table, cap: int) -> pa.Table:
    """A group's explanation rows with the first `cap` non-blank reviews of their item in
    review_id order (ties: table order), or `missing` when it has none."""
    kind = group.column("_kind")
    rv = group.filter(pc.equal(kind, REVIEW)).select(["item_id", "review_id", "text", ORDER]).to_pandas()
    rv = rv[rv["text"].str.strip().astype(bool)].sort_values(["item_id", "review_id", ORDER], kind="stable")
    texts = {item: grp["text"].tolist()[:cap] for item, grp in rv.groupby("item_id", sort=True)}
    rows = group.filter(pc.equal(kind, ROW))
    found = [texts.get(item) for item in rows.column("item_id").to_pylist()]
    rows = rows.set_column(WIDE.get_field_index("item_reviews"), "item_reviews", pa.array(found, _TEXTS))
    return rows.set_column(WIDE.get_field_index("missing"), "missing", pa.array([not f for f in found]))


def _no_reviews_errors(missing: list[dict], cfg: ExpScoreInputs) -> list[dict]:
    from rexeval.pipelines.expscore.inputs import error_row

    return [error_row(r["source"], r["line"], r["example_id"], cfg.item_column, "no_reviews",
                      f"item {r['item_id']!r} has no reviews in {cfg.reviews} (relevance needs them)")
            for r in sorted(missing, key=lambda r: r["row"])]


def _where_missing(batch: pa.Table, missing: bool) -> pa.Table:
    return batch.filter(pc.equal(batch.column("missing"), missing))


def load_on_ray(cfg: ExpScoreInputs, rating: str, scale: tuple[float, float], want_tf: bool):
    """`pipeline.load_inputs` on Ray: steps 1 and 2 (the module docstring)."""
    from rexeval.pipelines.core.inputs import table_rows
    from rexeval.pipelines.core.runtime import reads_here
    from rexeval.pipelines.core.io import table_files
    from rexeval.pipelines.core.runtime import init_ray, key_groups, map_key_groups, ranked, read_dataset
    from rexeval.pipelines.expscore.inputs import Loaded

    ray = init_ray()
    load = ray.remote(_load).options(num_returns=2, num_cpus=1, **reads_here(cfg.inputs))
    table, info = load.remote(cfg, rating, scale, want_tf)
    try:
        info = ray.get(info)
    except ray.exceptions.RayTaskError as exc:
        raise _cause(exc) from None
    rows, errors, tf = ray.data.from_arrow_refs([table]), info["errors"], info["tf"]
    if not cfg.reviews_column:
        source = review_table(cfg.reviews)
        reviews = read_dataset(source, "reviews", columns=["review_id", "item_id", "text"], order=ORDER,
                               rename=cfg.columns or None)
        groups = key_groups(sum(_rows_in(p) for p in cfg.inputs) + (table_rows(table_files(source)) or 0))
        tf = word_counts(reviews, groups) if want_tf else None
        both = rows.map_batches(_wide, fn_kwargs={"kind": ROW}, batch_format="pyarrow").union(
            reviews.map_batches(_wide, fn_kwargs={"kind": REVIEW}, batch_format="pyarrow"))
        joined = map_key_groups(both, "item_id", _with_reviews, groups, cap=cfg.max_reviews_per_item).materialize()
        missing = joined.map_batches(_where_missing, fn_kwargs={"missing": True}, batch_format="pyarrow")
        errors = errors + _no_reviews_errors(missing.select_columns(["row", *META]).take_all(), cfg)
        kept = joined.map_batches(_where_missing, fn_kwargs={"missing": False}, batch_format="pyarrow")
        rows, _ = ranked(kept.select_columns(ROWS.names), ["row"], position="row")  # 0.. in input order
    rows = rows.materialize()
    return Loaded(errors, info["n_in"], rows.count(), info["has_features"], tf, dataset=rows)


# -- 3 and 4. the factors and the heads -------------------------------------------------------

def _finish(finish: Callable, kwargs: dict, factors: list[str], *blocks: pa.Table) -> dict:
    """The heads' task: the rows' factors (and baselines) in input order, then `finish`."""
    if not blocks:
        return finish(rows=[], values=pd.DataFrame(columns=factors, dtype=np.float64), **kwargs)
    table = pa.concat_tables(blocks).sort_by("row")
    return finish(rows=table.select(META).to_pylist(), values=table.select(factors).to_pandas(), **kwargs)


def finish_on_ray(rows, stage, finish: Callable, kwargs: dict, progress: Callable[[str], None]) -> dict:
    """The factors of `rows` (a Ray Dataset) on an actor pool of `stage`, then `finish` in
    one Ray task that gets their blocks; returns its report."""
    import ray

    from rexeval.pipelines.core.runtime import map_stage, worker_failures

    stage.carry = META
    progress(f"factors: {rows.count():,} rows on Ray Data (batches of {stage.batch_size})")
    columns = list(dict.fromkeys(["row", "explanation", "item_id", "features", "item_reviews", *META]))
    ds = map_stage(rows.select_columns(columns), stage)
    with worker_failures(stage):
        blocks = ds.to_arrow_refs()
    task = ray.remote(_finish).options(num_cpus=1)
    try:
        return ray.get(task.remote(finish, kwargs, stage.columns, *blocks))
    except ray.exceptions.RayTaskError as exc:
        raise _cause(exc) from None
