"""`alert_curate` on Ray Data (the rules are in `rules.py`).

The driver holds counts and, per category, the sample's cut (a key and a user id), never
the table:

1. read: one Ray task per part of the reviews table (`runtime.read_dataset`);
2. the row rules on each block (`rules.row_codes`);
3. the user rules on groups that hold whole users (`runtime.map_key_groups`,
   `rules.user_codes`);
4. the sample: each block's smallest keys per category (`runtime.block_partials`,
   at most `per_category` + 1 rows per category and block), merged by the driver into
   one cut per category, applied to every block (`rules.apply_sample`);
5. counts from every block (`rules.block_counts`): rows per reason add up to the rows
   read, users per status to the users read;
6. the kept rows, at most `per_category` x categories x `max_purchases` of them (60,000
   with the paper's values), written by one Ray task as `reviews/part-00000.parquet`,
   sorted by (user_id, timestamp, review_id).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.io import write_bytes_atomic
from rexeval.storage import location
from rexeval.pipelines.curate import rules
from rexeval.pipelines.curate.config import CURATE_OUTPUTS, CurateConfig

PART = "part-00000.parquet"


def run_curate(cfg: CurateConfig, progress: Callable[[str], None] = print) -> dict:
    from rexeval.pipelines.core.inputs import reviews_input, table_rows
    from rexeval.pipelines.core.io import table_files
    from rexeval.pipelines.core.runtime import block_partials, key_groups, map_key_groups, read_dataset
    from rexeval.pipelines.core.study_registry import write_manifest

    t0 = time.time()
    files = table_files(reviews_input(cfg.input))
    reviews = read_dataset(files, "reviews", rename=cfg.columns or None)
    coded = reviews.map_batches(rules.row_codes, fn_kwargs={"rating": cfg.rating,
                                                            "min_title_letters": cfg.min_title_letters},
                                batch_format="pyarrow")
    coded = map_key_groups(coded, "user_id", rules.user_codes, key_groups(table_rows(files)),
                           min_purchases=cfg.min_purchases, max_purchases=cfg.max_purchases,
                           seed=cfg.seed).materialize()
    cut: dict = {}
    if cfg.per_category:
        parts = block_partials(coded, rules.smallest_per_category, cap=cfg.per_category + 1)
        table = pa.Table.from_pylist(parts, schema=pa.schema([(rules.UCAT, pa.string()), (rules.UKEY, pa.uint64()),
                                                              ("user_id", pa.string())]))
        cut = rules.thresholds(table, cfg.per_category)
    final = coded.map_batches(rules.apply_sample, fn_kwargs={"cut": cut}, batch_format="pyarrow").materialize()
    counts, categories = combine_counts(block_partials(final, rules.block_counts))
    out = location(cfg.out)
    _write_kept(final, out / CURATE_OUTPUTS.reviews / PART)
    write_bytes_atomic(out / CURATE_OUTPUTS.categories, categories_csv(categories).encode())
    table_md = report_table(counts, categories)
    write_bytes_atomic(out / CURATE_OUTPUTS.table, table_md.encode())
    progress(f"alert_curate: {counts['rows_in']:,} purchases -> {counts['rows_kept']:,} kept "
             f"({counts['users_sampled']:,} users in {len(categories)} categories)\n{table_md}")
    warnings = []
    if not counts["rows_kept"]:
        warnings.append("no purchase passed the rules: see the counts for what dropped them")
        progress(f"  warning: {warnings[-1]}")
    return write_manifest(cfg, "alert_curate", counts, categories=categories,
                          elapsed_s=round(time.time() - t0, 2), **({"warnings": warnings} if warnings else {}))


def combine_counts(partials: list[dict]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """The blocks' `rules.block_counts` rows summed: counts (rows_in, rows_<reason> for
    every reason, users_in, users_<status> for every status) and, per category, its
    qualifying_users, sampled_users and kept_rows."""
    counts = {f"rows_{r}": 0 for r in rules.REASONS} | {f"users_{s}": 0 for s in rules.USER_STATUS}
    categories: dict[str, dict[str, int]] = {}
    for row in partials:
        if row["kind"] == "category":
            mine = categories.setdefault(row["category"], {"qualifying_users": 0, "sampled_users": 0, "kept_rows": 0})
            mine[row["name"]] += int(row["n"])
        else:
            counts[f"{row['kind']}_{row['name']}"] += int(row["n"])
    counts["rows_in"] = sum(counts[f"rows_{r}"] for r in rules.REASONS)
    counts["users_in"] = sum(counts[f"users_{s}"] for s in rules.USER_STATUS)
    return counts, dict(sorted(categories.items()))


def categories_csv(categories: dict[str, dict[str, int]]) -> str:
    lines = ["category,qualifying_users,sampled_users,kept_purchases"]
    lines += [f"{c},{v['qualifying_users']},{v['sampled_users']},{v['kept_rows']}" for c, v in categories.items()]
    return "\n".join(lines) + "\n"


def report_table(counts: dict[str, int], categories: dict[str, dict[str, int]]) -> str:
    """What each rule dropped (rows and users) and the kept users and purchases per category."""
    lines = ["| Purchases | Rows |", "|---|---:|", f"| read | {counts['rows_in']:,} |"]
    lines += [f"| {r.replace('_', ' ')} | {counts[f'rows_{r}']:,} |" for r in rules.REASONS]
    lines += ["", "| Users | Users |", "|---|---:|", f"| read | {counts['users_in']:,} |"]
    lines += [f"| {s.replace('_', ' ')} | {counts[f'users_{s}']:,} |" for s in rules.USER_STATUS]
    lines += ["", "| Category | Qualifying users | Sampled users | Purchases |", "|---|---:|---:|---:|"]
    lines += [f"| {c} | {v['qualifying_users']:,} | {v['sampled_users']:,} | {v['kept_rows']:,} |"
              for c, v in categories.items()]
    return "\n".join(lines) + "\n"


def _kept_rows(batch: pa.Table) -> pa.Table:
    from rexeval.pipelines.core.schema import REVIEWS

    return batch.filter(pc.equal(batch.column(rules.CODE), rules.KEPT)).select(REVIEWS.names)


def _write_part(path, *blocks: pa.Table) -> int:
    """The kept rows of every block, sorted, validated and written as one part (a Ray task)."""
    from rexeval.pipelines.core.io import write_parquet_atomic
    from rexeval.pipelines.core.schema import REVIEWS, validate_table

    rows = pa.concat_tables([REVIEWS.empty_table(), *(validate_table(b, REVIEWS) for b in blocks)])
    rows = rows.sort_by([("user_id", "ascending"), ("timestamp", "ascending"), ("review_id", "ascending")])
    write_parquet_atomic(path, validate_table(rows, REVIEWS, source="alert_curate"))
    return rows.num_rows


def _write_kept(final, path) -> int:
    import ray

    refs = final.map_batches(_kept_rows, batch_format="pyarrow").to_arrow_refs()
    return ray.get(ray.remote(_write_part).options(num_cpus=1).remote(path, *refs))
