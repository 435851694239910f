"""`rexeval curate`: seed 004's dataset selection (§3.1) on ingested reviews (python -m ray_jobs.curate)."""
from __future__ import annotations

import click

from rexeval.pipelines.curate.config import CurateConfig
from rexeval.pipelines.curate.pipeline import run_curate
from rexeval.ray_jobs.common import Where, columns_option, config_option, defaults_from, run_job, user_errors


@defaults_from(CurateConfig)
@click.command("curate")
@click.argument("input", required=False, type=Where(exists=True))
@click.option("--out", "-o", type=Where(), help="Output folder (reviews/, categories.csv, curate.md, manifest.json).")
@click.option("--rating", type=float, help="Keep purchases rated exactly this (default {default}).")
@click.option("--min-title-letters", type=int, help="Keep items whose title has this many letters (default {default}).")
@click.option("--min-purchases", type=int, help="Fewest purchases a kept user has (default {default}).")
@click.option("--max-purchases", type=int, help="Most purchases a kept user has (default {default}).")
@click.option("--per-category", type=int, help="Users sampled per category (default {default}).")
@click.option("--seed", type=int, help="Seed of the per-category sample (default {default}).")
@columns_option
@config_option
@user_errors
def curate_cmd(config_file, **flags):
    """Select seed 004's ALERT dataset from ingested Amazon Reviews 2023 purchases.

    INPUT is an `rexeval ingest` folder (item titles joined with --meta) or a reviews
    table (Parquet, CSV, TSV or JSON lines, gzipped or not; --columns maps your column
    names to ours). Keeps 5-star purchases of items whose title has 6+ letters, users with 5-20 of
    them, and a seeded sample of at most 200 users per category (the category of a
    user's latest purchase; a row without one takes its file's name). The manifest
    counts every row with the rule that dropped it. The output reads as an ingest folder.

    \b
    Examples:
      rexeval curate runs/alert/ingest --out runs/alert/curate
      rexeval curate purchases.jsonl.gz --columns user_id=reviewer,title=name --out runs/alert/curate
    """
    return run_job("curate", CurateConfig, run_curate, config_file, flags, ray=False,
                   outputs=lambda cfg, m: {"reviews": f"{cfg.out}/reviews", "table": f"{cfg.out}/curate.md"})


def main():  # python -m ray_jobs.curate
    curate_cmd()


if __name__ == "__main__":
    main()
