"""The `rexeval star` jobs: build the benchmark, run baselines, train, evaluate.

Folders (every job writes a manifest.json with its settings and counts):
- build: `<out>/{interactions,triplets,candidates,errors}/part-00000.parquet`,
  `stats.json` and `stats.md` (seed 002 Table 6, before and after clustering);
- baselines / train / evaluate write `<run>/results/<method>/per_interaction.parquet`
  (one row per test interaction and level, one column per metric) and `summary.json`;
  `star train --seeds N` (N > 1) writes every run's rows there with a `run` column (the
  seed) and their mean in summary.json; `rexeval star report` reads any number of those.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rexeval.pipelines.star.config import BuildConfig, EvalSettings, TrainJob
from rexeval.pipelines.core.io import (
    ShardedOutput,
    config_hash,
    table_files,
    unset_fields,
    write_json_atomic,
)
from rexeval.storage import is_uri, local_copy, location
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.star.data import StarData
from rexeval.pipelines.star.evaluate import evaluate, write_results
from rexeval.pipelines.star.outputs import BUILD_TABLES, STAR_BASELINES_OUTPUTS, STAR_BUILD_OUTPUTS, STAR_TRAIN_OUTPUTS

BUILD_JOB = "star-build"


def _joined(text: str, part: str) -> str:
    """`text`/`part` written as the user's path is: a URI by '/', a local path by pathlib."""
    return f"{text.rstrip('/')}/{part}" if is_uri(text) else str(Path(text) / part)


def _reviews_table(given: str) -> str:
    """The reviews table of an ingest folder (its reviews/) or the table itself, as text
    in the form `given` has (a manifest records it; relative stays relative)."""
    from rexeval.pipelines.core.inputs import given_text, reviews_path

    text = given_text(given)
    return text if reviews_path(given) == location(given) else _joined(text, "reviews")


def _reviews_source(cfg: BuildConfig) -> str:
    if cfg.reviews:
        return _reviews_table(cfg.reviews)
    manifest = location(cfg.statements) / "manifest.json"
    if manifest.exists():
        src = manifest.read_json().get("config", {}).get("input")
        if src and location(src).exists():
            return _reviews_table(src)
    raise FileNotFoundError(f"cannot tell which reviews {cfg.statements} was extracted from; "
                            "pass --reviews INGEST_FOLDER")


def run_build(cfg: BuildConfig, overwrite: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Build the benchmark on Ray workers (`star.build_ray`): the inputs are read as Ray
    Datasets and the tables written by Ray tasks; this driver holds counts."""
    from rexeval.pipelines.core.inputs import dataset_stage, of_stage, statement_files, table_rows
    from rexeval.pipelines.core.io import DONE_DIR, remove_entries
    from rexeval.pipelines.core.runtime import key_groups, read_dataset
    from rexeval.pipelines.star import build_ray
    from rexeval.pipelines.star.build import format_table6

    t0 = time.time()
    if location(cfg.statements).suffix == ".jsonl":  # hand-written statements (pipelines/sample/statements.jsonl)
        statements, stage, rows = _annotated(cfg.statements)
    else:
        files = statement_files(cfg.statements)
        columns = ["statement_id", "review_id", "statement", "sentiment", "stage"]
        statements = read_dataset(files, "statements", columns=columns, order=build_ray.ORDER,
                                  rename=cfg.columns).materialize()
        stage, rows = dataset_stage(statements, cfg.stage), table_rows(files) or 0
    reviews_src = _reviews_source(cfg)
    conf = {**cfg.model_dump(exclude={"out"} | unset_fields(cfg, "columns")), "stage": stage,
            "reviews": str(reviews_src)}
    job = ShardedJob(ShardedOutput(cfg.out, BUILD_JOB, conf, list(BUILD_TABLES), owns=STAR_BUILD_OUTPUTS.paths()),
                     1, overwrite=overwrite, progress=progress)
    if (manifest := job.finished("star build")) is not None:
        return manifest
    out = job.output
    statements = statements.map_batches(of_stage, fn_kwargs={"stage": stage}, batch_format="pyarrow")
    reviews = read_dataset(reviews_src, "reviews", columns=["review_id", "user_id", "item_id", "timestamp",
                                                            "source", "line"], order=build_ray.ORDER,
                           rename=cfg.columns)
    rows += table_rows(table_files(reviews_src)) or 0
    clusters = canonical = None
    if cfg.clusters:
        cdir = location(cfg.clusters)
        if not (cdir / "clusters").exists() or not table_files(cdir / "clusters"):
            raise FileNotFoundError(f"{cfg.clusters}: no clusters/ table; is it an `rexeval cluster` output?")
        clusters = read_dataset(cdir / "clusters", "clusters", columns=["statement_id", "cluster_id"],
                                order=build_ray.ORDER)
        canon = table_files(cdir / "canonical") if (cdir / "canonical").exists() else []
        if canon and table_rows(canon) != 0:  # an unreadable part (None) is named by the read
            canonical = read_dataset(canon, "canonical", columns=["cluster_id", "statement", "sentiment"])
    remove_entries(out.root, [*BUILD_TABLES, DONE_DIR])  # what an interrupted run left is written anew
    built = build_ray.build(out, str(cfg.statements), statements, reviews, clusters, canonical,
                            cfg.min_user_interactions, key_groups(rows))
    counts = built["counts"]
    progress(f"  {counts['statement_rows']:,} {stage} statement row(s) from {cfg.statements}")
    stats = {"before": built["before"]}
    if clusters is not None:
        stats["after"] = built["after"]
    write_json_atomic(location(cfg.out) / STAR_BUILD_OUTPUTS.stats, {cfg.name: stats})
    (location(cfg.out) / STAR_BUILD_OUTPUTS.stats_md).write_text(format_table6({cfg.name: stats}))
    manifest = out.finish(built["shards"], counts=counts, stage=stage, seconds=round(time.time() - t0, 2),
                          clustered=clusters is not None)
    return manifest


def _annotated(path: str):
    """Hand-written statements (a JSON-lines file, small: read here) as a Ray Dataset."""
    import numpy as np
    import pyarrow as pa

    from rexeval.pipelines.core.inputs import statements_from_annotations
    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.star.build_ray import ORDER

    if not location(path).exists():
        raise FileNotFoundError(f"statements input not found: {path}")
    table = statements_from_annotations(path)
    table = table.append_column(ORDER, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return init_ray().data.from_arrow(table), "verified", table.num_rows


# -- baselines --------------------------------------------------------------------------


def run_baselines(cfg: EvalSettings, methods: list[str], progress: Callable[[str], None] = print) -> dict:
    """Fit each popularity baseline on train and evaluate it on `split` at every level."""
    import rexeval.models.recommenders.popularity  # noqa: F401  (registers the baselines)
    from rexeval.models.recommenders.base import ranker_class

    data = StarData.load(cfg.data)
    summaries = {}
    for method in methods:
        t = time.time()
        ranker = ranker_class(method).fit(data, seed=cfg.seed)
        res = evaluate(ranker, data, split=cfg.split, levels=cfg.levels, ks=cfg.ks, device=cfg.device,
                       ndcg_norm=cfg.ndcg_norm, batch_size=cfg.batch_size, progress=progress)
        write_results(res, data, method.upper(), cfg.out, {"split": cfg.split, "data": cfg.data,
                                                            "ndcg_norm": cfg.ndcg_norm, "seed": cfg.seed,
                                                            "seconds": round(time.time() - t, 2)})
        summaries[method.upper()] = {lv: r.summary for lv, r in res.items()}
        line = ", ".join(f"{lv} N@10 {r.summary.get('ndcg@10', float('nan')):.4f}" for lv, r in res.items())
        progress(f"  {method.upper():9s} {line} ({time.time() - t:.1f} s)")
    write_json_atomic(location(cfg.out) / STAR_BASELINES_OUTPUTS.report, {
        "methods": summaries, "config": cfg.model_dump(),
        "config_hash": config_hash({**cfg.model_dump(exclude={"out"}), "methods": [m.upper() for m in methods]})})
    return summaries


def rank_checkpoint(cfg: EvalSettings, checkpoint: str | Path, features_path: str | None = None,
                    progress: Callable[[str], None] = print, data: StarData | None = None):
    """Rank `cfg.split` at every level with a trained model checkpoint (a Tune epoch
    checkpoint folder, local or by URI): (data, per-level results, the checkpoint's state)."""
    from rexeval.pipelines.core.tune import read_checkpoint
    from rexeval.pipelines.star.train import load_checkpoint_model, load_features

    data = StarData.load(cfg.data) if data is None else data
    with local_copy(checkpoint) as local:  # torch reads the state from the local disk
        state = read_checkpoint(local, cfg.device)
    if features_path is None:  # BPER+: the features the model was trained with
        features_path = state.get("features_path") if state["settings"]["model"] == "bper+" else None
        if features_path and not location(features_path).exists():
            raise FileNotFoundError(f"{checkpoint} was trained with statement features {features_path}, "
                                    "which is gone; pass --features")
    features = load_features(features_path) if features_path else None
    model, state = load_checkpoint_model(checkpoint, data, features, cfg.device, state=state)
    res = evaluate(model, data, split=cfg.split, levels=cfg.levels, ks=cfg.ks, device=cfg.device,
                   ndcg_norm=cfg.ndcg_norm, batch_size=cfg.batch_size, progress=progress)
    return data, res, state


def evaluate_checkpoint(cfg: EvalSettings, checkpoint: str, method: str | None = None,
                        features_path: str | None = None, progress: Callable[[str], None] = print) -> dict:
    """Evaluate a trained model checkpoint (a Tune epoch checkpoint folder)."""
    t = time.time()
    data, res, state = rank_checkpoint(cfg, checkpoint, features_path, progress)
    name = method or state["settings"]["model"].upper()
    write_results(res, data, name, cfg.out, {"split": cfg.split, "data": cfg.data, "checkpoint": str(checkpoint),
                                             "settings": state["settings"], "epoch": state["epoch"],
                                             "ndcg_norm": cfg.ndcg_norm, "seconds": round(time.time() - t, 2)})
    return {lv: r.summary for lv, r in res.items()}


# -- training ---------------------------------------------------------------------------


def run_train(job: TrainJob, progress: Callable[[str], None] = print, trainable=None) -> dict:
    """Tune (or restore) the experiment, evaluate each run's best checkpoint on test, and
    for a sweep evaluate every trial's best checkpoint and draw the sensitivity plot.

    `job.seeds` > 1 (seed 002 reports the mean of 3 runs): the seed is one more grid
    dimension, so trials = configurations x seeds, and the scheduler is FIFO (ASHA would
    stop one seed's trials because another seed did better). Each seed is a run: the best
    checkpoint of its trials, by the validation metric, is evaluated on test;
    results/<MODEL>/ holds every run's rows (a `run` column, the seed), the report's
    `test` is the mean over runs and `runs` has each run's best and test summary. A
    sweep's points are then means over seeds, with their spread.
    """
    from rexeval.pipelines.core.tune import best_checkpoint, trial_table
    from rexeval.pipelines.star.evaluate import mean_summary, write_run_results
    from rexeval.pipelines.star.report import plot_sensitivity
    from rexeval.pipelines.star.train import TrainSettings, run_tune, statement_features

    t0 = time.time()
    settings = TrainSettings(**job.settings)  # the config checked the settings, grid, sweep and seeds
    seeds = job.seed_list(settings.seed)
    grid = dict(job.grid)
    if len(seeds) > 1:
        grid["seed"] = seeds
    data = StarData.load(job.data)
    if len(data.rows("valid")) == 0:
        raise ValueError(f"{job.data} has no validation interactions: model selection needs them "
                         "(users need at least 3 interactions)")
    features_path = None
    if settings.model == "bper+":
        from rexeval.models.profiles import load_profile

        ref = load_profile(job.profile, overrides=job.models).require("statement_encoder")
        features_path = statement_features(data, ref, _joined(job.out, STAR_TRAIN_OUTPUTS.work),
                                           progress=progress)
    name = job.experiment_name(settings.model)
    # A sensitivity sweep trains every value fully; several seeds are independent runs.
    asha = job.asha and not job.sweep and len(seeds) == 1
    progress(f"  Tune experiment {name}: {settings.model}, grid {grid or 'none'}, "
             f"{'ASHA' if asha else 'FIFO'} scheduler, {job.cpus_per_trial:g} CPU / {job.gpus_per_trial:g} GPU "
             "per trial")
    results = run_tune(settings, job.data, _joined(job.out, STAR_TRAIN_OUTPUTS.tune), name, grid=grid,
                       num_samples=job.num_samples, asha=asha, grace_period=job.grace_period,
                       cpus_per_trial=job.cpus_per_trial, gpus_per_trial=job.gpus_per_trial,
                       max_concurrent=job.max_concurrent, max_failures=job.max_failures,
                       features_path=features_path,
                       trainable=trainable, progress=progress)
    metric = settings.metric_key
    errors = [r for r in results if r.error is not None]
    trials = trial_table(results, metric, sorted(grid))
    device = "cuda" if job.gpus_per_trial else "cpu"
    method = settings.model.upper()
    ecfg = EvalSettings(data=job.data, out=job.out, levels=job.levels, ndcg_norm=job.ndcg_norm, device=device)
    runs = []
    for seed in seeds:
        t = time.time()
        mine = results if len(seeds) == 1 else [r for r in results if r.config.get("seed") == seed]
        best_result, ck = best_checkpoint(mine, metric)
        with ck.as_directory() as d:
            _, res, state = rank_checkpoint(ecfg, d, features_path, progress, data=data)
            checkpoint = str(d) if location(job.out).is_local else _checkpoint_uri(ck, job.out)
        best = {"config": {k: best_result.config.get(k) for k in sorted(job.grid)}, "epoch": state["epoch"],
                metric: float(best_result.metrics_dataframe[metric].max()),
                "checkpoint": ck.path if location(job.out).is_local else _checkpoint_uri(ck, job.out)}
        runs.append({"seed": seed, "best": best, "res": res, "checkpoint": checkpoint, "state": state,
                     "seconds": round(time.time() - t, 2)})
        progress(f"  {'best' if len(seeds) == 1 else f'run seed {seed}, best'}: "
                 f"{best['config'] or 'the only configuration'} at epoch {state['epoch']} "
                 f"({metric} {best[metric]:.4f})")
    tests = [{lv: r.summary for lv, r in run["res"].items()} for run in runs]
    evaluated = {"split": ecfg.split, "data": ecfg.data}
    if len(runs) == 1:
        run = runs[0]
        write_results(run["res"], data, method, job.out, {**evaluated, "checkpoint": run["checkpoint"],
                                                          "settings": run["state"]["settings"],
                                                          "epoch": run["state"]["epoch"],
                                                          "ndcg_norm": ecfg.ndcg_norm, "seconds": run["seconds"]})
    else:
        write_run_results({run["seed"]: run["res"] for run in runs}, data, method, job.out,
                          {**evaluated, "ndcg_norm": ecfg.ndcg_norm,
                           "seconds": round(sum(run["seconds"] for run in runs), 2)},
                          {run["seed"]: {"checkpoint": run["checkpoint"], "settings": run["state"]["settings"],
                                         "epoch": run["state"]["epoch"]} for run in runs})
    sensitivity = None
    if job.sweep:
        sensitivity = _sensitivity(job, results, metric, data, features_path, device, multi=len(seeds) > 1)
        plot = _joined(job.out, STAR_TRAIN_OUTPUTS.sensitivity.format(name=name))
        plot_sensitivity(sensitivity, job.sweep, method, plot)
    top = max(runs, key=lambda run: run["best"][metric])  # one run: that one
    report = {"experiment": _joined(_joined(job.out, STAR_TRAIN_OUTPUTS.tune), name), "best": top["best"],
              "trials": trials, "trial_errors": len(errors), "test": tests[0] if len(runs) == 1 else mean_summary(tests),
              "sensitivity": sensitivity, "seconds": round(time.time() - t0, 2), "job": job.model_dump(),
              "config_hash": config_hash(job.model_dump(exclude={"out"}))}
    if len(runs) > 1:
        report["seeds"] = seeds
        report["runs"] = [{"seed": run["seed"], "best": run["best"], "test": test} for run, test in zip(runs, tests)]
    write_json_atomic(location(job.out) / STAR_TRAIN_OUTPUTS.report.format(name=name), report)
    return report


def _checkpoint_uri(ck, out: str) -> str:
    """A Tune checkpoint under a URI `out` as a URI (Tune names it by its path inside
    the bucket; `star evaluate --checkpoint` takes the URI)."""
    return f"{out.split('://', 1)[0]}://{ck.path.lstrip('/')}"


def _sensitivity(job: TrainJob, results, metric: str, data: StarData, features_path: str | None, device: str,
                 multi: bool) -> list[dict]:
    """Figure 3's points: P/R/NDCG@10 on test of every trial's best checkpoint, by the
    swept value; with several seeds, the mean over seeds per configuration and its spread
    (`<col>_std` sample standard deviation, `_min`, `_max`, `runs`)."""
    from rexeval.pipelines.star.report import mean_over_runs
    from rexeval.pipelines.star.train import load_checkpoint_model, load_features

    features = load_features(features_path) if features_path else None
    keys = sorted(job.grid) if multi else [job.sweep]
    rows = []
    for r in results:
        if r.error is not None or not r.best_checkpoints:
            continue
        rck = r.get_best_checkpoint(metric, "max")
        with rck.as_directory() as d:
            model, _ = load_checkpoint_model(d, data, features, device)
        res = evaluate(model, data, levels=job.levels, ks=(10,), device=device, ndcg_norm=job.ndcg_norm)
        rows.append({**{k: r.config[k] for k in keys}, **({"run": r.config["seed"]} if multi else {}),
                     **{f"{lv}_{m}": res[lv].summary[f"{m}@10"] for lv in job.levels
                        for m in ("precision", "recall", "ndcg")}})
    if multi and rows:
        rows = mean_over_runs(rows, keys)
    return sorted(rows, key=lambda row: row[job.sweep])
