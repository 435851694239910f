"""The two settings presets of the word-level generators side by side: `paper` (each
original paper) against `seed000` (what seed 000's released code ran), at a few epochs.

Data: the shared Musical Instruments reviews (`../shared/data`, read in place), ingested
and split (temporal 80/10/10) as `tests/pipelines/generate/test_real_data.py` does; the
target is the review text (seed 000 Table VII: no LLM needed). For each of NRT, Att2Seq,
PETER and CER and each preset: `generate train` (`TrainJob(preset=...)`, the same
`--epochs` for both, and the same smaller model sizes for both, `SHRINK` below, unless
--full-size; every other setting as the preset says), `generate run` greedy on the test
split, and `evaluate` with the n-gram metrics (`overlap`: sentence BLEU-1/4, ROUGE-1/2/L;
`corpus`: corpus BLEU-1/4, USR) and BERTScore (`bertscore`, the
local profile's all-MiniLM-L6-v2 at layer 6, packaged, so it runs offline). The references
are the whole reviews under both presets (only the training targets are cut at the
preset's `max_words`: 15 or 20 words under `paper`, 128 under `seed000`).

Per model and preset: epochs run, best epoch, its validation perplexity and the value
that selected it, the validation curve, the mean length of the test outputs (words),
empty outputs, the scores, and the seconds of training, decoding and evaluation; per
model, "what changed": the settings whose values differ between the two presets' tables
(`models/generators/presets.py`, `table(preset, model)`).

This compares settings after a few epochs on ~1,700 training reviews. It is not a
reproduction of seed 000's numbers (100 epochs on the full datasets): short runs favour
settings that learn fast (Adam over AdaDelta; batches of 32 give 4x PETER's updates per
epoch of batches of 128), and a model cut at 3 epochs has not yet learnt to stop. Two
numbers do not compare across presets: the validation perplexity is over each preset's
own targets (the first 15 or 20 words of a review under `paper`, 128 under `seed000`),
and corpus BLEU carries a brevity penalty against the whole reviews (~100 words on
average), so 15-word outputs score ~0 whatever their words.

    cd /work/main && RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \\
        .venv/bin/python -m benchmarks.bench_presets            # ~10 min on 2 CPU cores (622 s)
    ... -m benchmarks.bench_presets --epochs 1 --limit 32 --models peter   # a quick check

Results: benchmarks/results/presets.json (and a table on stdout).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("REXEVAL_SHARED", ROOT.parent / "shared"))
CSV = SHARED / "data" / "amazon_musical_instruments_2014_part.csv"
MODELS = ("nrt", "att2seq", "peter", "cer")
PRESETS = ("paper", "seed000")

SHRINK = {
    "nrt": {"dim": 128, "hidden": 128},
    "att2seq": {"dim": 64, "hidden": 128},
    "peter": {"emsize": 128, "nhid": 512},
    "cer": {"emsize": 128, "nhid": 512},
}
"""Size settings set identically under both presets (unless --full-size). At each preset's
own sizes, seed000's 128-word targets cost ~3-5 min per epoch per model on 2 CPU cores
(PETER 290 s, NRT ~210 s), ~45 min for 3 epochs of the four; these sizes bring the whole
run to ~20 min. NRT's sizes are the one size difference between the presets (paper 300/400,
seed000 512/512): the shrink removes it (`what_changed` marks it)."""

SCORES = {  # column -> (metric in aggregates.parquet, kind)
    "bleu1": ("bleu-1", "corpus"), "bleu4": ("bleu-4", "corpus"),
    "sbleu1": ("sentence-bleu-1", "per_example"), "sbleu4": ("sentence-bleu-4", "per_example"),
    "rouge1": ("rouge-1-f", "per_example"), "rouge2": ("rouge-2-f", "per_example"),
    "rougeL": ("rouge-l-f", "per_example"), "bertscore_f1": ("bertscore-f1", "per_example"),
    "usr": ("usr", "corpus"),
}
SCALE100 = {"bleu1", "bleu4", "sbleu1", "sbleu4", "rouge1", "rouge2", "rougeL", "bertscore_f1", "usr"}


def quiet(_msg: str) -> None:
    pass


def split_data(work: Path) -> Path:
    from rexeval.pipelines.ingest.config import IngestConfig, SplitConfig
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.split_pipeline import run_split

    if not CSV.exists():
        sys.exit(f"shared data not found at {CSV} (set REXEVAL_SHARED)")
    run_ingest(IngestConfig(inputs=[str(CSV)], out=str(work / "ingest")), progress=quiet)
    run_split(SplitConfig(input=str(work / "ingest"), out=str(work / "split")), progress=quiet)
    return work / "split"


def what_changed(model: str) -> dict[str, list]:
    """{setting: [paper value, seed000 value]} where the two tables differ."""
    from rexeval.models.generators.presets import table

    a, b = table("paper", model), table("seed000", model)
    missing = "(not set)"
    return {k: [a[k][0] if k in a else missing, b[k][0] if k in b else missing]
            for k in sorted(set(a) | set(b)) if (a.get(k) or (missing,))[0] != (b.get(k) or (missing,))[0]}


def curve(trial_path: str | None) -> list[dict]:
    """The trial's per-epoch validation numbers (Tune's progress.csv)."""
    if not trial_path or not (Path(trial_path) / "progress.csv").exists():
        return []
    keep = ("epoch", "val_loss", "val_ppl", "val_text_rating", "time_this_iter_s")
    with open(Path(trial_path) / "progress.csv") as f:
        return [{k: round(float(r[k]), 4) for k in keep if r.get(k) not in (None, "")} for r in csv.DictReader(f)]


def one_run(model: str, preset: str, split: Path, work: Path, epochs: int, shrink: dict, limit: int | None,
            metrics: list[str]) -> dict:
    import pyarrow.compute as pc

    from rexeval.pipelines.core.io import read_table
    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.pipeline import run_evaluate
    from rexeval.pipelines.generate.config import RunConfig, TrainJob
    from rexeval.pipelines.generate.decode import run_generate

    from rexeval.pipelines.generate.pipeline import run_train

    base = work / f"{model}-{preset}"
    system = f"{model}-{preset}"
    settings = {"epochs": epochs, **shrink.get(model, {})}
    t0 = time.perf_counter()
    rep = run_train(TrainJob(data=str(split), out=str(base / "train"), model=model, preset=preset,
                             target="review", settings=settings, overwrite=True), progress=quiet)
    t_train = time.perf_counter() - t0
    trial = rep["trials"][0] if rep["trials"] else {}
    t0 = time.perf_counter()
    man = run_generate(RunConfig(checkpoint=str(base / "train"), out=str(base / "gen"), system=system,
                                 limit=limit), overwrite=True, progress=quiet)
    t_decode = time.perf_counter() - t0
    expl = read_table(base / "gen" / "explanations", "explanations")
    errors = read_table(base / "gen" / "errors", "errors")
    texts = expl.column("explanation").to_pylist()
    from rexeval.pipelines.generate.data import GenData

    vocab = GenData.load(base / "train" / "data").vocab
    words = [len(vocab.encode(t, 10**6)) - 2 for t in texts]  # the model's words (punctuation counts)
    empty = errors.filter(pc.invert(pc.starts_with(errors.column("message"), "test split:"))).num_rows
    t0 = time.perf_counter()
    ev = run_evaluate(EvaluateConfig(explanations=[str(base / "gen")], metrics=metrics, out=str(base / "eval"),
                                     bootstrap=0), overwrite=True, progress=quiet)
    t_eval = time.perf_counter() - t0
    agg = read_table(base / "eval" / "aggregates.parquet", "score_aggregates").to_pandas()
    scores = {}
    for col, (metric, kind) in SCORES.items():
        row = agg[(agg["system"] == system) & (agg["metric"] == metric) & (agg["kind"] == kind)]
        scores[col] = None if row.empty else round(float(row["mean"].iloc[0]) * (100 if col in SCALE100 else 1), 3)
    s = rep["settings"]
    return {
        "model": model, "preset": preset, "settings_given": settings,
        "epochs": epochs, "epochs_run": trial.get("epochs"), "best_epoch": rep["best"]["epoch"],
        "select": s.get("select"), "val_ppl": round(rep["best"]["val_ppl"], 3),
        "val_loss": round(rep["best"]["val_loss"], 4),
        "val_text_rating": (round(rep["best"]["val_text_rating"], 4) if "val_text_rating" in rep["best"] else None),
        "curve": curve(trial.get("path")),
        "max_words": s.get("max_words"),
        "vocab": json.loads((base / "train" / "data" / "index.json").read_text()).get("vocab_size"),
        "data": rep["data"],
        "decoded": len(texts), "decode_errors": empty, "mean_words": round(sum(words) / max(1, len(words)), 2),
        "mean_whitespace_words": round(sum(len(t.split()) for t in texts) / max(1, len(texts)), 2),
        "share_at_max_words": round(sum(w >= int(s.get("max_words") or 0) for w in words) / max(1, len(words)), 3),
        "distinct_outputs": len(set(texts)), "rmse": man.get("rmse"),
        "examples": [{"output": t, "reference": r[:300]} for t, r in
                     list(zip(texts, expl.column("reference").to_pylist()))[:3]],
        "scores": scores, "evaluate_skipped": ev.get("skipped", {}), "families_run": ev.get("families_run"),
        "seconds": {"train": round(t_train, 1), "decode": round(t_decode, 1), "evaluate": round(t_eval, 1)},
    }


def fmt(v, width: int, nd: int = 2) -> str:
    if v is None:
        return "-".rjust(width)
    if isinstance(v, float):
        return f"{v:.{nd}f}".rjust(width)
    return str(v).rjust(width)


def print_table(runs: list[dict], changed: dict[str, dict], shrink: dict) -> str:
    cols = [("model", 8), ("preset", 8), ("ep", 3), ("best", 4), ("val_ppl", 8), ("words", 6), ("empty", 5),
            ("uniq", 5),
            ("BLEU1", 6), ("BLEU4", 6), ("R1", 6), ("R2", 6), ("RL", 6), ("BERTS", 6),
            ("train_s", 7), ("dec_s", 6), ("eval_s", 6)]
    lines = [" ".join(n.rjust(w) for n, w in cols)]
    for r in runs:
        sc, sec = r["scores"], r["seconds"]
        vals = [r["model"], r["preset"], r["epochs_run"], r["best_epoch"], r["val_ppl"], r["mean_words"],
                r["decode_errors"], r["distinct_outputs"], sc["bleu1"], sc["bleu4"], sc["rouge1"], sc["rouge2"],
                sc["rougeL"], sc["bertscore_f1"], sec["train"], sec["decode"], sec["evaluate"]]
        lines.append(" ".join(fmt(v, w, 1 if n.endswith("_s") else 2) for v, (n, w) in zip(vals, cols)))
    lines.append("")
    lines.append("BLEU: corpus BLEU (x100); R1/R2/RL: mean ROUGE F1 (x100); BERTS: mean BERTScore F1 (x100); "
                 "words: mean output length (the vocabulary's words, punctuation included); "
                 "empty: outputs with no word (EOS first); uniq: distinct outputs")
    lines.append("")
    for m, diff in changed.items():
        lines.append(f"{m} (paper -> seed000): " + "; ".join(
            f"{k} {a!r} -> {b!r}" + (f" (both {shrink[m][k]!r} here)" if k in shrink.get(m, {}) else "")
            for k, (a, b) in diff.items()))
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3, help="epochs of every run (the same for both presets)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--limit", type=int, default=None, help="decode only the first N test examples")
    ap.add_argument("--full-size", action="store_true",
                    help=f"each preset's own model sizes (default: the same smaller sizes for both: {SHRINK})")
    ap.add_argument("--no-bertscore", action="store_true")
    ap.add_argument("--work", default="/tmp/rexeval-bench-presets", help="working folder (outside the repo)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "presets.json"))
    args = ap.parse_args()

    import torch

    from rexeval.pipelines.core.runtime import init_ray

    t_all = time.perf_counter()
    threads = os.cpu_count() or 1
    init_ray(num_cpus=threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    split = split_data(work)
    metrics = ["overlap", "corpus"] + ([] if args.no_bertscore else ["bertscore"])
    shrink = {} if args.full_size else SHRINK
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    changed = {m: what_changed(m) for m in models}
    runs = []
    for m in models:
        for p in PRESETS:
            print(f"{m} / {p}: training {args.epochs} epoch(s) ...", flush=True)
            r = one_run(m, p, split, work, args.epochs, shrink, args.limit, metrics)
            runs.append(r)
            print(f"  best epoch {r['best_epoch']} (by {r['select']}), val ppl {r['val_ppl']}, "
                  f"{r['decoded']} outputs of {r['mean_words']} words, scores {r['scores']}, "
                  f"seconds {r['seconds']}", flush=True)
            print(f"  e.g. {r['examples'][0]['output'][:200]!r}" if r["examples"] else "  no output", flush=True)
    text = print_table(runs, changed, shrink)
    skipped = {k: v for r in runs for k, v in r["evaluate_skipped"].items()}
    first = runs[0]["data"] if runs else {}
    out = {
        "what": "paper vs seed000 presets at a few epochs on the shared reviews (review targets, Table VII "
                "setting); a comparison of settings, not a reproduction of seed 000's numbers",
        "epochs": args.epochs, "shrink": shrink, "limit": args.limit, "data_counts": first,
        "metrics": {"families": metrics, "bertscore_model": "local profile bertscore_model (all-MiniLM-L6-v2, "
                    "layer 6)" if not args.no_bertscore else None, "evaluate_skipped": skipped,
                    "scale": "x100 for BLEU, ROUGE F1, BERTScore F1 and USR; BLEU is corpus BLEU, "
                             "sbleu is the mean sentence BLEU"},
        "what_changed": {m: {k: {"paper": a, "seed000": b,
                                 **({"both_set_to": shrink[m][k]} if k in shrink.get(m, {}) else {})}
                             for k, (a, b) in d.items()} for m, d in changed.items()},
        "runs": runs, "table": text,
        "seconds": round(time.perf_counter() - t_all, 1),
        "machine": {"cpus": threads, "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "command": "RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python -m "
                   "benchmarks.bench_presets " + " ".join(sys.argv[1:]),
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"results: {path} ({out['seconds']:.0f} s in all)")


if __name__ == "__main__":
    main()
