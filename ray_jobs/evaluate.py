"""`rexeval evaluate`: score explanations against references (python -m ray_jobs.evaluate)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.pipelines.evaluate.pipeline import run_evaluate
from rexeval.pipelines.evaluate.config import EVALUATE_OUTPUTS as OUT, EvaluateConfig
from rexeval.ray_jobs.common import (ListedOption, Where, columns_option, config_option, defaults_from,
                                     llm_options, run_job, user_errors)


def metric_family_names() -> list[str]:
    """What --metrics and --skip take by family: every registered family, and corpus
    (the corpus-level metrics, computed per system)."""
    from rexeval.pipelines.evaluate.families import FAMILIES

    return [*FAMILIES.names(), "corpus"]


@defaults_from(EvaluateConfig)
@click.command("evaluate")
@click.argument("explanations", nargs=-1, type=Where(exists=True))
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/eval "
                                                "(scores, aggregates, tables, report).")
@click.option("--references", type=Where(exists=True, file_okay=False),
              help="`rexeval ground-truth` output folder: reference texts and statement sentences.")
@click.option("--statements", multiple=True, type=Where(exists=True),
              help="Statements of the generated explanations (example_id, system, statement, "
                   "sentiment[, topic]) as Parquet, CSV, TSV or JSON lines, gzipped or not (--columns maps "
                   "your column names here too); repeatable.")
@click.option("--extract", is_flag=True, default=None,
              help="Extract statements (seed 000 triplets, with the profile's llm) for the systems "
                   "that came without them.")
@click.option("--domain", help="Topic table used by --extract (default: none).")
@click.option("--metrics", "metrics", multiple=True, cls=ListedOption, names=metric_family_names,
              help="Families or metric names to run (default all: seed 000's metrics): {names} (questeval is "
                   "the published score, questeval_f1 its token-F1 variant; texts: the model-free metrics added "
                   "beside the seed's, run only when asked for); or a metric, e.g. stent_p, which is then the only one of "
                   "its family reported.")
@click.option("--skip", multiple=True, help="Families or metric names to leave out.")
@click.option("--system", "systems", multiple=True, help="Only these systems.")
@click.option("--limit", type=int, help="Only the first N examples of each system.")
@columns_option
@click.option("--empty", type=click.Choice(["skip", "zero"]),
              help="An example with an empty statement set: left out of the means (skip, "
                   "default, and counted) or scored 0.")
@click.option("--unparseable", type=click.Choice(["zero", "skip"]),
              help="An St2Exp verifier answer without a verdict: counts as unsupported (zero, "
                   "default) or is left out; counted either way.")
@click.option("--st2exp-population", type=click.Choice(["both", "each"]),
              help="Examples St2Exp-P/R average over: those with statements on both sides (both, default: "
                   "seed 000's) or each side's own (each: P over examples with generated statements, R over "
                   "those with reference statements).")
@click.option("--nli-service",
              help="auto (default: use the running rexeval-nli Serve app, else start one with the "
                   "profile's nli model and stop it at the end), none (in-process model), "
                   "serve:APP, or an http(s) URL of a running deployment.")
@click.option("--nli-scorer", metavar="MODULE:CLASS",
              help="Class that scores NLI pairs from a model location (default: the Hugging Face engine, "
                   "rexeval.models.encoders.nli:NLIScorer).")
@click.option("--nli-replicas", type=int, help="Max replicas of a deployment this job starts.")
@click.option("--nli-gpus", type=float, help="GPUs per replica of a deployment this job starts.")
@click.option("--serve-port", type=int, help="HTTP port of a deployment this job starts "
                                             "(127.0.0.1; default $REXEVAL_SERVE_PORT, else 8000).")
@click.option("--device", help="auto (default), cpu or cuda for the metric models.")
@click.option("--chunk-size", type=int, help="Examples per shard, the unit of resume (default {default}).")
@click.option("--bootstrap", type=int, help="Bootstrap resamples for the 95%% interval (0: none).")
@click.option("--dataset", help="Dataset name shown in the tables.")
@click.option("--task", type=click.Choice(["auto", "explanation", "review"]),
              help="What the references are: explanations (seed 000 Tables III-VI) or the reviews (review "
                   "generation: its Table VII). Default auto: review when every `generate run` folder given was "
                   "trained with --target review and no --references are given.")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made from other inputs.")
@llm_options
@config_option
@user_errors
def evaluate_cmd(overwrite, config_file, llm, **flags):
    """Score generated explanations against ground truth with seed 000's metrics.

    EXPLANATIONS are tables of explanations (example_id, system, user_id, item_id,
    explanation[, reference]), one or several systems each: Parquet, CSV, TSV or JSON
    lines, gzipped or not; --columns maps your column names to these. Writes per-example scores in
    long format (scores.parquet), mean ± std, n and a bootstrap 95% interval per system
    and metric (aggregates.parquet), Tables III-VI (tables.md, tables.csv),
    report.json, which lists every metric that was skipped and why, and how the metrics
    agree: Kendall tau-b between every pair of metrics over systems and over examples
    (metric_correlations.parquet/.csv/.md and one heat map PNG per level). Metrics whose model
    the profile lacks are skipped, never replaced: the local profile has no NLI model,
    so pass one with --model nli=/path/to/nli-checkpoint for StEnt/StCoh/SummaC.
    The BERTScore layers are profile settings that --model overrides too, e.g.
    --model bertscore_num_layers=17 or --model questeval_bertscore_num_layers=9.
    Re-running the same command resumes where it stopped. Inputs and --out may be local
    paths or URIs (s3://bucket/eval; credentials and endpoint from the standard AWS
    variables): every table, figure and report is written through the storage module.

    Examples:

      rexeval evaluate runs/gen/explanations.parquet --references runs/demo/ground_truth
      --statements runs/gen/statements.parquet --out runs/eval

      rexeval evaluate runs/gen --references runs/gt --extract --model nli=/models/deberta-large-mnli
      --skip st2exp --out runs/eval

      rexeval evaluate runs/nrt-review-test --metrics bertscore --metrics sts --out runs/eval-review

      rexeval evaluate my_system.csv --columns explanation=text,system=model --references runs/gt
      --metrics overlap --out runs/eval-mine
    """
    return run_job("evaluate", EvaluateConfig, partial(run_evaluate, overwrite=overwrite), config_file,
                   {**flags, **llm}, show=lambda cfg, report: print_report(report),
                   outputs=lambda cfg, report: {
                       "scores": f"{cfg.out}/{OUT.scores}", "tables": f"{cfg.out}/{OUT.tables_md}",
                       "agreement": f"{cfg.out}/{OUT.correlations_md}", "report": f"{cfg.out}/{OUT.report}"})


def print_report(report: dict) -> None:
    click.echo("")
    click.echo(report["tables_md"])
    for fam, counts in report["family_counts"].items():
        interesting = {k: v for k, v in counts.items() if k.startswith(("n_empty", "n_skipped", "nli_", "verifier_"))}
        if interesting:
            click.echo(f"  {fam}: " + ", ".join(f"{k}={v}" for k, v in interesting.items()))
    for fam, why in report["skipped"].items():
        click.echo(f"  skipped {fam}: {why}")
    for fam, per in report["skipped_for_systems"].items():
        for system, why in per.items():
            click.echo(f"  skipped {fam} for {system}: {why}")


def main():  # python -m ray_jobs.evaluate
    evaluate_cmd()


if __name__ == "__main__":
    main()
