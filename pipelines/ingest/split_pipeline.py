"""The split job: reviews -> optional k-core -> train/valid/test, written with a manifest.

Input and output may be local paths or URIs (read and written through the storage module).
The job runs on Ray Data, so that its driver (on a cluster, wherever the study placed it)
holds counts and block references, never the table:

1. read: one Ray task per part, validated (`runtime.read_dataset`), before the output is
   opened: --overwrite removes an earlier split only once this one can be made;
2. k-core: rounds that count each user's and each item's rows on the workers
   (`runtime.map_key_groups`) and drop those under the thresholds, until none is;
3. the split: `split.split_codes` on groups that hold whole users, then
   `split.drop_cold_items` on groups that hold whole items: each row gets its split or
   the reason it is dropped, exactly as `temporal_split` / `leave_last_two` decide on the
   whole table (ties in ORDER_KEY are settled by input order, as there);
4. counts from every block; the kept rows sorted by ORDER_KEY across the cluster (Ray
   Data's sort), then cut into shards of equal size (`shard_cuts`), each written by a
   Ray task, so train/, valid/ and test/ read in part order are the rows in ORDER_KEY
   order, in the same files on every run.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.inputs import reviews_input, table_rows
from rexeval.pipelines.core.io import DONE_DIR, ShardedOutput, remove_entries, table_files
from rexeval.pipelines.core.runtime import block_partials, even_cuts, key_groups, map_key_groups, read_dataset
from rexeval.pipelines.core.schema import REVIEWS, SPLIT_NAMES, validate_table
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.ingest.config import SPLIT_OUTPUTS, SplitConfig
from rexeval.pipelines.ingest.split import (CODE, CODE_COUNTS, DROPPED_MIN, FIRST, ORDER_KEY, drop_cold_items,
                                            key_counts, split_codes)

ORDER = "_input_order"
"""The rows' input order (part, row): settles ties in ORDER_KEY as the whole-table split does."""
_COUNTED = {"user_id": "_n_user", "item_id": "_n_item"}


def run_split(cfg: SplitConfig, overwrite: bool = False,
              progress: Callable[[str], None] = print) -> dict:
    t0 = time.time()
    source = reviews_input(cfg.input)  # before the output folder is made
    files = table_files(source)
    # Read (and so validated) before the output is opened: --overwrite removes an earlier
    # split only once this one can be made. (The settings' hash reads the files anyway.)
    reviews = read_dataset(files, "reviews", order=ORDER, rename=cfg.columns).materialize()
    tables = [SPLIT_OUTPUTS.train, SPLIT_OUTPUTS.valid, SPLIT_OUTPUTS.test]
    config = cfg.output_config()
    job = ShardedJob(ShardedOutput(cfg.out, "split", config, tables), 1, overwrite=overwrite, progress=progress)
    if (manifest := job.finished("split")) is not None:
        return manifest
    groups = key_groups(table_rows(files))
    n_in = reviews.count()
    progress(f"split: {n_in:,} reviews, method {cfg.method}")
    counts: dict[str, int] = {"reviews_in": n_in}
    if cfg.kcore_user > 1 or cfg.kcore_item > 1:
        reviews, rounds = kcore_dataset(reviews, cfg.kcore_user, cfg.kcore_item, groups)
        counts["dropped_kcore"] = n_in - reviews.count()
        progress(f"  k-core ({cfg.kcore_user}, {cfg.kcore_item}): {rounds} round(s), "
                 f"{counts['dropped_kcore']:,} rows dropped")
    coded = code_rows(reviews, cfg, groups).materialize()
    counts.update(_code_counts(coded))
    warnings = []
    if not sum(counts[n] for n in SPLIT_NAMES):
        warnings.append(f"the split kept none of the {counts['reviews_in']:,} reviews: every user has fewer "
                        f"than the reviews the settings need (min_interactions, k-core); see the manifest's "
                        "counts for what dropped them")
        progress(f"  warning: {warnings[-1]}")
    blocks = coded.map_batches(_kept, batch_format="pyarrow").sort([*ORDER_KEY, ORDER]).to_arrow_refs()
    cuts = shard_cuts(_block_rows(blocks), sum(counts[n] for n in SPLIT_NAMES))
    # What an interrupted run left is written anew, whole.
    remove_entries(job.output.root, [*tables, DONE_DIR])
    job = ShardedJob(ShardedOutput(cfg.out, "split", config, tables), len(cuts), progress=progress)
    _write_shards(job.output, blocks, cuts)
    manifest = job.finish(counts=counts, **({"warnings": warnings} if warnings else {}))
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest


# -- k-core -------------------------------------------------------------------------------


def _with_count(group: pa.Table, key: str) -> pa.Table:
    return group.append_column(_COUNTED[key], pa.array(key_counts(group, key)))


def _keep_cores(batch: pa.Table, k_user: int, k_item: int) -> pa.Table:
    keep = np.ones(batch.num_rows, dtype=bool)
    for key, k in (("user_id", k_user), ("item_id", k_item)):
        if k > 1:
            keep &= batch.column(_COUNTED[key]).to_numpy() >= k
    return batch.filter(pa.array(keep)).drop_columns([c for c in _COUNTED.values() if c in batch.column_names])


def kcore_dataset(ds, k_user: int, k_item: int, groups: int):
    """`split.kcore` on a Ray Dataset: each round counts the rows of every user and item
    on the workers and drops, at once, those of the users and items under their threshold;
    rounds go on until one drops nothing. Returns the kept rows (materialised) and the
    rounds that dropped rows."""
    rounds, rows = 0, ds.count()
    while rows:
        counted = ds
        for key, k in (("user_id", k_user), ("item_id", k_item)):
            if k > 1:
                counted = map_key_groups(counted, key, _with_count, groups, key=key)
        kept = counted.map_batches(_keep_cores, fn_kwargs={"k_user": k_user, "k_item": k_item},
                                   batch_format="pyarrow").materialize()
        if kept.count() == rows:
            break
        rounds, ds, rows = rounds + 1, kept, kept.count()
        if k_user <= 1 or k_item <= 1:  # one key alone: what stays keeps every row it had
            break
    return ds, rounds


# -- the split ----------------------------------------------------------------------------


def _users_coded(group: pa.Table, method: str, min_interactions: int, train: float, valid: float) -> pa.Table:
    # In input order first, so that ties in ORDER_KEY fall as on the whole table.
    return split_codes(group.sort_by(ORDER), method, min_interactions, train, valid)


def code_rows(ds, cfg: SplitConfig, groups: int):
    """Every row of `ds` with its split code (CODE) and user-first flag (FIRST)."""
    temporal = cfg.method == "temporal"
    least = cfg.min_interactions if cfg.min_interactions is not None else (5 if temporal else 3)
    cold = cfg.drop_cold_start_items if cfg.drop_cold_start_items is not None else temporal
    coded = map_key_groups(ds, "user_id", _users_coded, groups, method=cfg.method, min_interactions=least,
                           train=cfg.train, valid=cfg.valid)
    return map_key_groups(coded, "item_id", drop_cold_items, groups) if cold else coded


def _block_codes(block: pa.Table) -> pa.Table:
    """Rows and users (their first rows) of each code in one block."""
    code = block.column(CODE).to_numpy() if block.num_rows else np.zeros(0, np.int8)
    first = block.column(FIRST).to_numpy() if block.num_rows else np.zeros(0, np.int8)
    size = len(CODE_COUNTS)
    return pa.table({"code": np.arange(size, dtype=np.int64),
                     "rows": np.bincount(code, minlength=size).astype(np.int64),
                     "users": np.bincount(code, weights=first, minlength=size).astype(np.int64)})


def _kept(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.less(batch.column(CODE), DROPPED_MIN))


def _code_counts(coded) -> dict[str, int]:
    """The split's counts (`split.COUNT_KEYS` but input, in that order) from every block."""
    rows = np.zeros(len(CODE_COUNTS), np.int64)
    users = np.zeros(len(CODE_COUNTS), np.int64)
    for part in block_partials(coded, _block_codes):
        rows[part["code"]] += part["rows"]
        users[part["code"]] += part["users"]
    counts = {name: int(n) for name, n in zip(CODE_COUNTS, rows)}
    counts["users_kept"] = int(users.sum() - users[DROPPED_MIN])
    counts["users_dropped_min_interactions"] = int(users[DROPPED_MIN])
    return counts


# -- writing ------------------------------------------------------------------------------


def shard_cuts(sizes: list[int], total: int) -> list[list[tuple[int, int, int]]]:
    """Per shard, the (block, start, stop) slices of the sorted blocks (of `sizes` rows,
    `total` in all) that make it: `runtime.key_groups(total)` shards of equal size, cut by
    `runtime.even_cuts`, so a re-run, on one node or many, writes the same files."""
    return even_cuts(sizes, key_groups(total), total)


def _num_rows(block: pa.Table) -> int:
    return block.num_rows


def _block_rows(blocks: list) -> list[int]:
    """Rows of each block, counted where the block is (a small task each)."""
    import ray

    rows = ray.remote(_num_rows).options(num_cpus=0.1)
    return ray.get([rows.remote(b) for b in blocks])


def _write_shard(output: ShardedOutput, shard: int, cut: list[tuple[int, int, int]], *blocks: pa.Table) -> None:
    """Shard `shard` of train/, valid/ and test/ from its slices of the sorted blocks (a
    Ray task; `blocks` are the blocks `cut` names, in its order)."""
    empty = REVIEWS.empty_table().append_column(CODE, pa.array([], pa.int8()))
    rows = pa.concat_tables([empty, *(b.select(empty.column_names).slice(start, stop - start)
                                      for b, (_, start, stop) in zip(blocks, cut))], promote_options="permissive")
    tables = {}
    for code, name in enumerate(SPLIT_NAMES):
        part = rows.filter(pc.equal(rows.column(CODE), code)).select(REVIEWS.names)
        tables[name] = validate_table(part, REVIEWS, source=f"split shard {shard}")
    output.write_shard(shard, tables, {name: t.num_rows for name, t in tables.items()})


def _write_shards(output: ShardedOutput, blocks: list, cuts: list) -> None:
    """A Ray task per shard (the driver holds block references only). Not pinned to this
    node: a local output folder is one every node mounts (`pipelines/core/reach.py`)."""
    import ray

    write = ray.remote(_write_shard).options(num_cpus=1)
    ray.get([write.remote(output, k, cut, *(blocks[b] for b, _, _ in cut)) for k, cut in enumerate(cuts)])
