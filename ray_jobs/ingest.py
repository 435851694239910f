"""`rexeval ingest`: review files -> validated reviews + errors (python -m ray_jobs.ingest)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.pipelines.ingest.formats import FORMATS
from rexeval.pipelines.ingest.pipeline import run_ingest
from rexeval.pipelines.ingest.config import IngestConfig
from rexeval.ray_jobs.common import Where, config_option, defaults_from, run_job, user_errors


@defaults_from(IngestConfig)
@click.command("ingest")
@click.argument("inputs", nargs=-1, type=Where(exists=True, dir_okay=False))
@click.option("--out", "-o", type=Where(),
              help="Output folder (reviews/, errors/, manifest.json); a path or a URI.")
@click.option("--format", "format", type=click.Choice(FORMATS), default=None,
              help="Input layout; 'auto' (default) looks at the name and first record.")
@click.option("--columns", help="Map our fields to the file's columns for csv/parquet, e.g. "
              "'user_id=reviewer,item_id=product,rating=stars,text=body,timestamp=time' "
              "(0-based positions for a headerless CSV).")
@click.option("--meta", multiple=True, type=Where(exists=True, dir_okay=False),
              help="Item metadata file(s) whose titles are joined by item id (repeatable).")
@click.option("--category", help="Domain name to record for rows that carry none.")
@click.option("--min-rating", type=float, help="Lowest valid rating (default {default}).")
@click.option("--max-rating", type=float, help="Highest valid rating (default {default}).")
@click.option("--chunk-mb", type=float, help="Bytes of input per parse task (default {default}).")
@click.option("--workers", type=int, help="Actors per stage (default: one per CPU).")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def ingest_cmd(overwrite, config_file, **flags):
    """Read Amazon review dumps (2014/2018 JSON lines, 2023 JSONL, the Kaggle CSV) or any
    CSV/Parquet with --columns, validate every row, and write Parquet shards.

    Inputs and --out may be local paths or URIs (s3://bucket/..., gs://...); the store's
    credentials come from its usual environment variables (AWS_* for S3).

    Every input row ends in reviews/ or in errors/ (with its file, line and reason); a
    re-run with the same settings resumes where it stopped.

    Example: rexeval ingest Musical_Instruments_5.json.gz --out runs/mi/ingest
    """
    return run_job("ingest", IngestConfig, partial(run_ingest, overwrite=overwrite), config_file, flags,
                   counts=lambda cfg, m: {"rows in": m["counts"].get("in", 0), "reviews out": m["counts"].get("out", 0),
                                          "error rows": m["counts"].get("errors", 0)},
                   outputs=lambda cfg, m: {"reviews": f"{cfg.out}/reviews", "errors": f"{cfg.out}/errors",
                                           "manifest": f"{cfg.out}/manifest.json"})


def main():  # python -m ray_jobs.ingest
    ingest_cmd()


if __name__ == "__main__":
    main()
