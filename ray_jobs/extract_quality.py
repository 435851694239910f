"""`rexeval extract-quality`: judge a sample of extracted statements (seed 002, Table 2)."""
from __future__ import annotations

import time

import click

from rexeval.pipelines.extract.quality import run_quality
from rexeval.pipelines.extract.config import QualityConfig
from rexeval.pipelines.core.runtime import init_ray
from rexeval.ray_jobs.common import Where, config_option, llm_options, load_config, summary, user_errors


@click.command("extract-quality")
@click.argument("input", required=False, type=Where(exists=True))
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/run "
                                                "(judgements/, errors/, report.md, report.json).")
@click.option("--sample", type=int, help="Interactions (reviews) to judge (default 200).")
@click.option("--seed", type=int, help="Sampling seed (default 0).")
@click.option("--label", help="Row name in the report (default: the input folder's name).")
@click.option("--with-review/--without-review", default=None,
              help="Show the judge the review as context (default: the statement alone).")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@llm_options
@config_option
@user_errors
def extract_quality_cmd(input, out, sample, seed, label, with_review, overwrite, config_file, llm):
    """Judge how explanatory and atomic extracted statements are.

    INPUT is an `rexeval extract` output folder. A seeded sample of interactions is
    drawn and each of their statements is judged by the profile's judge_llm. For
    `--method star` output, candidates (without verification) and verified statements
    are both judged, giving the percentages and gains of seed 002's Table 2.
    Unusable judge answers are counted and reported, not guessed. INPUT and --out may
    be local paths or URIs (s3://bucket/run).

    Example: rexeval extract-quality runs/demo/star --out runs/demo/quality --sample 50
    """
    started = time.time()
    cfg = load_config(QualityConfig, config_file, input=input, out=out, sample=sample, seed=seed,
                      label=label, with_review=with_review, **llm)
    init_ray()
    manifest = run_quality(cfg, overwrite=overwrite, progress=click.echo)
    click.echo("")
    click.echo(manifest["table"])
    summary("extract-quality", manifest["counts"], started,
            {"report": f"{cfg.out}/report.md", "judgements": f"{cfg.out}/judgements"})
    return manifest


def main():  # python -m ray_jobs.extract_quality
    extract_quality_cmd()


if __name__ == "__main__":
    main()
