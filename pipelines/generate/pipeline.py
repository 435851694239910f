"""The `generate train` driver: prepare the data, run (or restore) the Tune experiment,
keep the best epoch's checkpoint where `generate run` finds it.

Output folder:
- `data/` (the prepared arrays, vocabulary and errors; `pipelines/generate/data.py`);
- `tune/<model>-<target>/` the Tune experiment (a re-run restores it: finished trials are
  kept, an interrupted one resumes from its last epoch checkpoint);
- `best/` the best checkpoint over all trials and epochs by validation loss (or
  perplexity, `--set select=ppl`), with everything `generate run` needs to rebuild it;
- `train.json`: settings, the best trial and epoch, its validation numbers, every trial.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from rexeval.pipelines.core.io import write_json_atomic
from rexeval.pipelines.core.stage import cpu_share
from rexeval.pipelines.core.tune import best_checkpoint, read_checkpoint, trial_table
from rexeval.pipelines.generate.config import TrainJob
from rexeval.pipelines.generate.data import GenData, prepare
from rexeval.pipelines.generate.train import METRICS, build_tuner, resolve_settings, sweepable

BEST = "best"


def _default_cpus(job: TrainJob) -> float:
    """One trial alone gets every CPU (torch threads); a search gives each trial one."""
    if job.cpus_per_trial:
        return job.cpus_per_trial
    return 1 if job.grid or job.num_samples > 1 else cpu_share(1)


def run_train(job: TrainJob, progress: Callable[[str], None] = print, trainable=None) -> dict:
    """Train (or finish training) and return the report written to `train.json`."""
    t0 = time.time()
    out = Path(job.out)
    if job.overwrite and out.exists():
        shutil.rmtree(out)
    s = resolve_settings(job.model, job.settings)
    allowed = sweepable(s["model"])
    for key in job.grid:
        if key not in allowed:
            raise ValueError(f"cannot search {key!r}: not a {s['model']} training setting "
                             f"(sweepable: {', '.join(allowed)}; vocab_size and max_words fix the data)")
    # Review targets keep the original models' length; long explanation targets get one
    # from their own lengths unless --set max_words says otherwise.
    max_words = job.settings.get("max_words", s["max_words"] if job.target == "review" else None)
    folder = prepare(job.data, out, target=job.target, truth=job.truth, vocab_size=s["vocab_size"],
                     max_words=max_words, progress=progress)
    data = GenData.load(folder)
    if data.size("valid") == 0:
        raise ValueError(f"{job.data} has no validation examples with a target: the best epoch is chosen "
                         "on them (see data/errors.parquet for the reviews without one)")
    s["max_words"] = data.max_words
    name = job.experiment_name()
    cpus = _default_cpus(job)
    metric = METRICS[s["select"]]
    progress(f"  Tune experiment {name}: {s['model']} ({s['epochs']} epochs at most, patience {s['patience']}), "
             f"grid {job.grid or 'none'}, {cpus:g} CPU / {job.gpus_per_trial:g} GPU per trial, "
             f"best epoch by {metric}")
    tuner, plan = build_tuner(s, folder, out / "tune", name, grid=job.grid, trainable=trainable,
                              num_samples=job.num_samples, asha=job.asha and bool(job.grid or job.num_samples > 1),
                              grace_period=job.grace_period, cpus_per_trial=cpus,
                              gpus_per_trial=job.gpus_per_trial, max_concurrent=job.max_concurrent,
                              progress=progress)
    results = tuner.fit()
    errors = [r for r in results if r.error is not None]
    trials = trial_table(results, metric, sorted(job.grid), mode="min")
    best_result, ck = best_checkpoint(results, metric, mode="min")
    best_dir = out / BEST
    if best_dir.exists():
        shutil.rmtree(best_dir)
    with ck.as_directory() as d:
        shutil.copytree(d, best_dir)
    state = read_checkpoint(best_dir)
    df = best_result.metrics_dataframe
    row = df[df["epoch"] == state["epoch"]].iloc[-1].to_dict()
    best = {"config": {k: best_result.config.get(k) for k in sorted(job.grid)}, "epoch": int(state["epoch"]),
            **{k: float(row[k]) for k in ("val_loss", "val_ppl", "val_rmse") if k in row},
            "checkpoint": str(best_dir)}
    progress(f"  best: {best['config'] or 'the only configuration'} at epoch {best['epoch']} (validation loss "
             f"{best['val_loss']:.4f}, perplexity {best['val_ppl']:.2f}"
             + (f", RMSE {best['val_rmse']:.4f}" if "val_rmse" in best else "") + ")")
    report = {"model": s["model"], "target": job.target, "experiment": str(out / "tune" / name),
              "settings": state["settings"], "best": best, "trials": trials, "trial_errors": len(errors),
              "data": data.index["counts"], "plan": {k: plan[k] for k in ("resources", "device", "scheduler")},
              "seconds": round(time.time() - t0, 2), "job": job.model_dump()}
    write_json_atomic(out / "train.json", report)
    return report
