"""Explanation generators on a pretrained causal LM (PEPLER, XRec): batched decoding
against one example at a time on the same backbone, side by side in one run, and the
cost of one training step.

Why: issue 17's acceptance asks for "generation throughput of batched decoding against
one at a time on the same backbone (target at least 3x on this CPU, identical greedy
outputs)". `LMGenerator` decodes with the LM's KV cache and left-pads prompts of
different lengths (XRec's profiles), so a row must decode the same in a batch as alone.

Setup: the packaged SmolLM2-135M backbone (profile `local`, roles `generator_lm` /
`generator_llm`), float32, `torch.set_num_threads(--threads)` (2, this CPU's cores).
The models are untrained: PEPLER's prompt vectors and XRec's adapters are random
(seeded), XRec's collaborative embeddings are Gaussian and its user and item profiles
are sentences of 20-60 LM tokens, so prompts differ in length and left padding runs.
No data, no Ray.

(a) Decoding: `greedy` on --pepler-examples (and --xrec-examples) examples, in batches
    of --pepler-batch (--xrec-batch; XRec's rows sorted by `prompt_lengths` first, as
    `DecodeStage.batches` does) and one at a time. Untrained models rarely stop, and
    when they do, a batch runs as long as its longest row: to compare equal work the
    measured mode ("fixed") forbids the end token so every row writes exactly
    --max-words tokens; each batch is timed and then its rows one by one, interleaved,
    so load from elsewhere hits both sides alike. Reported: generated tokens/s and
    examples/s per side, their ratio (target >= 3x) and how many outputs are identical.
    The "natural" mode (end token allowed, the decoding job's behaviour) is checked
    for identical outputs and timed the same way. A mismatch is not hidden: at the
    first differing word both log-probabilities of the two candidates are given, in
    the batch and alone, to tell a float near-tie from a bug.
(b) Training: forward + backward of `losses` on a batch of --train-batch examples with
    20-token targets (and the optimizer step, timed apart), seconds per step, for
    PEPLER phase 0 (prompt vectors only, LM frozen), PEPLER phase 1 (everything) and
    XRec (adapters only).

Every figure comes with `others_cpu_share`, the share of the machine's CPU time other
processes used meanwhile: on 2 cores, a test run beside the benchmark makes the
2-thread kernels wait on each other and distorts both sides (batched ones most); trust
the figures taken near 0 and run again when they are not.

Re-run (results in benchmarks/results/generate_lm.json; about 6 minutes on 2 idle cores):

    .venv/bin/python benchmarks/bench_generate_lm.py
    .venv/bin/python benchmarks/bench_generate_lm.py --quick   # smoke run, writes nothing unless --out
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
OUT = ROOT / "benchmarks" / "results" / "generate_lm.json"

TEXT = ("the strings sound warm and bright after a week of playing this guitar stand holds my bass firmly "
         "cable is long enough for the stage but the plug feels cheap tuner works fast on every instrument "
         "pedal adds a nice crunch without noise strap is comfortable for long gigs price was fair shipping "
         "quick reeds last longer than the old ones mic picks up vocals clearly in a small room case protects "
         "the violin during travel capo clamps evenly and keeps tune picks grip well even with sweaty hands "
         "user likes vintage tone prefers sturdy gear plays jazz and folk item is a compact practice amp with "
         "clean headroom")
WORDS = TEXT.split()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Contention:
    """Share of the machine's CPU time that other processes used between `__init__` and
    `share()` (0: we had it to ourselves). Other work on the cores slows multi-threaded
    kernels much more than single-threaded ones, so a figure taken while it is high is
    not to be trusted."""

    def __init__(self):
        self.start, self.ours, self.t = self._machine(), self._ours(), time.perf_counter()

    @staticmethod
    def _machine() -> tuple[int, int]:
        try:
            f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = f[3] + (f[4] if len(f) > 4 else 0)
        return sum(f) - idle, sum(f)

    @staticmethod
    def _ours() -> float:
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def share(self) -> float | None:
        busy, total = self._machine()
        wall = time.perf_counter() - self.t
        if total <= self.start[1] or wall <= 0:
            return None
        ours = (self._ours() - self.ours) / (wall * (os.cpu_count() or 1))
        return round(max(0.0, (busy - self.start[0]) / (total - self.start[1]) - ours), 3)


def sentence_ids(tokenizer, rng, low: int, high: int) -> list[int]:
    """LM ids of a made-up sentence, cut to a length drawn from [low, high]."""
    from rexeval.models.generators.lm import encode_plain

    n = int(rng.integers(low, high + 1))
    ids: list[int] = []
    while len(ids) < n:
        ids += encode_plain(tokenizer, " ".join(rng.choice(WORDS, size=40)) + ".")
    return ids[:n]


def build(name: str, path: str, n_users: int, n_items: int, max_words: int, seed: int):
    import numpy as np
    import torch

    from rexeval.models.generators.base import generator_class
    from rexeval.models.generators.lm import LMTokens

    voc = LMTokens(path)
    torch.manual_seed(seed)
    if name == "pepler":
        return generator_class("pepler")(n_users, n_items, len(voc), max_words, lm=path, dtype="float32"), voc
    rng = np.random.default_rng(seed)
    tok = voc.tokenizer
    return generator_class("xrec")(
        n_users, n_items, len(voc), max_words, lm=path, dtype="float32",
        collab_user=rng.standard_normal((n_users, 64)).astype("float32"),
        collab_item=rng.standard_normal((n_items, 64)).astype("float32"),
        user_text=[sentence_ids(tok, rng, 20, 60) for _ in range(n_users)],
        item_text=[sentence_ids(tok, rng, 20, 60) for _ in range(n_items)]), voc


class FixedLength:
    """`greedy`'s view of a model with the end token forbidden: every row writes exactly
    `max_words` tokens, so batched and one-at-a-time runs do the same number of steps."""

    def __init__(self, model):
        self.model = model

    def eval(self):
        self.model.eval()
        return self

    def begin(self, user, item, rating):
        return self.model.begin(user, item, rating)

    def step(self, state, prefix):
        from rexeval.models.generators.base import EOS

        logp, state = self.model.step(state, prefix)
        logp = logp.clone()
        logp[:, EOS] = -float("inf")
        return logp, state


def forced_logp(model, user, item, rating, words: list[list[int]], at: int):
    """Log-probabilities [B, V] of the word at position `at`, every row fed its own
    `words` (greedy's trajectory: words, EOS, PAD ...) before it."""
    import torch

    from rexeval.models.generators.base import BOS, EOS, PAD

    rows = []
    for w in words:
        r = list(w[:at]) + ([EOS] if len(w) < at else [])
        rows.append((r + [PAD] * at)[:at])
    tokens = torch.tensor(rows, dtype=torch.long).reshape(len(words), at)
    with torch.no_grad():
        state = model.begin(user, item, rating)
        prefix = torch.full((len(words), 1), BOS, dtype=torch.long)
        for t in range(at + 1):
            logp, state = model.step(state, prefix)
            if t < at:
                prefix = torch.cat([prefix, tokens[:, t:t + 1]], 1)
    return logp


def mismatch_detail(model, user, item, rating, group: list[int], batched: list[list[int]], single: list[list[int]],
                    row: int, max_words: int, fixed: bool) -> dict:
    """Where `row`'s batched and one-at-a-time outputs first differ, and how close the two
    candidates' log-probabilities are there, in its batch and alone."""
    from rexeval.models.generators.base import EOS

    a, b = batched[row], single[row]
    at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    wa = a[at] if at < len(a) else EOS
    wb = b[at] if at < len(b) else EOS
    m = FixedLength(model) if fixed else model
    k = group.index(row)
    lb = forced_logp(m, user[group], item[group], rating[group], [batched[g] for g in group], at)[k]
    ls = forced_logp(m, user[row:row + 1], item[row:row + 1], rating[row:row + 1], [single[row]], at)[0]
    fin = lb.isfinite() & ls.isfinite()
    return {"row": row, "position": at, "batched_word": int(wa), "single_word": int(wb),
            "margin_in_batch": float(lb[wa] - lb[wb]), "margin_alone": float(ls[wb] - ls[wa]),
            "max_abs_logp_diff": float((lb[fin] - ls[fin]).abs().max())}


def decode_bench(model, user, item, rating, batch_size: int, max_words: int, fixed: bool,
                 sort_by_prompt: bool) -> dict:
    """Each batch, then its rows one at a time (interleaved); totals, ratio, identity."""
    import torch

    from rexeval.models.generators.base import greedy

    n = len(user)
    order = list(range(n))
    if sort_by_prompt:  # as DecodeStage.batches
        size = model.prompt_lengths(user, item)
        order.sort(key=lambda k: size[k])
    groups = [order[k:k + batch_size] for k in range(0, n, batch_size)]
    m = FixedLength(model) if fixed else model
    greedy(m, user[groups[0]], item[groups[0]], rating[groups[0]], 2)  # warm-up, both shapes
    greedy(m, user[:1], item[:1], rating[:1], 2)
    batched: list[list[int]] = [[] for _ in range(n)]
    single: list[list[int]] = [[] for _ in range(n)]
    t_batch = t_one = 0.0
    for g in groups:
        idx = torch.tensor(g)
        t0 = time.perf_counter()
        out = greedy(m, user[idx], item[idx], rating[idx], max_words)
        t_batch += time.perf_counter() - t0
        for k, o in zip(g, out):
            batched[k] = o
        t0 = time.perf_counter()
        for k in g:
            single[k] = greedy(m, user[k:k + 1], item[k:k + 1], rating[k:k + 1], max_words)[0]
        t_one += time.perf_counter() - t0
    tokens_b = sum(len(x) for x in batched)
    tokens_s = sum(len(x) for x in single)
    differ = [k for k in range(n) if batched[k] != single[k]]
    detail = []
    for k in differ[:5]:
        g = next(g for g in groups if k in g)
        detail.append(mismatch_detail(model, user, item, rating, g, batched, single, k, max_words, fixed))
    res = {"examples": n, "batch_size": batch_size, "batches": len(groups), "max_words": max_words,
           "batched_s": t_batch, "one_at_a_time_s": t_one,
           "tokens_batched": tokens_b, "tokens_one": tokens_s,
           "tokens_per_s_batched": tokens_b / t_batch, "tokens_per_s_one": tokens_s / t_one,
           "examples_per_s_batched": n / t_batch, "examples_per_s_one": n / t_one,
           "speedup": (tokens_b / t_batch) / (tokens_s / t_one),
           "identical_outputs": n - len(differ), "mismatches": detail,
           "ended_early_batched": sum(len(x) < max_words for x in batched)}
    if sort_by_prompt:
        lengths = model.prompt_lengths(user, item)
        res["prompt_tokens"] = {"min": min(lengths), "max": max(lengths), "mean": sum(lengths) / n,
                                "padding_share": sum(max(lengths[k] for k in g) * len(g) - sum(lengths[k] for k in g)
                                                     for g in groups) / sum(max(lengths[k] for k in g) * len(g)
                                                                            for g in groups)}
    return res


def train_bench(model, voc, phase: int, batch: int, steps: int, seed: int) -> dict:
    """Seconds of forward + backward of `losses` (and of the optimizer step) per step."""
    import numpy as np
    import torch

    from rexeval.models.generators.base import Batch, build_optimizer

    rng = np.random.default_rng(seed)
    model.enter_phase(phase)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    d = type(model).DEFAULTS
    opt = build_optimizer(d["optimizer"], params, d["lr"], d["weight_decay"])
    rows = [voc.encode(" ".join(rng.choice(WORDS, size=40)), 20) for _ in range(batch)]
    assert all(len(r) == 22 for r in rows), "targets must be 20 tokens"
    b = Batch(torch.as_tensor(rng.integers(0, model.n_users, batch)), torch.as_tensor(rng.integers(0, model.n_items, batch)),
              torch.as_tensor(rng.uniform(1, 5, batch), dtype=torch.float32), torch.tensor(rows))
    fb, st = [], []
    for k in range(steps + 1):  # the first is a warm-up
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = model.losses(b)["loss"]
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if k:
            fb.append(t1 - t0)
            st.append(t2 - t1)
    model.eval()
    model.freeze_lm()
    return {"batch": batch, "target_tokens": 20, "steps": steps,
            "trainable_params": sum(p.numel() for p in params),
            "fwd_bwd_s": sum(fb) / steps, "optimizer_s": sum(st) / steps, "step_s": (sum(fb) + sum(st)) / steps,
            "fwd_bwd_all_s": fb}


def show_decode(name: str, mode: str, r: dict) -> None:
    print(f"  {name:6s} {mode:7s} n={r['examples']:3d} b={r['batch_size']:2d}  "
          f"batched {r['tokens_per_s_batched']:7.1f} tok/s {r['examples_per_s_batched']:6.2f} ex/s | "
          f"one {r['tokens_per_s_one']:6.1f} tok/s {r['examples_per_s_one']:5.2f} ex/s | "
          f"{r['speedup']:4.1f}x | identical {r['identical_outputs']}/{r['examples']}")
    for d in r["mismatches"]:
        print(f"    mismatch row {d['row']} at word {d['position']}: margin {d['margin_in_batch']:.2e} in batch, "
              f"{d['margin_alone']:.2e} alone, max |dlogp| {d['max_abs_logp_diff']:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="Smoke run: tiny sizes; writes nothing unless --out.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-words", type=int, default=24)
    ap.add_argument("--pepler-examples", type=int, default=32)
    ap.add_argument("--pepler-batch", type=int, default=32)
    ap.add_argument("--xrec-examples", type=int, default=32)
    ap.add_argument("--xrec-batch", type=int, default=16)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--no-natural", action="store_true", help="Skip the end-token-allowed run.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help=f"Results file (default {OUT.relative_to(ROOT)}; none with --quick).")
    args = ap.parse_args()
    if args.quick:
        args.max_words, args.pepler_examples, args.pepler_batch = 4, 4, 4
        args.xrec_examples, args.xrec_batch, args.train_steps, args.train_batch = 4, 2, 1, 2
    out = Path(args.out) if args.out else (None if args.quick else OUT)

    import torch
    import transformers

    from rexeval.models.profiles import load_profile

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    contention = Contention()
    t_all = time.perf_counter()
    profile = load_profile("local")
    paths = {"pepler": profile.resolve("generator_lm").location, "xrec": profile.resolve("generator_llm").location}
    n_users = n_items = 64
    sizes = {"pepler": (args.pepler_examples, args.pepler_batch), "xrec": (args.xrec_examples, args.xrec_batch)}
    modes = [("fixed", True)] + ([] if args.no_natural else [("natural", False)])
    decoding: dict = {}
    training: dict = {}
    print(f"SmolLM2-135M fp32, {args.threads} thread(s), {args.max_words} words; load average {load_start}")
    for name in ("pepler", "xrec"):
        t = time.perf_counter()
        model, voc = build(name, paths[name], n_users, n_items, args.max_words, args.seed)
        model.eval()
        print(f"{name}: built in {time.perf_counter() - t:.1f} s")
        n, bs = sizes[name]
        g = torch.Generator().manual_seed(args.seed)
        user = torch.randint(0, n_users, (n,), generator=g)
        item = torch.randint(0, n_items, (n,), generator=g)
        rating = torch.randint(1, 6, (n,), generator=g).float()
        decoding[name] = {}
        for mode, fixed in modes:
            t, c = time.perf_counter(), Contention()
            r = decode_bench(model, user, item, rating, bs, args.max_words, fixed, sort_by_prompt=name == "xrec")
            r["others_cpu_share"] = c.share()
            decoding[name][mode] = r
            show_decode(name, mode, r)
            print(f"    ({time.perf_counter() - t:.0f} s; other processes used {r['others_cpu_share']} of the CPU)")
        phases = [0, 1] if name == "pepler" else [0]
        for phase in phases:
            key = f"{name}_phase{phase}" if name == "pepler" else name
            t, c = time.perf_counter(), Contention()
            training[key] = tr = train_bench(model, voc, phase, args.train_batch, args.train_steps, args.seed)
            tr["others_cpu_share"] = c.share()
            print(f"  train {key:14s} {tr['step_s']:6.2f} s/step (fwd+bwd {tr['fwd_bwd_s']:.2f}, "
                  f"optimizer {tr['optimizer_s']:.2f}; {tr['trainable_params']:,} trainable)  "
                  f"({time.perf_counter() - t:.0f} s; others {tr['others_cpu_share']})")
        del model
    total = time.perf_counter() - t_all
    others = contention.share()
    print(f"\n{'model':8s}{'mode':9s}{'tok/s batched':>14s}{'tok/s one':>11s}{'ex/s batched':>13s}"
          f"{'ex/s one':>10s}{'ratio':>7s}{'identical':>11s}")
    for name, byname in decoding.items():
        for mode, r in byname.items():
            print(f"{name:8s}{mode:9s}{r['tokens_per_s_batched']:14.1f}{r['tokens_per_s_one']:11.1f}"
                  f"{r['examples_per_s_batched']:13.2f}{r['examples_per_s_one']:10.2f}{r['speedup']:6.1f}x"
                  f"{r['identical_outputs']:>6d}/{r['examples']}")
    print(f"\n{'training':16s}{'s/step':>8s}{'fwd+bwd':>9s}{'optim':>7s}")
    for key, tr in training.items():
        print(f"{key:16s}{tr['step_s']:8.2f}{tr['fwd_bwd_s']:9.2f}{tr['optimizer_s']:7.2f}")
    print(f"total {total:.0f} s; load average {os.getloadavg()}; CPU share used by other processes "
          f"{'?' if others is None else f'{100 * others:.0f}%'}")
    result = {"machine": {"device": cpu_name(), "cpus": os.cpu_count(), "threads": args.threads,
                          "platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__, "transformers": transformers.__version__,
                          "load_average_start": load_start, "load_average_end": os.getloadavg(),
                          "others_cpu_share": others},
              "backbone": {"pepler": paths["pepler"], "xrec": paths["xrec"], "dtype": "float32"},
              "settings": {"max_words": args.max_words, "n_users": n_users, "n_items": n_items, "seed": args.seed,
                           "train_batch": args.train_batch, "train_steps": args.train_steps},
              "decoding": decoding, "training": training, "total_s": total,
              "command": "python benchmarks/bench_generate_lm.py " + " ".join(sys.argv[1:])}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results: {out}")


if __name__ == "__main__":
    main()
