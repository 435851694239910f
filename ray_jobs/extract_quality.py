"""`rexeval extract-quality`: judge a sample of extracted statements (seed 002, Table 2)."""
from __future__ import annotations

import time

import click

from pipelines.extract_quality import QualityConfig, run_quality
from pipelines.ray_runtime import init_ray
from ray_jobs.common import config_option, load_config, summary, user_errors
from ray_jobs.extract import _options


@click.command("extract-quality")
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--out", "-o", help="Output folder (judgements/, errors/, report.md, report.json).")
@click.option("--sample", type=int, help="Interactions (reviews) to judge (default 200).")
@click.option("--seed", type=int, help="Sampling seed (default 0).")
@click.option("--label", help="Row name in the report (default: the input folder's name).")
@click.option("--with-review/--without-review", default=None,
              help="Show the judge the review as context (default: the statement alone).")
@click.option("--profile", help="Model profile: local (default) or paper.")
@click.option("--model", "models", multiple=True, metavar="ROLE=REF",
              help="Override a model, e.g. --model judge_llm=/models/llama-3.1-8b-instruct.")
@click.option("--backend", help="LLM backend: hf, openai, vllm (default: the profile's).")
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE",
              help="Backend setting, e.g. batch_size=16 or base_url=http://127.0.0.1:8000/v1.")
@click.option("--max-retries", type=int, help="Retries of an unusable answer (default 2).")
@click.option("--workers", type=int, help="Judge actors (default 1).")
@click.option("--cache", help="LLM-call cache file (default $REXEVAL_CACHE/llm-calls.sqlite).")
@click.option("--no-cache", is_flag=True, help="Do not read or write the LLM-call cache.")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def extract_quality_cmd(input, out, sample, seed, label, with_review, profile, models, backend,
                        backend_options, max_retries, workers, cache, no_cache, overwrite,
                        config_file):
    """Judge how explanatory and atomic extracted statements are.

    INPUT is an `rexeval extract` output folder. A seeded sample of interactions is
    drawn and each of their statements is judged by the profile's judge_llm. For
    `--method star` output, candidates (without verification) and verified statements
    are both judged, giving the percentages and gains of seed 002's Table 2.
    Unusable judge answers are counted and reported, not guessed.

    Example: rexeval extract-quality runs/demo/star --out runs/demo/quality --sample 50
    """
    started = time.time()
    cfg = load_config(QualityConfig, config_file, input=input, out=out, sample=sample, seed=seed,
                      label=label, with_review=with_review, profile=profile, models=models,
                      backend=backend, backend_options=_options(backend_options) or None,
                      max_retries=max_retries, workers=workers, cache=cache,
                      use_cache=False if no_cache else None)
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
