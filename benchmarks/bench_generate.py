"""Explanation generators: the Tune trainable against a plain PyTorch loop, and batched
decoding against one example at a time, side by side in one run.

Data: the shared Musical Instruments reviews (`../shared/data`), ingested, split
(temporal 80/10/10) and prepared with the review text as target (seed 000 Table VII;
no LLM needed), PETER's vocabulary and length.

(a) Training: the same model (PETER at the paper's size unless --emsize), the same
    settings, seed and batches, for --epochs epochs:
    - plain: one process, `train_epoch` + `validate` in a for loop, nothing else;
    - tune: `rexeval generate train`'s Tune experiment (one trial, the same CPUs as
      torch threads), a checkpoint and a report per epoch, timed around `Tuner.fit()`
      with Ray already up.
    Both validation curves must be equal (same computation); the ratio of wall times
    is Tune's overhead (target: under 10%).
(b) Decoding: the trained checkpoint decodes --decode-examples test examples greedily,
    in batches of --batch-size and one at a time; the outputs must be identical and the
    ratio is the speed-up of batching (target: at least 5x on a 2-core CPU).

Re-run (results in benchmarks/results/generate.json):

    REXEVAL_SHARED=../shared .venv/bin/python benchmarks/bench_generate.py
    .venv/bin/python benchmarks/bench_generate.py --epochs 1 --emsize 128 --decode-examples 128   # quicker
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("REXEVAL_SHARED", ROOT.parent / "shared"))
CSV = SHARED / "data" / "amazon_musical_instruments_2014_part.csv"


def prepare_data(work: Path) -> Path:
    from rexeval.models.generators.base import generator_class
    from rexeval.pipelines.generate.data import prepare
    from rexeval.pipelines.ingest.config import IngestConfig, SplitConfig
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.split_pipeline import run_split

    quiet = lambda m: None  # noqa: E731
    run_ingest(IngestConfig(inputs=[str(CSV)], out=str(work / "ingest")), progress=quiet)
    run_split(SplitConfig(input=str(work / "ingest"), out=str(work / "split")), progress=quiet)
    d = generator_class("peter").DEFAULTS
    return prepare(work / "split", work / "gen", target="review", truth=None, vocab_size=d["vocab_size"],
                   max_words=d["max_words"], progress=print)


def plain_loop(settings: dict, data_dir: Path, threads: int) -> dict:
    """The same training in one process, no Tune: the baseline of (a)."""
    import torch

    from rexeval.models.generators.base import build_optimizer
    from rexeval.pipelines.generate.data import GenData
    from rexeval.pipelines.generate.train import build_model, train_epoch, validate

    torch.set_num_threads(threads)
    data = GenData.load(data_dir)
    torch.manual_seed(settings["seed"])
    model = build_model(settings, data)
    opt = build_optimizer(settings["optimizer"], model.parameters(), settings["lr"], settings["weight_decay"])
    gen = torch.Generator().manual_seed(settings["seed"])
    best, curve, epochs = float("inf"), [], []
    t0 = time.perf_counter()
    for _ in range(settings["epochs"]):
        t = time.perf_counter()
        train_epoch(model, opt, data, settings["batch_size"], settings["clip"], gen)
        val = validate(model, data, settings["batch_size"])
        epochs.append(time.perf_counter() - t)
        curve.append(round(val["val_loss"], 6))
        if val["val_loss"] < best:
            best = val["val_loss"]
        else:
            for g in opt.param_groups:
                g["lr"] *= settings["lr_decay"]
    return {"seconds": time.perf_counter() - t0, "curve": curve, "epoch_seconds": epochs}


def tune_run(settings: dict, data_dir: Path, storage: Path, threads: int) -> dict:
    from rexeval.pipelines.core.tune import best_checkpoint
    from rexeval.pipelines.generate.train import build_tuner

    tuner, _ = build_tuner(settings, data_dir, storage, "bench", asha=False, cpus_per_trial=threads,
                           progress=lambda m: None)
    t0 = time.perf_counter()
    results = tuner.fit()
    seconds = time.perf_counter() - t0
    r = results[0]
    if r.error is not None:
        raise r.error
    df = r.metrics_dataframe
    _, ck = best_checkpoint(results, "val_loss", mode="min")
    # time_this_iter_s: wall time between two reports, so checkpointing and reporting count.
    return {"seconds": seconds, "epoch_seconds": df["time_this_iter_s"].tolist(),
            "curve": [round(v, 6) for v in df["val_loss"].tolist()], "checkpoint": ck.path}


def decode_bench(checkpoint: str, n: int, batch_size: int, threads: int) -> dict:
    import torch

    from rexeval.models.generators.base import greedy
    from rexeval.pipelines.generate.train import load_checkpoint_model

    torch.set_num_threads(threads)
    model, _, data = load_checkpoint_model(checkpoint)
    n = min(n, data.size("test"))
    b = data.batch("test", list(range(n)))

    def run(size: int) -> tuple[float, list[list[int]]]:
        out: list[list[int]] = []
        t0 = time.perf_counter()
        for s in range(0, n, size):
            out += greedy(model, b.user[s:s + size], b.item[s:s + size], b.rating[s:s + size], data.max_words)
        return time.perf_counter() - t0, out

    run(batch_size)  # warm-up
    t_batch, batched = run(batch_size)
    t_one, single = run(1)
    same = sum(x == y for x, y in zip(batched, single))
    words = sum(len(x) for x in batched)
    return {"examples": n, "batch_size": batch_size, "batched_s": t_batch, "one_at_a_time_s": t_one,
            "speedup": t_one / t_batch, "identical_outputs": same, "mean_words": words / n,
            "examples_per_s_batched": n / t_batch, "examples_per_s_one": n / t_one}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="runs/bench-generate", help="Working folder (data and Tune runs).")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--emsize", type=int, default=None, help="PETER's size (default: the paper's 512).")
    ap.add_argument("--decode-examples", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "generate.json"))
    args = ap.parse_args()

    import torch

    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.pipelines.generate.settings import resolve_settings

    threads = os.cpu_count() or 1
    work = Path(args.work)
    init_ray(num_cpus=threads)
    data_dir = prepare_data(work)
    given = {"epochs": args.epochs, "patience": args.epochs + 1}
    if args.emsize:
        given |= {"emsize": args.emsize, "nhid": 4 * args.emsize}
    settings = resolve_settings("peter", given)
    from rexeval.pipelines.generate.data import GenData

    data = GenData.load(data_dir)
    settings["max_words"] = data.max_words
    print(f"(a) training PETER (emsize {settings['emsize']}) for {args.epochs} epoch(s) on "
          f"{data.size('train'):,} reviews, {threads} thread(s)")
    plain = plain_loop(settings, data_dir, threads)
    print(f"  plain loop: {plain['seconds']:.1f} s, curve {plain['curve']}")
    storage = work / "tune"
    if storage.exists():
        import shutil

        shutil.rmtree(storage)
    tuned = tune_run(settings, data_dir, storage, threads)
    print(f"  Tune trial: {tuned['seconds']:.1f} s (epochs alone {sum(tuned['epoch_seconds']):.1f} s), "
          f"curve {tuned['curve']}")
    overhead = tuned["seconds"] / plain["seconds"] - 1
    # Per epoch after the first (both sides warm): what a long run pays on every epoch.
    steady = (sum(tuned["epoch_seconds"][1:]) / sum(plain["epoch_seconds"][1:]) - 1) if args.epochs > 1 else None
    print(f"  Tune overhead: {100 * overhead:+.1f}% in all (trial start-up included), "
          + (f"{100 * steady:+.1f}% per epoch after the first" if steady is not None else "")
          + f" (target < 10%); curves equal: {plain['curve'] == tuned['curve']}")
    print(f"(b) decoding {args.decode_examples} test examples, batch {args.batch_size} vs one at a time")
    dec = decode_bench(tuned["checkpoint"], args.decode_examples, args.batch_size, threads)
    print(f"  batched {dec['batched_s']:.2f} s, one at a time {dec['one_at_a_time_s']:.2f} s: "
          f"{dec['speedup']:.1f}x (target >= 5x); identical outputs {dec['identical_outputs']}/{dec['examples']}")
    result = {"machine": {"cpus": threads, "platform": platform.platform(), "torch": torch.__version__},
              "data": {"train": data.size("train"), "valid": data.size("valid"), "test": data.size("test"),
                       "vocab": len(data.vocab), "max_words": data.max_words},
              "settings": {k: settings[k] for k in ("emsize", "nhid", "nlayers", "batch_size", "epochs", "lr")},
              "training": {"plain_s": plain["seconds"], "tune_s": tuned["seconds"],
                           "plain_epochs_s": plain["epoch_seconds"], "tune_epochs_s": tuned["epoch_seconds"],
                           "overhead": overhead, "overhead_per_epoch": steady,
                           "curves_equal": plain["curve"] == tuned["curve"], "curve": plain["curve"]},
              "decoding": dec,
              "command": "python benchmarks/bench_generate.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
