"""`rexeval ground-truth`: statements -> ground-truth explanations (python -m ray_jobs.ground_truth)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.pipelines.extract.ground_truth_pipeline import STAGES, run_ground_truth
from rexeval.pipelines.extract.config import GroundTruthConfig
from rexeval.ray_jobs.common import Where, columns_option, config_option, defaults_from, run_job, user_errors


@defaults_from(GroundTruthConfig)
@click.command("ground-truth")
@click.argument("input", required=False, type=Where())
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/run "
                                                "(explanations/, sentences/, errors/, manifest.json).")
@click.option("--stage", type=click.Choice(STAGES),
              help="Which statements to use: 'auto' (default: verified ones if any exist, "
                   "else triplet), 'triplet', 'candidate' or 'verified'.")
@click.option("--workers", type=int, help="Actors (default: one per CPU).")
@columns_option
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def ground_truth_cmd(overwrite, config_file, **flags):
    """Write the rule-based ground-truth explanation of every review (seed 000).

    INPUT is an `rexeval extract` output folder (its statements/ shards) or a
    statements table (Parquet, CSV, TSV or JSON lines, gzipped or not; --columns maps
    your column names to ours). Each review's statements are rewritten in the third person
    and grouped by polarity: "The user would appreciate this product because ...
    However, they may dislike that ... They seem indifferent to the fact that ...".
    sentences/ holds one such sentence per statement, for the statement-level metrics.
    Statements with an unknown sentiment go to errors/; a re-run resumes. INPUT and
    --out may be local paths or URIs (s3://bucket/run).

    \b
    Examples:
      rexeval ground-truth runs/mi/extract --out runs/mi/ground-truth
      rexeval ground-truth my_statements.csv --columns statement=text,review_id=rid --out runs/mi/truth
    """
    return run_job("ground-truth", GroundTruthConfig, partial(run_ground_truth, overwrite=overwrite), config_file,
                   flags, counts=_counts,
                   outputs=lambda cfg, m: {n: f"{cfg.out}/{n}" for n in ("explanations", "sentences", "errors")}
                   | {"manifest": f"{cfg.out}/manifest.json"})


def _counts(cfg, manifest: dict) -> dict:
    c = manifest["counts"]
    return {"statements used": manifest.get("stage", cfg.stage),
            "reviews in": c.get("in", 0), "explanations out": c.get("out", 0),
            "statements in": c.get("statements", 0), "sentences out": c.get("sentences", 0),
            "duplicate statements": c.get("duplicates", 0), "error rows": c.get("errors", 0)}


def main():  # python -m ray_jobs.ground_truth
    ground_truth_cmd()


if __name__ == "__main__":
    main()
