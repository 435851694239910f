"""`rexeval extract`: reviews -> statements with an LLM (python -m ray_jobs.extract)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.pipelines.extract.pipeline import run_extract
from rexeval.pipelines.extract.config import ExtractConfig
from rexeval.ray_jobs.common import Where, config_option, defaults_from, llm_options, run_job, user_errors


@defaults_from(ExtractConfig)
@click.command("extract")
@click.argument("input", required=False, type=Where(exists=True))
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/run "
                                                "(statements/, errors/, manifest.json).")
@click.option("--method", type=click.Choice(["triplets", "star"]),
              help="triplets: statement-topic-sentiment per domain (seed 000, default); "
                   "star: candidate extraction then verification (seed 002).")
@click.option("--verify-model", help="star: model for the verification step (default: the llm).")
@click.option("--domain", help="Topic table for every review (default: each review's category).")
@click.option("--max-tokens", type=int, help="Token limit of one answer (default {default}).")
@click.option("--temperature", type=float, help="0 (default) = greedy, deterministic and cached.")
@click.option("--max-review-words", type=int,
              help="Longer reviews are cut to this many words, recorded on their rows (default {default}).")
@click.option("--constrained/--no-constrained", default=None,
              help="Send the JSON schema for constrained decoding (default on).")
@click.option("--limit", type=int, help="Only the first N reviews.")
@click.option("--shard-size", type=int, help="Reviews per shard, the unit of resume (default {default}).")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@llm_options
@config_option
@user_errors
def extract_cmd(overwrite, config_file, llm, **flags):
    """Extract explanatory, atomic statements from reviews with an LLM.

    INPUT is an `rexeval ingest` output folder or a reviews Parquet file/folder. Each
    review ends with statements or with error rows that give the reason and the raw
    model output. Re-running the same command resumes: finished shards are skipped and
    every LLM call already made is answered from the cache. INPUT and --out may be
    local paths or URIs (s3://bucket/run; credentials and endpoint from the standard AWS
    variables); with --out at a URI and no --cache, the calls are cached in
    OUT/_llm_cache, so a re-run from any node of a cluster makes none again.

    Examples:

      rexeval extract runs/demo/ingest --out runs/demo/triplets --limit 20

      rexeval extract runs/mi/ingest --out runs/mi/star --method star --profile paper
    """
    return run_job("extract", ExtractConfig, partial(run_extract, overwrite=overwrite), config_file,
                   {**flags, **llm},
                   outputs=lambda cfg, m: {"statements": f"{cfg.out}/statements", "errors": f"{cfg.out}/errors"})


def main():  # python -m ray_jobs.extract
    extract_cmd()


if __name__ == "__main__":
    main()
