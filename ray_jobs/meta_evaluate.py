"""`rexeval meta-evaluate`: agreement of evaluators with human ratings
(python -m ray_jobs.meta_evaluate). Small tabular work: runs in-process, without Ray."""
from __future__ import annotations

from functools import partial

import click

from rexeval.metrics.agreement import LEVELS, METHODS
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.ensemble import SWEEP_CSV, SWEEP_FIGURE, SWEEP_FILE, SWEEP_TABLE
from rexeval.pipelines.meta_evaluate.pipeline import (ERRORS_FILE, REPORT_FILE, RESULTS_FILE, TABLE_FILE,
                                                      run_meta_evaluate)
from rexeval.ray_jobs.common import Where, columns_option, config_option, defaults_from, run_job, user_errors


def _null_policy(ctx, param, value):
    """A number, or "drop" (leave the row out); None when the flag is not given."""
    if value is None or value == "drop":
        return value
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a number nor 'drop'") from None


@defaults_from(MetaEvaluateConfig)
@click.command("meta-evaluate")
@click.argument("scores", required=False, type=Where(exists=True))
@click.option("--human", type=Where(exists=True),
              help="Human ratings in their own table, joined to SCORES on example_id and the key when both "
                   "have example_id, else on user, item and the key; rows without a partner are error rows.")
@click.option("--out", "-o", help="Output folder.")
@click.option("--mode", type=click.Choice(["scores", "pairwise"]),
              help="scores (default): ratings, correlations at three levels (seed 001). pairwise: "
                   "A/B/C verdicts, accuracy, Cohen's kappa, Krippendorff's alpha (seed 004).")
@click.option("--aspect", "aspects", multiple=True,
              help="Aspect to compare, e.g. persuasiveness (repeatable; default: every aspect with "
                   "both a judge score and a human column; for verdicts: overall or a criterion).")
@click.option("--judge-prefix", "judge_prefixes", multiple=True,
              help="Wide tables: prefix of an evaluator's columns (default judge_); repeat for several "
                   "evaluators, e.g. --judge-prefix gpt4_ --judge-prefix bleu_; the evaluator is named by it.")
@click.option("--human-prefix", help="Prefix of the human columns (default {default}).")
@click.option("--judge-col", "judge_cols", multiple=True,
              help="An evaluator column, paired in order with --human-col (instead of prefixes).")
@click.option("--human-col", "human_cols", multiple=True, help="The human column of the --judge-col at the same place.")
@click.option("--evaluator", help="Evaluator name for column pairs, a single --judge-prefix or a verdicts file "
              "(long scores are named by their judge column).")
@click.option("--user-col", help="User column (default {default}).")
@click.option("--item-col", help="Item column (default {default}).")
@click.option("--key", help="Explanation key column (default {default}: system, explanation_id or pair_id).")
@click.option("--method", "methods", multiple=True, type=click.Choice(list(METHODS)),
              help="Correlation(s) (repeatable; default all three; Kendall is tau-b).")
@click.option("--level", "levels", multiple=True, type=click.Choice(list(LEVELS)),
              help="Level(s) (repeatable; default all three).")
@click.option("--table-method", type=click.Choice(list(METHODS)),
              help="Method shown in meta_evaluation.md (default: the first --method).")
@click.option("--human-null", callback=_null_policy, metavar="NUMBER|drop",
              help="A missing human rating becomes this value (default {default}, seed 001) or 'drop'.")
@click.option("--judge-null", callback=_null_policy, metavar="NUMBER|drop",
              help="A missing evaluator score (unparseable answer: empty, NaN, or a judge with no row "
                   "for it in long scores) becomes this value (default {default}, seed 001) or 'drop'.")
@click.option("--bootstrap", type=int, help="Bootstrap resamples for the 95% intervals (default {default}; 0: none).")
@click.option("--seed", type=int,
              help="Seed of the bootstrap, of --random-baseline and of --ensemble-sweep's subset sample "
                   "(default {default}).")
@click.option("--random-baseline", is_flag=True, default=None,
              help="Add seed 001's Random row: uniform integer ratings 1-5 per aspect.")
@click.option("--ensemble-sweep", is_flag=True, default=None,
              help="Also run seed 001's Figure 4: for N = 1..K evaluators of an aspect, average each subset of "
                   "N per explanation and correlate it with the human ratings; writes ensemble_sweep.parquet, "
                   ".csv, .md and .png (mean, min and max over the subsets). Needs two or more evaluators for "
                   "an aspect (judge prefixes, or judges in long scores).")
@click.option("--ensemble-cap", type=click.IntRange(min=1),
              help="Most subsets of one size N in --ensemble-sweep; past it a --seed'ed sample of that many "
                   "distinct subsets is scored (default {default}).")
@columns_option
@click.option("--overwrite", is_flag=True, help="Replace results of another config in the output folder.")
@config_option
@user_errors
def meta_evaluate_cmd(overwrite, config_file, **flags):
    """Measure how well evaluators (LLM judges, metrics, annotators) agree with human
    ratings of the same explanations.

    SCORES is a table (Parquet, CSV, TSV or JSON lines, gzipped or not; --columns maps
    your column names to ours in both tables) in one of three layouts, told apart by its
    columns:

    \b
      wide      evaluator columns beside the keys (judge_persuasiveness, ...), paired
                by prefix with human_persuasiveness, ...; without --human the human
                columns sit in the same table
      long      `rexeval judge likert`'s likert_scores.parquet (judge, aspect, score):
                one evaluator per judge value (ensembles included), one column per
                aspect; a repeated (judge, explanation, aspect) score is an error row
      verdicts  `rexeval judge pairwise`'s verdicts.parquet (pair_id, system, verdict)
                in --mode pairwise: verdict and verdict_<criterion> against the human
                file's human_verdict and human_verdict_<criterion>

    Keys: rows match on the explanation key (system, explanation_id or pair_id, or
    --key) plus example_id when both tables have it, else plus user_id and item_id.
    The scores always need user and item: correlations are grouped by them.

    Scores mode gives Pearson, Spearman and Kendall correlations at seed 001's three
    levels: dataset (all rows), user (mean of per-user correlations) and pair (mean of
    per-(user, item) correlations), with bootstrap 95% intervals; groups where a
    correlation is undefined are left out and counted. Pairwise mode compares A/B/C
    verdicts (C = tie) as in seed 004's Table 2, with ties and without (items where
    neither side says C).

    Writes meta_evaluation.parquet (one row per cell), meta_evaluation.md (seed 001's
    Table 1 or seed 004's Table 2 layout), report.json (counts: rows, joined, filled by
    the null policy, groups) and errors.parquet (unreadable values, missing or repeated
    keys, rows that did not join: file, row and field). No Ray is needed: this is small
    tabular work and runs in this process.

    --ensemble-sweep adds seed 001's Figure 4: per aspect, level, method and ensemble
    size N, the mean, min and max correlation over the subsets of N evaluators whose
    scores are averaged per explanation (a missing score follows --judge-null, member
    by member; with 'drop' it is left out of the mean), and the best and worst subset.

    Examples:

    \b
      rexeval meta-evaluate runs/likert/likert_scores.parquet --human ratings.csv \\
          --out runs/meta
      rexeval meta-evaluate scores.csv --out runs/meta
      rexeval meta-evaluate runs/likert/likert_scores.parquet --human ratings.jsonl.gz \
          --columns user_id=uid,item_id=iid,human_persuasiveness=persuasive --out runs/meta
      rexeval meta-evaluate wide.parquet --human ratings.csv --judge-prefix gpt4_ \\
          --judge-prefix bleu_ --human-null drop --out runs/meta
      rexeval meta-evaluate runs/pairwise/verdicts.parquet --human preferences.csv \\
          --mode pairwise --evaluator qwen --out runs/meta-pairwise
      rexeval meta-evaluate runs/likert/likert_scores.parquet --human ratings.csv \\
          --ensemble-sweep --ensemble-cap 100 --out runs/meta-ensemble
    """
    return run_job("meta-evaluate", MetaEvaluateConfig, partial(run_meta_evaluate, overwrite=overwrite), config_file,
                   flags, ray=False, show=_show, outputs=_outputs, notes=_notes)


def _show(cfg, report: dict) -> None:
    click.echo("")
    click.echo(report["markdown"].split("\n## ")[0].rstrip())
    if "ensemble_markdown" in report:
        click.echo("")
        click.echo(report["ensemble_markdown"].split("\n## ")[0].rstrip())


def _outputs(cfg, report: dict) -> dict[str, str]:
    names = {"results": RESULTS_FILE, "table": TABLE_FILE, "report": REPORT_FILE, "sweep": SWEEP_FILE,
             "sweep csv": SWEEP_CSV, "sweep md": SWEEP_TABLE, "figure": SWEEP_FIGURE, "errors": ERRORS_FILE}
    return {k: f"{cfg.out}/{name}" for k, name in names.items() if name in report["outputs"]}


def _notes(cfg, report: dict) -> list[str]:
    notes = []
    if not report["counts"]["joined"]:
        notes.append("no rows could be used: check the key columns (--key, --user-col, --item-col)")
    if report["counts"]["errors"]:
        notes.append(f"{report['counts']['errors']} row(s) or value(s) could not be used; see {cfg.out}/{ERRORS_FILE}")
    notes += (report.get("ensemble_sweep") or {}).get("notes", [])
    return notes


def main():  # python -m ray_jobs.meta_evaluate
    meta_evaluate_cmd()


if __name__ == "__main__":
    main()
