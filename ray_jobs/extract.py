"""`rexeval extract`: reviews -> statements with an LLM (python -m ray_jobs.extract)."""
from __future__ import annotations

import json
import time

import click

from pipelines.extract_pipeline import ExtractConfig, run_extract
from pipelines.ray_runtime import init_ray
from ray_jobs.common import config_option, load_config, summary, user_errors


def _options(items: tuple[str, ...]) -> dict:
    """KEY=VALUE pairs; values are parsed as JSON when they can be (numbers, booleans)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} must look like KEY=VALUE", param_hint="--backend-option")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


@click.command("extract")
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--out", "-o", help="Output folder (statements/, errors/, manifest.json).")
@click.option("--method", type=click.Choice(["triplets", "star"]),
              help="triplets: statement-topic-sentiment per domain (seed 000, default); "
                   "star: candidate extraction then verification (seed 002).")
@click.option("--profile", help="Model profile: local (default, CPU, offline) or paper.")
@click.option("--model", "models", multiple=True, metavar="ROLE=REF",
              help="Override one model of the profile, e.g. --model llm=/models/qwen3-8b.")
@click.option("--backend", help="LLM backend: hf, openai, vllm (default: the profile's).")
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE",
              help="Backend setting, e.g. batch_size=16, base_url=http://127.0.0.1:8000/v1, "
                   "concurrency=8, device=cuda.")
@click.option("--verify-model", help="star: model for the verification step (default: the llm).")
@click.option("--domain", help="Topic table for every review (default: each review's category).")
@click.option("--max-tokens", type=int, help="Token limit of one answer (default 512).")
@click.option("--temperature", type=float, help="0 (default) = greedy, deterministic and cached.")
@click.option("--max-retries", type=int, help="Retries of an unusable answer (default 2).")
@click.option("--max-review-words", type=int,
              help="Longer reviews are cut to this many words, recorded on their rows (default 384).")
@click.option("--constrained/--no-constrained", default=None,
              help="Send the JSON schema for constrained decoding (default on).")
@click.option("--limit", type=int, help="Only the first N reviews.")
@click.option("--shard-size", type=int, help="Reviews per shard, the unit of resume (default 32).")
@click.option("--workers", type=int, help="LLM actors; each loads the model (default 1).")
@click.option("--cache", help="LLM-call cache file (default $REXEVAL_CACHE/llm-calls.sqlite).")
@click.option("--no-cache", is_flag=True, help="Do not read or write the LLM-call cache.")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def extract_cmd(input, out, method, profile, models, backend, backend_options, verify_model,
                domain, max_tokens, temperature, max_retries, max_review_words, constrained,
                limit, shard_size, workers, cache, no_cache, overwrite, config_file):
    """Extract explanatory, atomic statements from reviews with an LLM.

    INPUT is an `rexeval ingest` output folder or a reviews Parquet file/folder. Each
    review ends with statements or with error rows that give the reason and the raw
    model output. Re-running the same command resumes: finished shards are skipped and
    every LLM call already made is answered from the cache.

    Examples:

      rexeval extract runs/demo/ingest --out runs/demo/triplets --limit 20

      rexeval extract runs/mi/ingest --out runs/mi/star --method star --profile paper
    """
    started = time.time()
    cfg = load_config(ExtractConfig, config_file, input=input, out=out, method=method,
                      profile=profile, models=models, backend=backend,
                      backend_options=_options(backend_options) or None,
                      verify_model=verify_model, domain=domain, max_tokens=max_tokens,
                      temperature=temperature, max_retries=max_retries,
                      max_review_words=max_review_words, constrained=constrained, limit=limit,
                      shard_size=shard_size, workers=workers, cache=cache,
                      use_cache=False if no_cache else None)
    init_ray()
    manifest = run_extract(cfg, overwrite=overwrite, progress=click.echo)
    summary("extract", manifest["counts"], started,
            {"statements": f"{cfg.out}/statements", "errors": f"{cfg.out}/errors"})
    return manifest


def main():  # python -m ray_jobs.extract
    extract_cmd()


if __name__ == "__main__":
    main()
