"""`rexeval star build|baselines|train|evaluate|report` (python -m ray_jobs.star):
the statement-ranking benchmark of seed 002."""
from __future__ import annotations

from functools import partial

import click

from rexeval.storage import location
from rexeval.pipelines.star.config import BuildConfig, EvalSettings, TrainJob as StarTrainJob
from rexeval.ray_jobs.common import (
    defaults_from,
    ListedOption,
    RegistryName,
    Where,
    columns_option,
    config_option,
    parse_backend_options,
    parse_grid,
    run_job,
    tune_options,
    user_errors,
)

LEVEL_CHOICE = click.Choice(["global", "item", "user"])
SEED_BASELINES = ["random", "userpop", "itempop", "globalpop"]
"""The popularity baselines of seed 002 (eq. 2-4), run when no --method is given."""


def _rankers():
    """The statement rankers' registry (imported when a name is checked or listed: torch)."""
    from rexeval.models.recommenders.base import RANKERS

    return RANKERS


def _declared_rankers(trainable: bool) -> list[str]:
    """The rankers' names for --help, sorted. Read from their modules' source (no torch;
    a trainable one's class derives from TrainableRanker directly, `registry.declared_names`)
    unless the registry is loaded already (torch is then too), which also knows the
    rankers registered at run time."""
    import sys

    if "rexeval.models.recommenders.base" in sys.modules:
        reg = _rankers()
        return [n for n in reg.names() if _trainable(reg.lookup(n)) == trainable]
    from rexeval.models.recommenders import SCAN
    from rexeval.registry import declared_names

    return sorted(n for n, bases in declared_names(*SCAN).items() if ("TrainableRanker" in bases) == trainable)


def _trainable(ranker) -> bool:
    from rexeval.models.recommenders.base import TrainableRanker

    return isinstance(ranker, type) and issubclass(ranker, TrainableRanker)


@click.group("star")
def star_group():
    """Statement ranking (seed 002, STAR): build the benchmark from clustered statements,
    rank with popularity baselines, BPER+ and ExpGCN (trained on Ray Tune), report Table 1.

    Typical run:

      rexeval star build runs/mi/star --clusters runs/mi/clusters --out runs/mi/bench

      rexeval star baselines runs/mi/bench --out runs/mi/rank

      rexeval star train runs/mi/bench --model expgcn --out runs/mi/rank

      rexeval star report runs/mi/rank --name MI
    """


@defaults_from(BuildConfig)
@star_group.command("build")
@click.argument("statements", required=False, type=Where())
@click.option("--clusters", help="`rexeval cluster` output: statements count under their cluster's "
                                 "representative (omit for the unclustered benchmark).")
@click.option("--reviews", help="Reviews the statements came from (ingest output; default: the "
                                "extract job's input, read from its manifest).")
@click.option("--stage", type=click.Choice(["auto", "triplet", "candidate", "verified"]),
              help="Statement stage to use (default {default}: verified if any, else triplet).")
@click.option("--min-user-interactions", type=int,
              help="Users with fewer interactions are not evaluated; all theirs go to train (default {default}).")
@click.option("--name", help="Dataset name in the statistics table (default STAR).")
@columns_option
@click.option("--out", "-o", help="Output folder.")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def build_cmd(overwrite, config_file, **flags):
    """Build the ranking benchmark: interactions (reviews with statements), their
    statements (S_ui, deduplicated), a leave-last-two split per user, and Table 6's
    statistics before and after clustering.

    STATEMENTS is an `rexeval extract` folder, a statements table (Parquet, CSV, TSV, or
    JSON lines gzipped as .jsonl.gz), or a .jsonl file of hand-written statements per
    review (the layout of pipelines/sample/statements.jsonl; give --reviews). --reviews
    may be a reviews table in any of those formats too; --columns maps your column
    names to ours in both.

    Outputs: interactions/, triplets/, candidates/ (statement index -> cluster id and
    text), errors/ (statement rows that could not be placed, with the reason),
    stats.md / stats.json, manifest.json.

    Examples:

      rexeval star build runs/mi/star --clusters runs/mi/clusters --out runs/mi/bench

      rexeval star build pipelines/sample/statements.jsonl --reviews runs/demo/ingest --out runs/demo/bench0

      rexeval star build my_statements.csv --reviews runs/mi/ingest --columns statement=text --out runs/mi/bench1
    """
    from rexeval.pipelines.star.pipeline import run_build

    return run_job("star build", BuildConfig, partial(run_build, overwrite=overwrite), config_file, flags, ray=False,
                   show=lambda cfg, m: click.echo((location(cfg.out) / "stats.md").read_text()),
                   counts=lambda cfg, m: {k: m["counts"].get(k, 0) for k in (
                       "statement_rows", "statement_rows_used", "statement_rows_merged", "error_rows", "interactions",
                       "train", "valid", "test", "users", "items", "statements", "triplets")},
                   outputs=lambda cfg, m: {n: f"{cfg.out}/{n}"
                                           for n in ("interactions", "triplets", "candidates", "errors")}
                   | {"stats": f"{cfg.out}/stats.md"},
                   notes=lambda cfg, m: [("statement_rows = used + errors; merged = rows whose statement was already "
                                          "in the same interaction (counted once, seed 002 eq. 2-4)")])


_EVAL_OPTIONS = [
    click.option("--out", "-o", help="Run folder; results/<METHOD>/ are written there."),
    click.option("--level", "levels", multiple=True, type=LEVEL_CHOICE,
                 help="Candidate level, repeatable (default: global and item)."),
    click.option("--split", type=click.Choice(["valid", "test"]), help="Split to rank (default {default})."),
    click.option("--ndcg-norm", type=click.Choice(["ideal", "k"]),
                 help="NDCG normaliser: ideal DCG of min(k, |S_ui|) positives (default; what the "
                      "seed's Table 1 numbers follow) or all k positions (eq. 1 read literally)."),
    click.option("--device", help="Torch device for ranking (default {default}; cuda on GPU machines)."),
    click.option("--batch-size", type=int, help="Interactions per ranking step (default: ~32M scores)."),
]


def eval_options(fn):
    for opt in reversed(_EVAL_OPTIONS):
        fn = opt(fn)
    return fn


@defaults_from(EvalSettings)
@star_group.command("baselines")
@click.argument("data", required=False, type=Where())
@click.option("--method", "methods", multiple=True, type=RegistryName(_rankers, where=lambda r: not _trainable(r)),
              cls=ListedOption, names=lambda: _declared_rankers(False), help="Baseline, repeatable: {names} (default: " + ", ".join(SEED_BASELINES) + ").")
@click.option("--seed", type=int, help="RANDOM's seed (default {default}).")
@eval_options
@config_option
@user_errors
def baselines_cmd(methods, config_file, **flags):
    """Rank with RANDOM, USERPOP, ITEMPOP and GLOBALPOP (seed 002 eq. 2-4; counts from the
    training interactions, a statement once per interaction) and score P/R/NDCG/hit@k.

    Example: rexeval star baselines runs/mi/bench --out runs/mi/rank
    """
    from rexeval.pipelines.star.pipeline import run_baselines

    return run_job("star baselines", EvalSettings, partial(run_baselines, methods=list(methods) or SEED_BASELINES),
                   config_file, flags, ray=False, counts=_baseline_counts,
                   outputs=lambda cfg, res: {"results": f"{cfg.out}/results"})


def _baseline_counts(cfg, res: dict) -> dict:
    counts = {}
    for m, levels in res.items():
        for lv, s in levels.items():
            counts[f"{m} {lv} N@10"] = f"{s.get('ndcg@10', float('nan')):.4f}"
    first = next(iter(res.values()))
    for lv, s in first.items():
        counts[f"{lv}: interactions scored"] = s["n_scored"]
        counts[f"{lv}: without positives"] = s["n_without_positives"]
    return counts


@defaults_from(StarTrainJob)
@star_group.command("train")
@click.argument("data", required=False, type=Where())
@click.option("--model", type=RegistryName(_rankers, where=_trainable), cls=ListedOption,
              names=lambda: _declared_rankers(True), help="Model: {names} (default expgcn).")
@click.option("--set", "sets", multiple=True, metavar="SETTING=VALUE",
              help="A training setting, e.g. --set epochs=50 --set dim=64 --set mu=0.7 "
                   "(see the settings list below).")
@tune_options
@click.option("--sweep", help="Sensitivity sweep of one --grid setting (e.g. mu or layers_us): every "
                              "value is trained fully and evaluated on test; writes a Figure 3-style plot.")
@click.option("--seeds", type=click.IntRange(min=1),
              help="Independent runs (default {default}; seed 002 reports the mean of 3): seeds seed, seed+1, ... "
                   "are one more --grid dimension, each seed's best checkpoint (validation NDCG@10) is "
                   "evaluated on test, and `star report` shows the mean ± std over runs. Several seeds use "
                   "the FIFO scheduler (runs are independent).")
@click.option("--cpus-per-trial", type=float, help="CPUs per trial (default {default}).")
@click.option("--profile", help="Model profile for BPER+'s statement encoder (default {default}).")
@click.option("--encoder", help="Statement encoder for BPER+ features (overrides the profile).")
@click.option("--level", "levels", multiple=True, type=LEVEL_CHOICE,
              help="Test levels of the final evaluation (default global and item).")
@click.option("--out", "-o", help="Run folder (tune/, results/<MODEL>/, train-*.json).")
@config_option
@user_errors
def train_cmd(data, model, sets, grids, encoder, config_file, **flags):
    """Train BPER+ or ExpGCN with Ray Tune: BPR with sampled negatives, a checkpoint every
    epoch, model selection by validation NDCG@10 (global level), ASHA early stopping.
    Run the same command again after a crash: the experiment is restored and interrupted
    trials resume from their last checkpoint.

    --seeds N (N > 1) trains N runs with seeds seed..seed+N-1 (weights and negative
    sampling): results/<MODEL>/per_interaction.parquet holds every run's rows with a
    `run` column (the seed), train-*.json the seeds and each run's best and test
    summary; with --sweep each point is the mean over seeds, with min-max error bars.

    Settings (--set / --grid): model, dim, mu, layers (L: user-statement and
    item-statement layers together), layers_us, layers_is, layers_ui, reg,
    rec_weight, lr, batch_size, epochs (default 500), patience (20), seed, select_level,
    select_metric, valid_rows.

    Examples:

      rexeval star train runs/mi/bench --model expgcn --set epochs=100 --out runs/mi/rank

      rexeval star train runs/mi/bench --model bper+ --grid mu=0,0.2,0.4,0.6,0.8,1 --sweep mu --out runs/mi/rank

      rexeval star train runs/mi/bench --model expgcn --grid layers=1,2,3,4,5 --sweep layers --out runs/mi/rank

      rexeval star train runs/toys/bench --model expgcn --grid lr=0.001,0.0005 --gpus-per-trial 1 --out runs/toys/rank

      rexeval star train runs/mi/bench --model expgcn --seeds 3 --out runs/mi/rank
    """
    from rexeval.pipelines.star.pipeline import run_train

    settings = parse_backend_options(sets, "--set")
    if model:
        settings["model"] = model
    models = {"statement_encoder": encoder} if encoder else None
    return run_job("star train", StarTrainJob, run_train, config_file,
                   {"data": data, "settings": settings or None, "grid": parse_grid(grids) or None, "models": models,
                    **flags}, counts=_train_counts, outputs=_train_outputs,
                   notes=lambda job, report: [f"best settings: {report['best']['config'] or 'single configuration'}"])


def _train_counts(job, report: dict) -> dict:
    t = report["test"]
    counts = {"trials": len(report["trials"]), "trials with errors": report["trial_errors"],
              "best epoch": report["best"]["epoch"]}
    runs = report.get("runs") or []
    if runs:
        import numpy as np

        counts["runs (seeds)"] = ", ".join(str(r["seed"]) for r in runs)
        counts["best epoch per run"] = ", ".join(str(r["best"]["epoch"]) for r in runs)
    for lv, s in t.items():
        counts[f"test {lv} N@10"] = f"{s.get('ndcg@10', float('nan')):.4f}"
        if runs:  # the mean over runs, ± their sample standard deviation
            sd = float(np.std([r["test"][lv].get("ndcg@10", float("nan")) for r in runs], ddof=1))
            counts[f"test {lv} N@10"] += f" ± {sd:.4f} (mean of {len(runs)} runs)"
    return counts


def _train_outputs(job, report: dict) -> dict[str, str]:
    name = job.experiment_name(job.settings.get("model", "expgcn"))
    outputs = {"experiment": report["experiment"], "results": f"{job.out}/results",
               "report": f"{job.out}/train-{name}.json"}
    if report.get("sensitivity"):
        outputs["plot"] = f"{job.out}/sensitivity-{name}.png"
    return outputs


@defaults_from(EvalSettings)
@star_group.command("evaluate")
@click.argument("data", required=False, type=Where())
@click.option("--checkpoint", required=True, type=Where(exists=True, file_okay=False),
              help="A Tune epoch checkpoint folder (holds state.pt).")
@click.option("--method", help="Name in the results (default: the model's, e.g. EXPGCN).")
@click.option("--features", type=Where(exists=True, dir_okay=False),
              help="BPER+: the statement-features .npy used in training (under <run>/_work/).")
@eval_options
@config_option
@user_errors
def evaluate_cmd(checkpoint, method, features, config_file, **flags):
    """Evaluate a trained checkpoint on a split at every level.

    Example: rexeval star evaluate runs/mi/bench --checkpoint runs/mi/rank/tune/expgcn/<trial>/checkpoint_000009 --out runs/mi/rank
    """
    from rexeval.pipelines.star.pipeline import evaluate_checkpoint

    return run_job("star evaluate", EvalSettings,
                   partial(evaluate_checkpoint, checkpoint=checkpoint, method=method, features_path=features),
                   config_file, flags, ray=False,
                   counts=lambda cfg, res: {f"{lv} N@10": f"{s.get('ndcg@10', float('nan')):.4f}"
                                            for lv, s in res.items()},
                   outputs=lambda cfg, res: {"results": f"{cfg.out}/results"})


@star_group.command("report")
@click.argument("runs", nargs=-1, required=True, type=Where(exists=True, file_okay=False))
@click.option("--name", "names", multiple=True, help="Dataset name per run (default: folder names).")
@click.option("--k", type=int, default=10, show_default=True, help="Cut-off of the table.")
@click.option("--level", "levels", multiple=True, type=LEVEL_CHOICE, help="Levels (default global, item).")
@click.option("--csv", "csv_path", type=Where(dir_okay=False),
              help="Also write every value with gains, p-values, Cohen's d and Cliff's delta.")
@click.option("--out", "md_path", type=Where(dir_okay=False), help="Also write the Markdown table.")
@user_errors
def report_cmd(runs, names, k, levels, csv_path, md_path):
    """Print seed 002's Table 1 for one or more run folders: P/R/NDCG@k at global and item
    level, the gain of each learned model over the best popularity baseline and its
    paired t-test stars.

    A model trained with --seeds N shows the mean over runs of each run's average
    ± the sample standard deviation over runs (std, min, max and runs are CSV columns);
    its paired t-test pools every run's per-interaction values, each paired with the
    baseline's value on the same interaction.

    Example: rexeval star report runs/toys/rank runs/mi/rank --name Toys --name MI
    """
    from rexeval.pipelines.star.report import effect_details, format_table1, table1

    if names and len(names) != len(runs):
        raise click.UsageError(f"{len(runs)} run(s) but {len(names)} --name value(s)")
    datasets = {(names[i] if names else location(r).name): r for i, r in enumerate(runs)}
    levels = list(levels) or ["global", "item"]
    df = table1(datasets, k=k, levels=levels)
    text = format_table1(df, k=k, levels=levels)
    click.echo(text)
    details = effect_details(df)
    if len(details):
        click.echo("Effect sizes against the best popularity baseline:")
        for r in details.itertuples():
            runs = getattr(r, "runs", float("nan"))
            pooled = f", {int(runs)} runs pooled" if runs == runs and runs > 1 else ""
            click.echo(f"  {r.dataset} {r.method} {r.level} {r.metric}: gain {r.gain:+.5f}, p {r.p:.3g}, "
                       f"Cohen's d {r.cohens_d:+.3f}, Cliff's delta {r.cliffs_delta:+.3f} (n {r.pairs}{pooled})")
    if md_path:
        location(md_path).write_text(text)
    if csv_path:
        location(csv_path).write_text(df.to_csv(index=False))


def main():  # python -m ray_jobs.star
    star_group()


if __name__ == "__main__":
    main()
