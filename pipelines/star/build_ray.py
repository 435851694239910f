"""`star build` on Ray Data: the rules of `build.build_star` (its module docstring), applied
by Ray workers to tables read as Ray Datasets, so that the job's driver holds counts and
block references, never a table.

The steps, each a keyed step (`runtime.map_key_groups`: one call gets every row of some
keys, and works on them with the whole-table code's pandas) or a sort:
1. each statement row's statement and text: grouped by statement_id with the clusters
   (without clusters, polarity + words on each block), then by cluster with the
   canonical texts;
2. grouped by review_id with the reviews: the row's user, item and time, or the error
   `unknown_review`; each review that keeps a statement becomes an interaction;
3. grouped by user: the split (`build.split_interactions`);
4. sorts number items, then interactions and users (user, time, row id), and the
   statements (`runtime.ranked`);
5. grouped by review_id: the triplets; by statement: the candidates;
6. Table 6's numbers from per-key counts; each table sorted and cut into shards that Ray
   tasks write.
Ties fall as on the whole table: rows carry their input order (`read_dataset`'s order
column), and an interaction its first statement row's, which the whole-table build's
stable sort falls back on.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.paraphrase.nodes import NO_SENTIMENT
from rexeval.pipelines.core.ids import dedup_key
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.runtime import (block_partials, block_refs, even_cuts, key_groups, map_key_groups,
                                            ranked)
from rexeval.pipelines.core.schema import error_rows
from rexeval.pipelines.star.build import (CANDIDATES, INTERACTIONS, SPLIT_CODES, STAGE, TRIPLETS, error_dicts,
                                          split_interactions, unclustered_ids)

ORDER = "_order"
"""A row's place in its input table (`runtime.read_dataset`'s order column)."""
KIND, FIRST, PHASE, EVALUATED = "_kind", "_first", "_phase", "_evaluated"
STATEMENT, CLUSTER, CANONICAL, REVIEW, INTERACTION = range(5)
INTER_ORDER = ["user_id", "timestamp", "source", "line", FIRST]
REVIEW_COLUMNS = ["user_id", "item_id", "timestamp", "source", "line"]

_S, _I = pa.string(), pa.int64()
WIDE = pa.schema([(KIND, pa.int8()), ("statement_id", _S), ("review_id", _S), ("statement", _S), ("sentiment", _S),
                  ("key", _S), ("text", _S), ("user_id", _S), ("item_id", _S), ("timestamp", _I), ("source", _S),
                  ("line", _I), (ORDER, _I), (FIRST, _I), ("error", _S), ("raw", _S), (PHASE, pa.int8()),
                  ("split", _S), (EVALUATED, pa.int8()), ("interaction", _I), ("user", _I), ("item", _I),
                  ("stmt", _I)])
"""Every row of every step in one schema (a step's datasets are unioned): a row is a
statement, cluster, canonical, review or interaction row (KIND); what it lacks is null."""


# -- rows in the one schema -----------------------------------------------------------------

def wide(table: pa.Table | pd.DataFrame, kind: int, rename: dict | None = None) -> pa.Table:
    """`table` (Arrow or pandas) as WIDE rows of `kind`, columns renamed by `rename`."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    if rename:
        table = table.rename_columns([rename.get(c, c) for c in table.column_names])
    n = table.num_rows
    cols = [pa.array(np.full(n, kind, np.int8)) if f.name == KIND
            else table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
            for f in WIDE]
    return pa.Table.from_arrays(cols, schema=WIDE)


def _of(group: pa.Table, kind: int) -> pd.DataFrame:
    """The rows of one kind, in input order."""
    rows = group.filter(pc.equal(group.column(KIND), kind)).to_pandas()
    return rows.sort_values(ORDER, kind="mergesort").reset_index(drop=True)


def _where(batch: pa.Table, kind: int | None = None, ok: bool | None = None) -> pa.Table:
    """The rows of `kind`, and those without (ok) or with an error."""
    mask = pa.array(np.ones(batch.num_rows, bool))
    if kind is not None:
        mask = pc.and_(mask, pc.equal(batch.column(KIND), kind))
    if ok is not None:
        mask = pc.and_(mask, pc.is_null(batch.column("error")) if ok else pc.is_valid(batch.column("error")))
    return batch.filter(mask)


def select(ds, kind: int | None = None, ok: bool | None = None):
    return ds.map_batches(_where, fn_kwargs={"kind": kind, "ok": ok}, batch_format="pyarrow")


def as_wide(ds, kind: int, rename: dict | None = None):
    return ds.map_batches(wide, fn_kwargs={"kind": kind, "rename": rename}, batch_format="pyarrow")


def _failed(rows: pd.DataFrame, error: str, raw: str, phase: int) -> pd.DataFrame:
    return rows.assign(error=error, raw=rows[raw], **{PHASE: phase})


# -- 1. each row's statement ------------------------------------------------------------------

def unclustered(batch: pa.Table) -> pa.Table:
    """Statement rows keyed by polarity + words; those without words are errors."""
    df = batch.to_pandas()
    df["key"] = unclustered_ids(df).astype(object) if len(df) else pd.Series(dtype=object)
    df["text"] = df["statement"]
    empty = np.array([dedup_key(t) == "" for t in df["statement"]], dtype=bool)
    failed = _failed(df[empty].drop(columns="key"), "empty_statement", "statement", 0)
    return pa.concat_tables([wide(df[~empty], STATEMENT), wide(failed, STATEMENT)])


def _clustered(group: pa.Table) -> pa.Table:
    """A group's statement rows with their cluster (the first row of its statement_id in
    the clusters table), or the error `no_cluster`."""
    st, cl = _of(group, STATEMENT), _of(group, CLUSTER)
    cmap = cl.drop_duplicates("statement_id")[["statement_id", "key"]]
    df = st.drop(columns="key").merge(cmap, on="statement_id", how="left")
    missing = df["key"].isna()
    df["text"] = df["statement"]
    return pa.concat_tables([wide(df[~missing], STATEMENT),
                             wide(_failed(df[missing].drop(columns="key"), "no_cluster", "statement", 0), STATEMENT)])


def _canonical(group: pa.Table) -> pa.Table:
    """A group's statement rows with their cluster's canonical text and sentiment."""
    st, canon = _of(group, STATEMENT), _of(group, CANONICAL)
    canon = canon[["key", "text", "sentiment"]].rename(columns={"text": "c_text", "sentiment": "c_sent"})
    df = st.merge(canon, on="key", how="left")
    df["text"] = df["c_text"].fillna(df["statement"])
    df["sentiment"] = df["c_sent"].where(df["c_sent"].notna(), df["sentiment"])
    return wide(df.drop(columns=["c_text", "c_sent"]), STATEMENT)


# -- 2. reviews and interactions --------------------------------------------------------------

def _with_reviews(group: pa.Table) -> pa.Table:
    """A group's statement rows with their review (its first row in the reviews table), or
    the error `unknown_review`; and one interaction row per review that keeps a statement,
    with its first statement row's input order (FIRST)."""
    st, rv = _of(group, STATEMENT), _of(group, REVIEW)
    rv = rv.drop_duplicates("review_id")[["review_id", *REVIEW_COLUMNS]]
    df = st.drop(columns=REVIEW_COLUMNS).merge(rv, on="review_id", how="left")
    unknown = df["user_id"].isna()
    ok = df[~unknown].copy()
    ok[FIRST] = ok.groupby("review_id")[ORDER].transform("min")
    ok[["timestamp", "line"]] = ok[["timestamp", "line"]].astype(np.int64)
    inter = ok.drop_duplicates("review_id")[["review_id", *REVIEW_COLUMNS, FIRST]]
    failed = _failed(df[unknown].drop(columns=REVIEW_COLUMNS), "unknown_review", "text", 1)
    return pa.concat_tables([wide(ok, STATEMENT), wide(failed, STATEMENT), wide(inter, INTERACTION)])


def _split_users(group: pa.Table, min_user_interactions: int) -> pa.Table:
    """A group of whole users' interactions with their split (and EVALUATED on each
    evaluated user's test interaction)."""
    inter = _of(group, INTERACTION).sort_values(INTER_ORDER, kind="mergesort").reset_index(drop=True)
    inter["split"] = split_interactions(inter, min_user_interactions) if len(inter) else []
    test = inter["split"] == "test"
    inter[EVALUATED] = (test & ~inter["user_id"].where(test).duplicated()).astype(np.int8)
    return wide(inter, INTERACTION)


# -- 5. triplets and candidates ---------------------------------------------------------------

def _triplets(group: pa.Table) -> pa.Table:
    """The distinct (interaction, user, item, statement) of a group's reviews."""
    st, inter = _of(group, STATEMENT), _of(group, INTERACTION)
    rows = st[["review_id", "stmt"]].merge(inter[["review_id", "interaction", "user", "item"]], on="review_id")
    trip = rows[["interaction", "user", "item", "stmt"]].drop_duplicates().astype(np.int64)
    return pa.Table.from_pandas(trip.rename(columns={"stmt": "statement"}), schema=TRIPLETS, preserve_index=False)


def _candidates(group: pa.Table) -> pa.Table:
    """A group's statements: text and sentiment of the row with the least statement_id
    (ties: the first in input order) and how many rows map to each."""
    df = _of(group, STATEMENT).sort_values(["stmt", "statement_id"], kind="mergesort")
    first = df.drop_duplicates("stmt")
    cand = pd.DataFrame({"statement": first["stmt"].to_numpy(np.int64), "cluster_id": first["key"].to_numpy(),
                         "text": first["text"].to_numpy(), "sentiment": first["sentiment"].to_numpy(),
                         "rows": df.groupby("stmt").size().loc[first["stmt"]].to_numpy(np.int64)})
    return pa.Table.from_pandas(cand, schema=CANDIDATES, preserve_index=False)


# -- 6. Table 6 -------------------------------------------------------------------------------

def _per_user(group: pa.Table) -> pa.Table:
    """Distinct statements of each of a group's users and of each of their interactions."""
    df = group.to_pandas()
    users = df[["user", "s"]].drop_duplicates().groupby("user").size().to_numpy(np.int64)
    inters = df.groupby("interaction").size().to_numpy(np.int64)
    return pa.table({"per": ["per_user"] * len(users) + ["per_interaction"] * len(inters),
                     "n": np.concatenate([users, inters])})


def _per_item(group: pa.Table) -> pa.Table:
    df = group.to_pandas()
    items = df[["item", "s"]].drop_duplicates().groupby("item").size().to_numpy(np.int64)
    return pa.table({"per": ["per_item"] * len(items), "n": items})


def _spread(block: pa.Table) -> pa.Table:
    """Count, sum, least and most of `n` per kind of count, in one block."""
    return block.group_by("per", use_threads=False).aggregate([("n", "count"), ("n", "sum"), ("n", "min"),
                                                               ("n", "max")])


def _sentiments(block: pa.Table) -> pa.Table:
    """Statements per sentiment (none: NO_SENTIMENT) in one block of distinct statements."""
    sent = pc.fill_null(block.column("sentiment"), NO_SENTIMENT)
    return pa.table({"sentiment": sent, "n": np.ones(block.num_rows, np.int64)}).group_by(
        "sentiment", use_threads=False).aggregate([("n", "sum")])


def _first_of_statement(group: pa.Table) -> pa.Table:
    """One row (its sentiment) per distinct statement of the group."""
    return pa.Table.from_pandas(group.to_pandas().drop_duplicates("s")[["s", "sentiment"]], preserve_index=False)


def statistics(trip, cand, counts: dict, groups: int) -> dict:
    """`build.statistics` of triplets (interaction, user, item, s: the statement) and distinct
    statements (with their sentiment), counted on the workers; the interactions' numbers
    come from `counts`."""
    per = map_key_groups(trip, "user", _per_user, groups).union(map_key_groups(trip, "item", _per_item, groups))
    spread: dict[str, list] = {}
    for row in block_partials(per, _spread):
        spread.setdefault(row["per"], []).append(row)
    sentiments: Counter = Counter()
    for row in block_partials(cand, _sentiments):
        sentiments[row["sentiment"]] += row["n_sum"]

    def min_mean_max(name: str) -> dict:
        rows = spread.get(name, [])
        n = sum(r["n_count"] for r in rows)
        if not n:
            return {"min": 0, "mean": 0.0, "max": 0}
        return {"min": int(min(r["n_min"] for r in rows)), "mean": sum(r["n_sum"] for r in rows) / n,
                "max": int(max(r["n_max"] for r in rows))}

    return {
        "users": counts["users"], "items": counts["items"], "interactions": counts["interactions"],
        **{s: counts[s] for s in SPLIT_CODES},
        "statements": sum(sentiments.values()),
        "by_sentiment": {str(k): int(v) for k, v in sorted(sentiments.items())},
        "per_interaction": min_mean_max("per_interaction"),
        "per_item": min_mean_max("per_item"),
        "per_user": min_mean_max("per_user"),
        "triplets": trip.count(),
    }


def _before_triplets(group: pa.Table) -> pa.Table:
    """Before clustering: the distinct (interaction, user, item, polarity + words) of a
    group's reviews, with the statement's sentiment."""
    st, inter = _of(group, STATEMENT), _of(group, INTERACTION)
    df = st[["review_id", "key", "sentiment"]].merge(inter[["review_id", "interaction", "user", "item"]],
                                                     on="review_id")
    df = df.rename(columns={"key": "s"}).drop_duplicates(["interaction", "user", "item", "s"])
    return pa.Table.from_pandas(df[["interaction", "user", "item", "s", "sentiment"]], preserve_index=False,
                                schema=_BEFORE)


_BEFORE = pa.schema([("interaction", _I), ("user", _I), ("item", _I), ("s", _S), ("sentiment", _S)])


def _split_counts(block: pa.Table) -> pa.Table:
    split = block.column("split")
    return pa.table({**{s: [pc.sum(pc.equal(split, s)).as_py() or 0] for s in SPLIT_CODES},
                     "users_evaluated": [pc.sum(block.column(EVALUATED)).as_py() or 0]})


# -- the build --------------------------------------------------------------------------------

def build(output: ShardedOutput, source: str, statements, reviews, clusters=None, canonical=None,
          min_user_interactions: int = 3, groups: int = 1) -> dict:
    """Build the benchmark of `statements` (stage rows, with ORDER), `reviews` (with ORDER),
    optionally `clusters` (statement_id, cluster_id, ORDER) and `canonical` (Ray Datasets)
    and write its tables' shards to `output`: {"counts", "after", "before" (Table 6's
    halves), "shards"}. Inputs that one keyed group would hold whole (`groups` 1) are
    built by one Ray task with the whole-table code (`build_in_task`); larger ones by the
    keyed steps. Either way the driver holds counts, never a table."""
    if groups == 1:
        return build_in_task(output, source, statements, reviews, clusters, canonical, min_user_interactions)
    statements = statements.materialize()  # read once: the benchmark and Table 6's "before"
    placed, joined = _placed(statements, reviews, clusters, canonical, groups)
    errors = select(placed, ok=False).union(select(joined, ok=False)).sort([PHASE, ORDER])
    inter, users, items = _interactions(select(joined, INTERACTION), min_user_interactions, groups)
    used, n_statements = ranked(select(joined, STATEMENT, ok=True), ["key"], dense="stmt")
    used = used.materialize()
    trip = map_key_groups(used.union(inter), "review_id", _triplets, groups).sort(["interaction", "statement"])
    trip = trip.materialize()
    cand = map_key_groups(used, "key", _candidates, groups).sort("statement").materialize()
    n_used, n_trip = used.count(), trip.count()
    counts = {"statement_rows": statements.count(), "statement_rows_used": n_used,
              "statement_rows_merged": n_used - n_trip, "error_rows": errors.count(),
              "interactions": inter.count(), "users": users, "items": items, "statements": n_statements,
              "triplets": n_trip, **_split_totals(inter)}
    after = statistics(trip.rename_columns({"statement": "s"}), cand, counts, groups)
    before = before_clustering(statements, inter, counts, groups)
    tables = {"interactions": inter, "triplets": trip, "candidates": cand, "errors": errors}
    return {"counts": counts, "after": after, "before": before, "shards": write_tables(output, tables, source)}


def _placed(statements, reviews, clusters, canonical, groups: int):
    """Steps 1 and 2: the statement rows with their statement and text (errors flagged),
    and those rows joined with their reviews plus one interaction row per review."""
    if clusters is None:
        placed = statements.map_batches(unclustered, batch_format="pyarrow")
    else:
        both = as_wide(statements, STATEMENT).union(as_wide(clusters, CLUSTER, {"cluster_id": "key"}))
        placed = map_key_groups(both, "statement_id", _clustered, groups)
    placed = placed.materialize()
    rows = select(placed, ok=True)
    if canonical is not None:
        canon = as_wide(canonical, CANONICAL, {"cluster_id": "key", "statement": "text"})
        rows = map_key_groups(rows.union(canon), "key", _canonical, groups)
    joined = map_key_groups(rows.union(as_wide(reviews, REVIEW)), "review_id", _with_reviews, groups)
    return placed, joined.materialize()


def _interactions(inter, min_user_interactions: int, groups: int):
    """Steps 3 and 4: the interactions split and numbered, in interaction order, and how
    many users and items there are."""
    inter = map_key_groups(inter, "user_id", _split_users, groups, min_user_interactions=min_user_interactions)
    inter, items = ranked(inter, ["item_id"], dense="item")
    inter, users = ranked(inter, INTER_ORDER, position="interaction", dense="user")
    return inter.materialize(), users, items


def _split_totals(inter) -> dict[str, int]:
    """Interactions per split and evaluated users, summed over blocks."""
    totals = {k: 0 for k in [*SPLIT_CODES, "users_evaluated"]}
    for row in block_partials(inter, _split_counts):
        for k in totals:
            totals[k] += row[k]
    return totals


def _whole(output: ShardedOutput, source: str, min_user_interactions: int, sizes: list, *blocks) -> dict:
    """`build_in_task`'s task: the blocks of each input (`sizes` of them, None: no such
    input), in input order, built and written as shard 0."""
    from rexeval.pipelines.star.build import before_clustering_stats, build_star

    it = iter(blocks)
    st, rv, cl, cn = (None if n is None else pa.concat_tables([next(it) for _ in range(n)]) for n in sizes)
    st, rv, cl = (None if t is None else t.sort_by(ORDER) for t in (st, rv, cl))
    built = build_star(st, rv, cl, cn, min_user_interactions, source=source)
    output.write_shard(0, {**built.tables, "errors": built.errors}, built.counts)
    return {"counts": built.counts, "after": built.stats["after"], "before": before_clustering_stats(st, built),
            "shards": 1}


def build_in_task(output: ShardedOutput, source: str, statements, reviews, clusters, canonical,
                  min_user_interactions: int) -> dict:
    """`build`, with `build.build_star` in one Ray task that gets the inputs' blocks."""
    import ray

    refs = [None if ds is None else ds.to_arrow_refs() for ds in (statements, reviews, clusters, canonical)]
    task = ray.remote(_whole).options(num_cpus=1)
    return ray.get(task.remote(output, source, min_user_interactions, [None if r is None else len(r) for r in refs],
                               *(b for r in refs if r is not None for b in r)))


def before_clustering(statements, inter, counts: dict, groups: int) -> dict:
    """`build.before_clustering_stats` on the workers: the same interactions, statements
    identified by polarity + words."""
    keyed = select(statements.map_batches(unclustered, batch_format="pyarrow"), ok=True)
    trip = map_key_groups(keyed.union(inter), "review_id", _before_triplets, groups).materialize()
    distinct = map_key_groups(trip.select_columns(["s", "sentiment"]), "s", _first_of_statement, groups)
    return statistics(trip, distinct, counts, groups)


# -- writing ----------------------------------------------------------------------------------

def final_table(name: str, parts: list[pa.Table], source: str) -> pa.Table:
    """One shard of a benchmark table from its slices of the sorted blocks."""
    if name == "errors":
        rows = pa.concat_tables([WIDE.empty_table(), *parts]).select(["error", "statement_id", "raw"])
        errors = [e for kind, sid, raw in zip(*(rows.column(c).to_pylist() for c in rows.column_names))
                  for e in error_dicts(kind, [sid], [raw], source)]
        return error_rows(STAGE, errors)
    schema = {"interactions": INTERACTIONS, "triplets": TRIPLETS, "candidates": CANDIDATES}[name]
    table = pa.concat_tables([schema.empty_table(), *(p.select(schema.names).cast(schema) for p in parts)])
    return table.combine_chunks()


def _write_shard(output: ShardedOutput, shard: int, source: str, plan: list[tuple[str, list]], *blocks) -> None:
    """Shard `shard` of every table (a Ray task): `plan` names each table's slices of the
    blocks, which come in the same order."""
    it = iter(blocks)
    tables = {name: final_table(name, [next(it).slice(a, b - a) for _, a, b in cut], source) for name, cut in plan}
    output.write_shard(shard, tables, {name: t.num_rows for name, t in tables.items()})


def write_tables(output: ShardedOutput, tables: dict, source: str) -> int:
    """Write the sorted tables as shards of equal size (`runtime.key_groups` of the largest
    table: one shard up to 200,000 rows), each by a Ray task; returns the shard count."""
    import ray

    found = {name: block_refs(ds) for name, ds in tables.items()}
    shards = key_groups(max(sum(e[0] for e in ends) for _, ends in found.values()))
    cuts = {name: even_cuts([e[0] for e in ends], shards) for name, (_, ends) in found.items()}
    write = ray.remote(_write_shard).options(num_cpus=1)
    tasks = []
    for k in range(shards):
        plan = [(name, cuts[name][k]) for name in tables]
        blocks = [found[name][0][b] for name, cut in plan for b, _, _ in cut]
        tasks.append(write.remote(output, k, source, plan, *blocks))
    ray.get(tasks)
    return shards
