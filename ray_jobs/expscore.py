"""`rexeval expscore train|score` (python -m ray_jobs.expscore): seed 003's learned,
factor-based explanation metric."""
from __future__ import annotations

import functools
from collections.abc import Callable

import click

from rexeval.pipelines.expscore.pipeline import run_score, run_train
from rexeval.pipelines.expscore.config import ExpScoreScoreConfig, ExpScoreTrainConfig
from rexeval.pipelines.expscore.report import report_markdown
from rexeval.ray_jobs.common import Where, columns_option, config_option, defaults_from, run_job, user_errors

HEAD_CHOICE = click.Choice(["linear", "logistic", "nn", "all"])

_INPUT_OPTIONS = [
    click.option("--out", "-o", help="Output folder (model/, scores.parquet, errors.parquet, report.json, report.md)."),
    click.option("--reviews", type=Where(exists=True),
                 help="Item reviews: a REVIEWS table (Parquet, CSV, TSV or JSON lines, gzipped or not) or a "
                      "`rexeval ingest` output folder."),
    click.option("--reviews-column", help="Or: the input column that holds each row's item reviews."),
    click.option("--text-column", help="Explanation text column (default {default})."),
    click.option("--item-column", help="Item id column (default {default})."),
    click.option("--rating-column", help="Human rating column (default {default})."),
    click.option("--id-column", help="Example id column (default {default}; else FILE:ROW)."),
    click.option("--features-column", help="Item feature words column (default {default}; FA is "
                                           "left out when no input has it)."),
    columns_option,
    click.option("--languagetool", metavar="URL|FOLDER",
                 help="LanguageTool for grammar (GC): a running server's URL or an unpacked release folder "
                      "(needs Java). Default $REXEVAL_LANGUAGETOOL; without one GC is unavailable."),
    click.option("--max-reviews-per-item", type=int, help="Reviews per item used for relevance (default {default})."),
    click.option("--profile", help="Model profile for the sentence encoder (default {default})."),
    click.option("--embedder", help="Sentence encoder for relevance (default: the profile's sts model, "
                                    "all-MiniLM-L6-v2)."),
    click.option("--device", help="auto (default), cpu or cuda for the sentence encoder."),
    click.option("--ray", "ray_mode", type=click.Choice(["auto", "always", "never"]),
                 help="On Ray workers (inputs, factors and heads; the driver holds counts): auto "
                      "(default: once the explanations or reviews reach --ray-min-rows rows), always, never."),
    click.option("--ray-min-rows", type=int,
                 help="Rows from which `--ray auto` runs on Ray workers (default {default})."),
    click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings."),
]


def input_options(fn: Callable) -> Callable:
    """The options `train` and `score` share; they reach the command as `flags`."""

    @functools.wraps(fn)
    def wrapper(*args, ray_mode, **kwargs):
        return fn(*args, ray=ray_mode, **kwargs)

    for option in reversed(_INPUT_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


@click.group("expscore")
def expscore_group():
    """ExpScore (seed 003): a learned explanation-quality metric over nine interpretable
    factors (relevance, length, readability, word importance, repetition, subjectivity,
    polarity, grammar correctness, feature appearance) with linear, logistic or
    neural-network heads, trained on human ratings.

    Typical run:

      rexeval expscore train rated.jsonl --reviews runs/mi/ingest --out runs/expscore

      rexeval expscore score new.parquet --model runs/expscore/model --reviews runs/mi/ingest
      --out runs/expscore-new
    """


@defaults_from(ExpScoreTrainConfig)
@expscore_group.command("train")
@click.argument("inputs", nargs=-1, type=Where(exists=True))
@click.option("--head", type=HEAD_CHOICE, help="Head(s) to train (default {default}).")
@click.option("--test-fraction", type=float, help="Share of rows held out for the report (default {default}).")
@click.option("--seed", type=int, help="Seed of the split and of the weight initialisation (default {default}).")
@click.option("--l2", type=float, help="L2 penalty on the weights (default {default}).")
@click.option("--lr", type=float, help="Adam learning rate (default {default}).")
@click.option("--max-epochs", type=int, help="Cap on full-batch epochs (default {default}).")
@click.option("--patience", type=int, help="Stop after this many epochs without a lower loss (default {default}).")
@click.option("--repetition-n", type=int, help="Word n-gram length of the repetition factor (default {default}).")
@input_options
@config_option
@user_errors
def train_cmd(overwrite, config_file, **flags):
    """Train ExpScore on rated explanations and report how well it agrees with people.

    INPUTS are Parquet, CSV, TSV or JSON-lines tables (gzipped or not) with an
    explanation, its item id and a human rating (1-5, may be a mean of several),
    optionally features; --columns (or the --*-column flags) maps your column names to
    ours, in the reviews table too. Writes the model
    (one folder per head, plus factors.json), scores.parquet (factors and ExpScore per
    row, with its split), errors.parquet (rows that could not be used, and why), and
    report.json / report.md: Pearson and Kendall of each head and each single factor
    against the ratings, the ±0.5 accuracy and loss (Table 4), the linear weights
    (Table 3).

    Examples:

      rexeval expscore train rated.jsonl --reviews runs/mi/ingest --out runs/expscore

      rexeval expscore train rated.csv --reviews-column reviews --head linear --out runs/es-lin

      rexeval expscore train rated.jsonl.gz --reviews reviews.csv --columns explanation=text,item_id=asin
      --out runs/es-mine

      rexeval expscore train rated.parquet --reviews reviews.parquet --languagetool http://127.0.0.1:8081
      --out runs/es-gc
    """
    return _job("expscore train", ExpScoreTrainConfig, functools.partial(run_train, overwrite=overwrite),
                config_file, flags, model=True)


@defaults_from(ExpScoreScoreConfig)
@expscore_group.command("score")
@click.argument("inputs", nargs=-1, type=Where(exists=True))
@click.option("--model", "model", type=Where(exists=True, file_okay=False),
              help="Model folder written by `expscore train` (OUT/model), or one head's folder.")
@click.option("--head", type=HEAD_CHOICE, help="Head(s) of the model to score with (default all it has).")
@input_options
@config_option
@user_errors
def score_cmd(overwrite, config_file, **flags):
    """Score explanations with a trained ExpScore model.

    INPUTS are tables like those of `train`; the rating column is optional (when
    present, the report compares the scores with it). The word-importance table and
    the factor settings come from the model, so factors mean what they meant in
    training. A model trained with grammar (GC) needs --languagetool here too.

    Examples:

      rexeval expscore score new.jsonl --model runs/expscore/model --reviews runs/mi/ingest --out runs/es-new

      rexeval expscore score gen.parquet --model runs/expscore/model/nn --reviews-column reviews --out runs/es-nn

      rexeval expscore score gen.tsv --model runs/expscore/model --reviews reviews.csv.gz --columns item_id=asin
      --out runs/es-gen
    """
    return _job("expscore score", ExpScoreScoreConfig, functools.partial(run_score, overwrite=overwrite),
                config_file, flags)


def _job(title: str, config_cls, run, config_file, flags: dict, model: bool = False) -> dict:
    """An ExpScore job (no Ray): its report as Markdown, then the summary (with the
    model folder when `model`)."""
    return run_job(title, config_cls, run, config_file, flags, ray=False,
                   show=lambda cfg, report: click.echo("\n" + report_markdown(report)),
                   outputs=lambda cfg, report: {**({"model": f"{cfg.out}/model"} if model else {}),
                                                "scores": f"{cfg.out}/scores.parquet",
                                                "errors": f"{cfg.out}/errors.parquet",
                                                "report": f"{cfg.out}/report.md"},
                   notes=lambda cfg, report: report.get("notes"))


def main():  # python -m ray_jobs.expscore
    expscore_group()


if __name__ == "__main__":
    main()
