"""`rexeval split`: reviews -> k-core -> train/valid/test (python -m ray_jobs.split)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.pipelines.ingest.split_pipeline import run_split
from rexeval.pipelines.ingest.config import SplitConfig
from rexeval.ray_jobs.common import Where, columns_option, config_option, defaults_from, run_job, user_errors


@defaults_from(SplitConfig)
@click.command("split")
@click.argument("input", required=False, type=Where(exists=True))
@click.option("--out", "-o", type=Where(),
              help="Output folder (train/, valid/, test/, manifest.json); a path or a URI.")
@click.option("--method", type=click.Choice(["temporal", "leave-last-two"]),
              help="temporal: per-user chronological 80/10/10 (seed 000, default); "
                   "leave-last-two: last review -> test, the one before -> valid (seed 002).")
@click.option("--kcore-user", type=int, help="Iterative k-core: minimum reviews per user.")
@click.option("--kcore-item", type=int, help="Iterative k-core: minimum reviews per item.")
@click.option("--train", type=float, help="Temporal: train share, between 0 and 1 (default {default}).")
@click.option("--valid", type=float,
              help="Temporal: validation share, between 0 and 1 (default {default}); train + valid < 1.")
@click.option("--min-interactions", type=int,
              help="Drop users with fewer reviews (default 5 temporal, 3 leave-last-two; at least 3 there).")
@click.option("--cold-start/--no-cold-start", "drop_cold_start_items", default=None,
              help="Drop valid/test reviews of items never seen in train "
                   "(default: on for temporal, off for leave-last-two).")
@columns_option
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def split_cmd(overwrite, config_file, **flags):
    """Split reviews per user into train / validation / test.

    INPUT is an `rexeval ingest` output folder, a folder of reviews Parquet parts, or a
    reviews file in our reviews table's columns (Parquet, CSV, TSV or JSON lines,
    gzipped or not; --columns maps your column names to ours), a local path or a URI,
    like --out. Rows are ordered by (user, time, source file, line); every row is
    counted as kept or dropped with its reason in the manifest.

    \b
    Examples:
      rexeval split runs/mi/ingest --out runs/mi/split --kcore-user 5 --kcore-item 5
      rexeval split reviews.csv.gz --columns user_id=reviewer,timestamp=time --out runs/mine/split
    """
    # ray=False: the job starts or joins Ray itself once its input is found (`runtime.read_dataset`),
    # so that a refused input costs no Ray start.
    return run_job("split", SplitConfig, partial(run_split, overwrite=overwrite), config_file, flags, ray=False,
                   outputs=lambda cfg, m: {n: f"{cfg.out}/{n}" for n in ("train", "valid", "test")})


def main():  # python -m ray_jobs.split
    split_cmd()


if __name__ == "__main__":
    main()
