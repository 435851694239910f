"""`rexeval extract-quality`: judge a sample of extracted statements (seed 002, Table 2)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.pipelines.extract.quality import run_quality
from rexeval.pipelines.extract.config import QualityConfig
from rexeval.ray_jobs.common import Where, config_option, defaults_from, llm_options, run_job, user_errors


@defaults_from(QualityConfig)
@click.command("extract-quality")
@click.argument("input", required=False, type=Where(exists=True))
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/run "
                                                "(judgements/, errors/, report.md, report.json).")
@click.option("--sample", type=int, help="Interactions (reviews) to judge (default {default}).")
@click.option("--seed", type=int, help="Sampling seed (default {default}).")
@click.option("--label", help="Row name in the report (default: the input folder's name).")
@click.option("--with-review/--without-review", default=None,
              help="Show the judge the review as context (default: the statement alone).")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@llm_options
@config_option
@user_errors
def extract_quality_cmd(overwrite, config_file, llm, **flags):
    """Judge how explanatory and atomic extracted statements are.

    INPUT is an `rexeval extract` output folder. A seeded sample of interactions is
    drawn and each of their statements is judged by the profile's judge_llm. For
    `--method star` output, candidates (without verification) and verified statements
    are both judged, giving the percentages and gains of seed 002's Table 2.
    Unusable judge answers are counted and reported, not guessed. INPUT and --out may
    be local paths or URIs (s3://bucket/run).

    Example: rexeval extract-quality runs/demo/star --out runs/demo/quality --sample 50
    """
    return run_job("extract-quality", QualityConfig, partial(run_quality, overwrite=overwrite), config_file,
                   {**flags, **llm}, show=lambda cfg, m: click.echo("\n" + m["table"]),
                   outputs=lambda cfg, m: {"report": f"{cfg.out}/report.md", "judgements": f"{cfg.out}/judgements"})


def main():  # python -m ray_jobs.extract_quality
    extract_quality_cmd()


if __name__ == "__main__":
    main()
