"""`rexeval`: the command line, one command per module of ray_jobs/."""
from __future__ import annotations

import os

import click

from rexeval.pipelines.core.runtime import OMP_WAIT
from rexeval.ray_jobs.paraphrase import cluster_cmd, cluster_report_cmd
from rexeval.ray_jobs.curate import curate_cmd
from rexeval.ray_jobs.demo import demo_cmd
from rexeval.ray_jobs.evaluate import evaluate_cmd
from rexeval.ray_jobs.expscore import expscore_group
from rexeval.ray_jobs.extract import extract_cmd
from rexeval.ray_jobs.extract_quality import extract_quality_cmd
from rexeval.ray_jobs.generate import generate_group
from rexeval.ray_jobs.ground_truth import ground_truth_cmd
from rexeval.ray_jobs.info import info_cmd
from rexeval.ray_jobs.ingest import ingest_cmd
from rexeval.ray_jobs.judge import judge_group
from rexeval.ray_jobs.meta_evaluate import meta_evaluate_cmd
from rexeval.ray_jobs.serve_cmd import serve_group
from rexeval.ray_jobs.split import split_cmd
from rexeval.ray_jobs.star import star_group
from rexeval.ray_jobs.study import study_group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rexeval")
def cli():
    """rexeval: build benchmarks from product reviews and evaluate the explanations
    recommender systems give, on a laptop or a Ray cluster, with the same code.

    Jobs start a local Ray, or join the cluster named by RAY_ADDRESS.
    """


cli.add_command(ingest_cmd)
cli.add_command(split_cmd)
cli.add_command(curate_cmd)
cli.add_command(info_cmd)
cli.add_command(extract_cmd)
cli.add_command(extract_quality_cmd)
cli.add_command(ground_truth_cmd)
cli.add_command(cluster_cmd)
cli.add_command(cluster_report_cmd)
cli.add_command(star_group)
cli.add_command(generate_group)
cli.add_command(evaluate_cmd)
cli.add_command(judge_group)
cli.add_command(meta_evaluate_cmd)
cli.add_command(expscore_group)
cli.add_command(serve_group)
cli.add_command(study_group)
cli.add_command(demo_cmd)
try:
    from rexeval.ray_jobs.models_cmd import models_group

    cli.add_command(models_group)
except ImportError:  # pragma: no cover - models/ not installed in a trimmed checkout
    pass


def main():
    # Before torch loads: this driver computes beside its local Ray's workers, whose OpenMP
    # threads sleep while they wait (pipelines/core/runtime.py OMP_WAIT); its own do too.
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT)
    cli()


if __name__ == "__main__":
    main()
