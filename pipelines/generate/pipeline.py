"""The `generate train` driver: prepare the data, run (or restore) the Tune experiment,
keep the best epoch's checkpoint where `generate run` finds it.

PEPLER and XRec get their backbone from the profile (roles generator_lm and
generator_llm, or `--model ROLE=PATH`), and their targets are tokenised by it. XRec's
inputs are prepared first, each resumable on its own: LightGCN is trained as a Tune trial
(`tune/lightgcn/`, `pipelines/generate/collab.py`), the user and item profiles are
written by the profile's `llm` (`profiles/`, `pipelines/generate/profiles.py`), and both
are put beside the examples as `data/extras.npz`.

Output folder:
- `data/` (the prepared arrays, vocabulary and errors; `pipelines/generate/data.py`);
- `tune/<model>-<target>/` the Tune experiment (a re-run restores it: finished trials are
  kept, an interrupted one resumes from its last epoch checkpoint);
- `best/` the best checkpoint over all trials and epochs by the validation value
  `select` names (loss, ppl or text_rating; the preset's by default), with everything
  `generate run` needs to rebuild it;
- `train.json`: settings, the best trial and epoch, its validation numbers, every trial.

The split, the ground truth and the output folder may be local folders or URIs
(`rexeval/storage.py`): the trials (on any node) load `data/` and keep their
checkpoints in Tune's storage under `tune/`, and the best one is copied to `best/` there.
The driver plans from `data/index.json` and does not load the arrays.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from rexeval.models.generators.base import generator_class
from rexeval.models.generators.lm import encode_plain
from rexeval.models.generators.presets import check_preset
from rexeval.models.profiles import load_profile
from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.io import (config_hash, parquet_schema, read_table, remove_entries, table_files,
                                       write_json_atomic)
from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.pipelines.core.schema import SPLIT_NAMES, validate_table
from rexeval.pipelines.core.stage import cpu_share
from rexeval.storage import Location, location
from rexeval.pipelines.core.tune import best_checkpoint, read_checkpoint, trial_table
from rexeval.pipelines.generate.config import GENERATE_TRAIN_OUTPUTS, TrainJob
from rexeval.pipelines.generate.data import EXTRAS, GenData, prepare, read_index, write_npz
from rexeval.pipelines.generate.settings import METRICS, resolve_settings
from rexeval.pipelines.generate.train import build_tuner

NO_PROFILE = "(no profile: no training review)"

BEST = GENERATE_TRAIN_OUTPUTS.best


def _default_cpus(job: TrainJob) -> float:
    """One trial alone gets every CPU (torch threads); a search gives each trial one."""
    if job.cpus_per_trial:
        return job.cpus_per_trial
    return 1 if job.grid or job.num_samples > 1 else cpu_share(1)


def shown(out: str, *parts: str) -> str:
    """A path under the output folder as the report and messages name it: the folder as
    the user gave it (a URI unchanged), then `parts`."""
    return "/".join([given_text(out).rstrip("/"), *parts])


def keep_best(checkpoint, best_dir: Location) -> dict:
    """Copy Tune's best checkpoint (in its storage, local or remote) to `best_dir`, in
    place of any earlier one; its saved state."""
    best_dir.rmtree()
    best_dir.mkdir()  # a local copy needs its folder (pyarrow makes only the ones below it)
    with checkpoint.as_directory() as d:  # a remote checkpoint is copied down once
        state = read_checkpoint(d)
        best_dir.upload(d)
    return state


def check_split(split: str) -> None:
    """A split folder whose three tables exist and are REVIEWS Parquet (their footers
    read, not their rows): what training needs before it replaces anything."""
    root = location(split)
    for name in SPLIT_NAMES:
        if not (root / name).exists():
            raise FileNotFoundError(f"{given_text(split)} has no {name}/ table: --data takes a `rexeval split` "
                                    "output folder (train/, valid/, test/)")
        for f in table_files(root / name):
            validate_table(parquet_schema(f).empty_table(), "reviews", source=str(f))


def run_train(job: TrainJob, progress: Callable[[str], None] = print, trainable=None) -> dict:
    """Train (or finish training) and return the report written to `train.json`."""
    from rexeval.pipelines.core.reach import require_reachable

    t0 = time.time()
    out = location(job.out)
    require_reachable(out, what="the generate train output folder")  # the trials write there from any node
    s = resolve_settings(job.model, job.settings, job.preset)  # the config checked the settings and the grid
    if job.overwrite and out.exists():
        check_split(job.data)  # the earlier output stays when the new run could not start
        kept = remove_entries(out, GENERATE_TRAIN_OUTPUTS.paths())  # what this job wrote, nothing else
        if kept:
            progress(f"  --overwrite left {len(kept)} entr(ies) that are not this job's as they are: "
                     f"{', '.join(kept[:5])}")
    # Review targets keep the preset's length; with `paper`, long explanation targets get
    # one from their own lengths unless --set max_words says otherwise (`seed000` cuts
    # every target at its 128).
    fixed = job.target == "review" or check_preset(job.preset).fixed_length
    max_words = job.settings.get("max_words", s["max_words"] if fixed else None)
    cls = generator_class(s["model"])
    if cls.ROLE and not s.get("lm"):
        s["lm"] = backbone(job, cls.ROLE)
        progress(f"  backbone ({cls.ROLE}): {s['lm']}")
    folder = prepare(job.data, out, target=job.target, truth=job.truth, vocab_size=s["vocab_size"],
                     max_words=max_words, tokenizer=s["lm"] if cls.ROLE else None, progress=progress)
    if cls.INPUTS:
        prepare_inputs(job, s, folder, progress)
    index = read_index(folder)
    if index["counts"]["valid"] == 0:
        raise ValueError(f"{job.data} has no validation examples with a target: the best epoch is chosen "
                         "on them (see data/errors.parquet for the reviews without one)")
    s["max_words"] = int(index["max_words"])
    name = job.experiment_name()
    cpus = _default_cpus(job)
    metric = METRICS[s["select"]]
    progress(f"  Tune experiment {name}: {s['model']}, preset {job.preset} ({s['epochs']} epochs at most, "
             f"patience {s['patience']}), "
             f"grid {job.grid or 'none'}, {cpus:g} CPU / {job.gpus_per_trial:g} GPU per trial, "
             f"best epoch by {metric}")
    tuner, plan = build_tuner(s, folder, out / "tune", name, grid=job.grid, trainable=trainable,
                              num_samples=job.num_samples, asha=job.asha and bool(job.grid or job.num_samples > 1),
                              grace_period=job.grace_period, cpus_per_trial=cpus,
                              gpus_per_trial=job.gpus_per_trial, max_concurrent=job.max_concurrent,
                              max_failures=job.max_failures, progress=progress)
    results = tuner.fit()
    errors = [r for r in results if r.error is not None]
    trials = trial_table(results, metric, sorted(job.grid), mode="min")
    best_result, ck = best_checkpoint(results, metric, mode="min")
    state = keep_best(ck, out / BEST)
    df = best_result.metrics_dataframe
    row = df[df["epoch"] == state["epoch"]].iloc[-1].to_dict()
    best = {"config": {k: best_result.config.get(k) for k in sorted(job.grid)}, "epoch": int(state["epoch"]),
            **{k: float(row[k]) for k in ("val_loss", "val_ppl", "val_text_rating", "val_rmse") if k in row},
            "checkpoint": shown(job.out, BEST)}
    progress(f"  best: {best['config'] or 'the only configuration'} at epoch {best['epoch']} (validation loss "
             f"{best['val_loss']:.4f}, perplexity {best['val_ppl']:.2f}"
             + (f", RMSE {best['val_rmse']:.4f}" if "val_rmse" in best else "") + ")")
    report = {"model": s["model"], "target": job.target, "experiment": shown(job.out, "tune", name),
              "settings": state["settings"], "best": best, "trials": trials, "trial_errors": len(errors),
              "data": index["counts"], "plan": {k: plan[k] for k in ("resources", "device", "scheduler")},
              "seconds": round(time.time() - t0, 2), "job": job.model_dump(),
              "config_hash": config_hash(job.model_dump(exclude={"out", "overwrite"}))}
    write_json_atomic(out / GENERATE_TRAIN_OUTPUTS.report, report)
    return report


def backbone(job: TrainJob, role: str) -> str:
    """Where the profile's (or the `--model ROLE=...` override's) pretrained LM is (a
    model URI as itself: each trial copies it on its own node, `refs.on_node`)."""
    return load_profile(job.profile, job.models).shipped(role)


def llm_settings(job: TrainJob) -> LLMJobSettings:
    return LLMJobSettings(**{k: getattr(job, k) for k in LLMJobSettings.model_fields})


def prepare_inputs(job: TrainJob, s: dict, folder: Location, progress: Callable[[str], None] = print) -> None:
    """XRec's inputs beside the examples (see the module docstring): `data/extras.npz`
    holds the LightGCN user and item embeddings and the profiles' LM token ids (a title
    line first for items that have one), each profile cut to `profile_tokens`."""
    from rexeval.pipelines.generate.collab import train_collab
    from rexeval.pipelines.generate.profiles import read_profiles, write_profiles

    out = location(job.out)
    data = GenData.load(folder)
    cls = generator_class(s["model"])
    stamp = folder / "extras.json"
    profiles = write_profiles(job.data, str(out / "profiles"), llm_settings(job).with_resolved_cache(str(out)),
                              max_reviews=s["profile_reviews"], max_tokens=s["profile_length"], progress=progress)
    want = config_hash({"keys": {k: s[k] for k in cls.DATA_KEYS}, "profiles": profiles.get("config_hash")})
    if stamp.exists() and stamp.read_json().get("config_hash") == want and (folder / EXTRAS).exists():
        return
    users, items = train_collab(folder, s, out / "tune", cpus=_default_cpus(job), gpus=job.gpus_per_trial,
                                progress=progress)
    texts = read_profiles(str(out / "profiles"))
    titles: dict[str, str] = {}
    for name in SPLIT_NAMES:
        t = read_table(location(job.data) / name, "reviews", columns=["item_id", "item_title"]).to_pylist()
        for r in t:
            if r["item_title"] and r["item_id"] not in titles:
                titles[r["item_id"]] = r["item_title"]
    tok = data.vocab.tokenizer
    cap = int(s["profile_tokens"])

    def ids(text: str) -> list[int]:
        return encode_plain(tok, " ".join(text.split()))[:cap]

    user_text = [ids(texts.get(("user", u)) or NO_PROFILE) for u in data.index["users"]]
    item_text = [ids((f"{titles[i]}. " if i in titles else "") + (texts.get(("item", i)) or NO_PROFILE))
                 for i in data.index["items"]]
    missing = sum(("user", u) not in texts for u in data.index["users"]) + sum(
        ("item", i) not in texts for i in data.index["items"])

    def flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        return np.array([t for r in rows for t in r], dtype=np.int64), offsets

    ut, uo = flat(user_text)
    it, io = flat(item_text)
    write_npz(folder / EXTRAS, collab_user=users, collab_item=items, user_text=ut, user_text_offsets=uo,
              item_text=it, item_text_offsets=io)  # written whole
    write_json_atomic(stamp, {"config_hash": want, "profiles": shown(job.out, "profiles"), "without_profile": missing})
    progress(f"  XRec inputs: LightGCN embeddings of {len(users):,} users and {len(items):,} items, profiles "
             f"({missing:,} user(s)/item(s) without one: {NO_PROFILE!r} stands in)")
