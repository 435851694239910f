"""rexeval's GPU paths in one prepared run, without Ray: one call on a lent GPU machine.

A GPU machine is lent only to some sessions, for about 15 minutes of device time in all,
and it has torch, transformers, sentence-transformers and torch-geometric but no Ray,
vLLM or FAISS and no network. So this script runs rexeval's own modules directly (the
classes and functions the jobs call inside their Ray workers) and needs nothing but what
travels with the call: the repository, a few small wheels (pydantic, faiss-cpu) and the
configs and tokenizers of all-MiniLM-L6-v2 and SmolLM2-135M-Instruct (`--assets`). The
weights are built on the machine, randomly initialised with a fixed seed, in the real
architectures and sizes: no NLI model ships on PyPI at all, and the real weights of the
other two are over the 64 MiB a call can carry. Random weights are right for speed,
device placement, dtype and batching checks; they say nothing about quality.

Parts (each timed, each failure recorded with its traceback while the others go on):
  nli     `NLIScorer` in float32 and bfloat16 on the NLI benchmark's pairs
          (`benchmarks/bench_nli.py`'s examples): pairs/s of `score` against the
          forward-pass bound on the same device (`prepare_batches` then only
          `forward_batches` timed; target >= 0.8x), label agreement bf16 vs fp32 (all
          pairs, and pairs whose fp32 top-2 margin is >= 0.1), and the device's fp32
          probabilities against the CPU's on a subset. A MiniLM-size classifier and,
          on a GPU, a BERT-large-size one (the size of the seeds' large NLI models).
  embed   `Embedder` (sentence-transformers) on the sample's statements and review
          sentences, bf16 and fp32: texts/s, cosine of bf16 to fp32 vectors; exact
          top-k neighbours with rexeval's torch `top_k` (metrics/ranking.py) on the
          device against CPU FAISS `IndexFlatIP` on the same vectors (recall@k, 1.0
          expected), and bf16 neighbours against fp32 ones (informative).
  hf      the `hf` LLM backend (`HFBackend`) on SmolLM2-135M's architecture: batched
          against one-at-a-time generation of the same chat prompts, tokens/s, and how
          many greedy outputs are identical (fp32: all expected; bf16 reported).
  train   ExpGCN and BPER+ (the STAR trainer's `train_epoch`, one batch per call) and
          PETER and PEPLER (the generator trainer's `train_epoch` over one batch): the
          same steps from the same initial weights on the CPU and on `--device`
          (float32 both), the two loss curves and their largest relative gap; step time
          on the device (PEPLER also in bfloat16, the dtype the trainer gives an LM
          backbone on a GPU); PETER's and PEPLER's batched greedy decoding tokens/s.
  tests   every `gpu`-marked test file, run with pytest `-m gpu` (a file that needs
          Ray, vLLM or FAISS to import is reported as not runnable here).

Writes `<out>/gpu_check.json` (device, versions, command, every figure, after each
part, so a run cut short still leaves the parts it finished) and `<out>/gpu_check.log`.

    bash benchmarks/gpu_check.sh prepare          # here: wheels + assets into .gpucarry/
    # the device call:  command "bash benchmarks/gpu_check.sh run", carry [".gpucarry"]
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/gpu_check   # seconds

`--tiny` shrinks every model and data set (the CPU smoke test in tests/benchmarks/ runs
it, so the script cannot rot between GPU sessions). A whole run on an H100 is sized
to end within 8 minutes; `--budget-s` skips the parts that would start after it.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PARTS = ("nli", "embed", "hf", "train", "tests")
SEED = 0
NLI_LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}
ENCODER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
                 "config_sentence_transformers.json", "1_Pooling/config.json")
LLM_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "chat_template.jinja", "special_tokens_map.json")
TINY_ENCODER = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                "intermediate_size": 64}
LARGE_ENCODER = {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                 "intermediate_size": 4096}
TINY_LLM = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "head_dim": 16}
# What a file a gpu test cannot import on the GPU machine is missing (not a failure there).
ABSENT_THERE = ("ray", "vllm", "faiss")


# --- recording ------------------------------------------------------------------------

class Report:
    """The JSON being written: rewritten after every part, so a cut run keeps its parts."""

    def __init__(self, out: Path, meta: dict):
        self.out, self.data = out, {**meta, "parts": {}}
        out.mkdir(parents=True, exist_ok=True)
        self.log_file = open(out / "gpu_check.log", "a", encoding="utf-8")

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def save(self) -> None:
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=2, default=_plain))
        tmp.replace(self.out / "gpu_check.json")


def _plain(x):
    """numpy scalars and arrays as JSON values."""
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def timer(device: str, into: dict, key: str):
    sync(device)
    t0 = time.perf_counter()
    yield
    sync(device)
    into[key] = round(time.perf_counter() - t0, 4)


def median_time(args, into: dict, key: str, fn):
    """`fn()` timed `--repeat` times (warm passes): the median under `key`, all of them
    under `key`s; returns the last result. Single timings on a lent machine varied up
    to 2x between runs."""
    import statistics

    times, result = [], None
    for _ in range(max(1, args.repeat)):
        one: dict = {}
        with timer(args.device, one, "s"):
            result = fn()
        times.append(one["s"])
    into[key] = round(statistics.median(times), 4)
    if len(times) > 1:
        into[key + "_all"] = times
    return result


def versions() -> dict:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("torch", "transformers", "sentence_transformers", "torch_geometric", "pydantic",
                 "numpy", "pyarrow", "faiss"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception as exc:  # absent there is a finding, not an error
            out[name] = f"absent ({type(exc).__name__})"
    return out


def device_info(device: str) -> dict:
    import torch

    info = {"requested": device, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        info.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1),
                    multiprocessors=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                    cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported())
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


# --- assets and the models built from them ----------------------------------------------

def local_assets() -> dict[str, Path]:
    """Where this machine's packaged MiniLM and converted SmolLM2 live (the sources of
    `prepare_assets`): the folders rexeval's local profile resolves them to."""
    from rexeval.models.refs import resolve

    return {"minilm": Path(resolve("all-MiniLM-L6-v2").location),
            "smollm2": Path(resolve("SmolLM2-135M-Instruct").location)}


def prepare_assets(dest: Path, *, int8_encoder: bool = True) -> dict:
    """Copy the configs and tokenizers of both models into `dest`, and all-MiniLM-L6-v2's
    weights as int8 (`INT8_WEIGHTS`, 23 MB: its 91 MB of float32 do not fit a call)."""
    copied = {}
    for name, src in local_assets().items():
        files = ENCODER_FILES if name == "minilm" else LLM_FILES
        for rel in files:
            if (src / rel).is_file():
                (dest / name / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, dest / name / rel)
                copied.setdefault(name, []).append(rel)
    if int8_encoder:
        save_int8(local_assets()["minilm"], dest / "minilm" / INT8_WEIGHTS)
        copied["minilm"].append(INT8_WEIGHTS)
    return copied


INT8_WEIGHTS = "weights.int8.pt"


def save_int8(model_dir: Path, path: Path) -> None:
    """A model folder's 2-D weights as int8 with one float32 scale per row (symmetric),
    the rest (biases, norms) as float16. Dequantised, a row keeps its direction to within
    about 0.5%: the sentence vectors stay those of the real model (cosine > 0.99 to the
    float32 model's, measured by the run), which random weights are not."""
    import torch
    from safetensors.torch import load_file

    packed = {}
    for name, w in load_file(str(model_dir / "model.safetensors")).items():
        w = w.float()
        if w.dim() == 2:
            scale = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127.0
            packed[name] = {"q": torch.round(w / scale).to(torch.int8), "scale": scale}
        else:
            packed[name] = {"half": w.half()}
    torch.save(packed, path)


def load_int8(path: Path) -> dict:
    import torch

    packed = torch.load(path, map_location="cpu", weights_only=True)
    return {name: (p["q"].float() * p["scale"]) if "q" in p else p["half"].float()
            for name, p in packed.items()}


def build_encoder(assets: Path, work: Path, name: str, *, classifier: bool, overrides: dict,
                  calibrate: list[tuple[str, str]] | None = None) -> tuple[Path, str]:
    """A BERT encoder of all-MiniLM-L6-v2's config (with `overrides`): the real weights
    when no size is overridden and the assets hold them (int8, see `save_int8`), else
    random (seeded). Saved as a sentence-transformers folder, or as a 3-way NLI
    classifier whose head is random and then calibrated on `calibrate` pairs, so that
    its labels spread over the pairs as a trained head's do (a random head gives one
    label to every pair, and bf16-vs-fp32 agreement would be trivially 1)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    src, out = assets / "minilm", work / name
    weights = "all-MiniLM-L6-v2 (int8-carried)" if not overrides and (src / INT8_WEIGHTS).is_file() \
        else "random (seeded)"
    if (out / "config.json").is_file():
        return out, weights
    cfg = AutoConfig.from_pretrained(src, **overrides)
    torch.manual_seed(SEED)
    if classifier:
        cfg.num_labels, cfg.id2label = 3, dict(NLI_LABELS)
        cfg.label2id = {v: k for k, v in NLI_LABELS.items()}
        model = AutoModelForSequenceClassification.from_config(cfg)
    else:
        model = AutoModel.from_config(cfg)
    if weights != "random (seeded)":
        missing, unexpected = model.base_model.load_state_dict(load_int8(src / INT8_WEIGHTS), strict=False)
        if [k for k in (*missing, *unexpected) if not k.endswith("position_ids")]:
            raise ValueError(f"int8 weights do not fit: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if classifier and calibrate:
        calibrate_head(model, str(src), calibrate)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for rel in ENCODER_FILES:
        if rel == "config.json" or not (src / rel).is_file():
            continue
        if classifier and rel in ("modules.json", "sentence_bert_config.json",
                                  "config_sentence_transformers.json", "1_Pooling/config.json"):
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, out / rel)
    if not classifier and (out / "1_Pooling" / "config.json").is_file():
        pool = json.loads((out / "1_Pooling" / "config.json").read_text())
        pool["word_embedding_dimension"] = cfg.hidden_size
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    return out, weights


def calibrate_head(model, tokenizer_dir: str, pairs: list[tuple[str, str]]) -> None:
    """Scale and centre the random classifier so that each logit has mean 0 and standard
    deviation 2 over `pairs` (CPU, float32)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    enc = tok([p for p, _ in pairs], [h for _, h in pairs], padding=True, truncation=True,
              max_length=128, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        z = model(**enc).logits.float()
        head = model.classifier
        scale = 2.0 / z.std(0).clamp(min=1e-6)
        head.weight.mul_(scale[:, None])
        head.bias.mul_(scale)
        head.bias.sub_(z.mean(0) * scale)


def build_llm(assets: Path, work: Path, *, overrides: dict) -> Path:
    """A causal LM of SmolLM2-135M-Instruct's config (with `overrides`), random weights
    (seeded), saved with its tokenizer and chat template."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    src, out = assets / "smollm2", work / "smollm2"
    if (out / "config.json").is_file():
        return out
    cfg = AutoConfig.from_pretrained(src, **overrides)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for rel in LLM_FILES:
        if rel != "config.json" and (src / rel).is_file():
            shutil.copy2(src / rel, out / rel)
    return out


# --- data ---------------------------------------------------------------------------------

def sample_texts(limit: int) -> list[str]:
    """Distinct statements of the repository's sample, then sentences of its reviews."""
    seen: dict[str, None] = {}
    with open(REPO / "pipelines" / "sample" / "statements.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            for s in row.get("statements") or []:
                text = s.get("statement") if isinstance(s, dict) else s
                if isinstance(text, str) and text.strip():
                    seen.setdefault(text.strip(), None)
    for review in sample_reviews(10_000):
        for sent in re.split(r"(?<=[.!?])\s+", review):
            if len(sent.split()) >= 3:
                seen.setdefault(sent.strip(), None)
    return list(seen)[:limit]


def sample_reviews(limit: int) -> list[str]:
    out = []
    with open(REPO / "pipelines" / "sample" / "reviews.jsonl", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line).get("reviewText") or ""
            if text.strip():
                out.append(" ".join(text.split()))
            if len(out) == limit:
                break
    return out


# --- part a: NLI ----------------------------------------------------------------------------

def part_nli(args, ctx) -> dict:
    import numpy as np

    from benchmarks.bench_nli import layout, make_examples
    from rexeval.models.encoders.nli import NLIScorer

    n_examples = 5 if args.tiny else 1000
    gen, ref, _ = make_examples(n_examples, 5, 5, SEED)
    pairs, _ = layout(gen, ref)
    prem, hyp = [p for p, _ in pairs], [h for _, h in pairs]
    sizes = {"minilm": TINY_ENCODER if args.tiny else {}}
    if not args.tiny and args.device.startswith("cuda"):
        sizes["large"] = LARGE_ENCODER
    sizes = {k: v for k, v in sizes.items() if k in args.nli_sizes.split(",")}
    out = {"pairs": len(pairs), "distinct_pairs": len(set(pairs)), "models": {}}
    for size, overrides in sizes.items():
        loc, weights = build_encoder(ctx["assets"], ctx["work"], f"nli-{size}", classifier=True,
                                     overrides=overrides, calibrate=sorted(set(pairs))[:256])
        n = len(pairs) if size == "minilm" else min(len(pairs), 8_000)  # the large one: a slice
        p, h = prem[:n], hyp[:n]
        res = {"pairs": n, "distinct_pairs": len(set(zip(p, h))), "encoder_weights": weights,
               "head": "random, calibrated (see calibrate_head)"}
        probs = {}
        for dtype in ("float32", "bfloat16"):
            scorer = NLIScorer(str(loc), device=args.device, dtype=dtype, batch_size=args.nli_batch)
            scorer.score(p[:64], h[:64])  # warm-up: kernels, allocator
            side: dict = {"loop": "overlapped" if scorer.overlaps() else "plain"}
            # Cold: the first pass meets every batch shape for the first time; warm: a
            # second pass over the same pairs (a long-running replica or job).
            with timer(args.device, side, "score_cold_s"):
                scorer.score(p, h)
            probs[dtype] = median_time(args, side, "score_s", lambda: scorer.score(p, h))
            side["score_stats"] = {k: (round(v, 4) if isinstance(v, float) else v)
                                   for k, v in scorer.last_stats.as_dict().items()}
            batches = scorer.prepare_batches(p, h)
            median_time(args, side, "forward_bound_s", lambda: scorer.forward_batches(batches))
            distinct = res["distinct_pairs"]
            side["distinct_pairs_per_s"] = round(distinct / side["score_s"], 1)
            side["bound_distinct_pairs_per_s"] = round(distinct / side["forward_bound_s"], 1)
            side["ours_over_bound"] = round(side["forward_bound_s"] / side["score_s"], 3)
            side["all_pairs_per_s"] = round(n / side["score_s"], 1)
            # The other loop (overlapped or plain) on the same warm model, side by side.
            other = not scorer.overlaps()
            scorer.overlap = other
            twin = median_time(args, side, "other_loop_score_s", lambda: scorer.score(p, h))
            side["other_loop"] = "overlapped" if other else "plain"
            side["other_loop_over_bound"] = round(side["forward_bound_s"] / side["other_loop_score_s"], 3)
            side["max_abs_diff_other_loop"] = float(np.abs(twin - probs[dtype]).max())
            side["actual_dtype"] = str(next(scorer.model.parameters()).dtype)
            side["model_device"] = str(next(scorer.model.parameters()).device)
            res[dtype] = side
            scorer = batches = None  # free the model before the next dtype
            _free(args.device)
        f32, b16 = probs["float32"], probs["bfloat16"]
        top2 = np.sort(f32, axis=1)[:, -2:]
        decided = (top2[:, 1] - top2[:, 0]) >= 0.1
        same = f32.argmax(1) == b16.argmax(1)
        res["label_agreement_bf16_vs_fp32"] = round(float(same.mean()), 4)
        res["label_agreement_where_fp32_margin_ge_0.1"] = round(float(same[decided].mean()), 4) if decided.any() else None
        res["share_with_margin_ge_0.1"] = round(float(decided.mean()), 4)
        res["max_abs_prob_diff_bf16_vs_fp32"] = round(float(np.abs(f32 - b16).max()), 4)
        if args.device != "cpu":  # the same float32 model on the CPU, on a subset
            k = min(n, 512)
            cpu = NLIScorer(str(loc), device="cpu", dtype="float32", batch_size=args.nli_batch).score(p[:k], h[:k])
            res["max_abs_prob_diff_device_vs_cpu_fp32"] = float(np.abs(cpu - f32[:k]).max())
            res["label_agreement_device_vs_cpu_fp32"] = float((cpu.argmax(1) == f32[:k].argmax(1)).mean())
        out["models"][size] = res
        ctx["report"].log(f"nli {size}: {json.dumps(res)}")
    return out


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


# --- part b: embedder and exact neighbours -------------------------------------------------

def part_embed(args, ctx) -> dict:
    import numpy as np

    from rexeval.models.encoders.embedder import Embedder

    texts = sample_texts(60 if args.tiny else 20_000)  # distinct: the neighbours' input
    tiled = (texts * (1 + (200 if args.tiny else 20_000) // len(texts)))[: 200 if args.tiny else 20_000]
    k = 5 if args.tiny else 32
    loc, weights = build_encoder(ctx["assets"], ctx["work"], "embedder",
                                 classifier=False, overrides=TINY_ENCODER if args.tiny else {})
    out: dict = {"texts": len(texts), "k": k, "weights": weights}
    vecs = {}
    for dtype in ("float32", "bfloat16"):
        emb = Embedder(str(loc), device=args.device, dtype=dtype, batch_size=args.embed_batch)
        emb.encode(texts[:32])
        side: dict = {"texts_timed": len(tiled)}
        with timer(args.device, side, "encode_cold_s"):
            emb.encode(tiled)
        with timer(args.device, side, "encode_s"):
            emb.encode(tiled)
        side["texts_per_s"] = round(len(tiled) / side["encode_s"], 1)
        vecs[dtype] = emb.encode(texts)
        side["actual_dtype"] = str(next(emb.model.parameters()).dtype)
        side["result_dtype"] = str(vecs[dtype].dtype)
        out[dtype] = side
        del emb
        _free(args.device)
    x = vecs["float32"]
    out["mean_cos_bf16_to_fp32"] = round(float((x * vecs["bfloat16"]).sum(1).mean()), 5)

    ours, secs = exact_neighbours(x, k, args.device)
    out["torch_top_k_s"] = round(secs, 4)
    try:
        from rexeval.pipelines.paraphrase.index import load_faiss

        faiss = load_faiss()
        index = faiss.IndexFlatIP(x.shape[1])
        index.add(x)
        t0 = time.perf_counter()
        _, theirs = index.search(x, k + 1)
        out["faiss_flat_s"] = round(time.perf_counter() - t0, 4)
        # FAISS's list holds the query itself (or, for a duplicate vector, its twin): drop
        # the row's own id, keep k.
        theirs = np.array([[j for j in row if j != i][:k] for i, row in enumerate(theirs)])
        out["recall_at_k_torch_vs_faiss"] = recall_at_k(ours, theirs)
        out["recall_at_k_torch_vs_faiss_ties_counted"] = tie_aware_recall(x, ours, theirs)
        out["faiss"] = faiss.__version__
    except ImportError as exc:
        out["recall_at_k_torch_vs_faiss"] = None
        out["faiss"] = f"absent: {exc}"
    cpu_idx = ours if args.device == "cpu" else exact_neighbours(x, k, "cpu")[0]
    out["torch_top_k_same_on_cpu"] = bool((cpu_idx == ours).all())
    out["recall_at_k_bf16_vs_fp32_vectors"] = recall_at_k(ours, exact_neighbours(vecs["bfloat16"], k, args.device)[0])
    ctx["report"].log(f"embed: {json.dumps(out)}")
    return out


def tie_aware_recall(x, ours, theirs, eps: float = 1e-6) -> float:
    """Recall@k of `ours` against `theirs`, where a neighbour of ours that is not in their
    list still counts when its cosine (float64) ties their k-th (within `eps`): texts
    that differ only in case or spacing have one vector under an uncased tokenizer."""
    import numpy as np

    x64 = x.astype(np.float64)
    hits = 0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        kth = float((x64[b] @ x64[i]).min())
        hits += sum(j in set(b) or float(x64[j] @ x64[i]) >= kth - eps for j in a)
    return hits / (len(ours) * ours.shape[1])


def exact_neighbours(x, k: int, device: str):
    """Each row's k nearest other rows by inner product, with rexeval's torch `top_k`
    (metrics/ranking.py) on `device`; and the seconds it took."""
    import torch

    from rexeval.metrics.ranking import top_k

    t = torch.from_numpy(x).to(device)
    sync(device)
    t0 = time.perf_counter()
    scores = t @ t.T
    scores.fill_diagonal_(-float("inf"))  # a text is not its own neighbour
    idx = top_k(scores, k, chunk=4096).cpu().numpy()
    return idx, time.perf_counter() - t0


def recall_at_k(ours, theirs) -> float:
    return float(sum(len(set(a) & set(b)) for a, b in zip(ours, theirs)) / (len(ours) * ours.shape[1]))


# --- part c: the hf LLM backend ---------------------------------------------------------------

def part_hf(args, ctx) -> dict:
    from benchmarks.bench_hf_batching import build_messages
    from rexeval.models.llm import BackendSpec, ChatRequest, SamplingParams
    from rexeval.models.llm.hf_backend import HFBackend

    n, max_tokens = (4, 8) if args.tiny else (16, 48)
    reviews = [" ".join(r.split()[:80]) for r in sample_reviews(n)]
    messages, _, prompt = build_messages(reviews)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    requests = [ChatRequest(messages=m, sampling=sampling) for m in messages]
    loc = build_llm(ctx["assets"], ctx["work"], overrides=TINY_LLM if args.tiny else {})
    out: dict = {"prompts": n, "max_tokens": max_tokens, "prompt": prompt, "batch_size": args.hf_batch}
    variants = {"float32": ("float32", True), "bfloat16": ("bfloat16", True),
                "bfloat16_no_shared_prefix": ("bfloat16", False)}
    for name, (dtype, share) in variants.items():
        if args.tiny and not share:
            continue
        backend = HFBackend(BackendSpec(model=str(loc), options={
            "batch_size": args.hf_batch, "device": args.device, "dtype": dtype, "constrained": "none",
            "share_prefix": share}))
        backend.generate(requests[:2])  # warm-up
        res: dict = {"actual_dtype": str(backend.model.dtype), "model_device": str(backend.model.device)}
        texts = {}
        t0 = time.perf_counter()
        backend.generate(requests)  # the batched shapes once, untimed in "batched"
        res["batched_cold_s"] = round(time.perf_counter() - t0, 3)
        sides = (("batched", False), ("single", True)) if share else (("batched", False),)
        for side, one in sides:
            t0 = time.perf_counter()
            results = [backend.generate([r])[0] for r in requests] if one else backend.generate(requests)
            wall = time.perf_counter() - t0
            gen = sum(r.completion_tokens for r in results)
            res[side] = {"seconds": round(wall, 3), "generated_tokens": gen,
                         "tokens_per_s": round(gen / wall, 1), "errors": sum(not r.ok for r in results)}
            texts[side] = [r.text for r in results]
        if share:
            res["speedup_batched_over_single"] = round(res["single"]["seconds"] / res["batched"]["seconds"], 2)
            res["identical_outputs"] = sum(a == b for a, b in zip(texts["batched"], texts["single"]))
        out[name] = res
        backend.close()
        del backend
        _free(args.device)
    ctx["report"].log(f"hf: {json.dumps(out)}")
    return out


# --- part d: training steps and decoding ----------------------------------------------------

class OneBatch:
    """The generator trainer's data interface over one batch: `train_epoch` then runs
    exactly one optimizer step, so the curve is recorded step by step."""

    def __init__(self, batch):
        self.batch = batch

    def batches(self, split, batch_size, gen=None):
        yield self.batch


def curves_compare(cpu: list[float], dev: list[float]) -> dict:
    gap = max(abs(a - b) / max(abs(a), 1e-8) for a, b in zip(cpu, dev))
    return {"cpu_losses": [round(v, 5) for v in cpu], "device_losses": [round(v, 5) for v in dev],
            "max_relative_gap": gap, "cpu_decreases": cpu[-1] < cpu[0], "device_decreases": dev[-1] < dev[0]}


def ranker_data(tiny: bool):
    import numpy as np

    from rexeval.models.recommenders.base import TrainGraph

    n_u, n_i, n_s, n_t = (30, 20, 60, 400) if tiny else (5000, 3000, 20000, 200_000)
    rng = np.random.default_rng(SEED)
    users = rng.integers(0, n_u, n_t)
    items = rng.integers(0, n_i, n_t)
    # Planted: a user's statements come mostly from a band of its own, so BPR has signal.
    band = max(n_s // 50, 2)
    stmts = (users * 7 % (n_s - band) + rng.integers(0, band, n_t)) % n_s
    triplets = np.unique(np.stack([users, items, stmts], 1), axis=0)
    return TrainGraph.from_triplets(n_u, n_i, n_s, triplets)


def ranker_steps(model, graph, steps: int, batch: int, lr: float, device: str) -> tuple[list[float], float]:
    import torch

    from rexeval.pipelines.star.train import train_epoch

    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(SEED)
    t = torch.as_tensor(graph.triplets)
    order = torch.randperm(len(t), generator=torch.Generator().manual_seed(SEED + 1))
    losses, times = [], []
    for s in range(steps):
        part = t[order[s * batch % len(t):][:batch]]
        sync(device)
        t0 = time.perf_counter()
        losses.append(train_epoch(model, opt, part, graph.n_statements, graph.n_items, len(part), gen))
        sync(device)
        times.append(time.perf_counter() - t0)
    return losses, step_time(times)


def step_time(times: list[float]) -> float:
    """Median step time, the first step (kernel loading, allocator warm-up) left out."""
    import statistics

    return statistics.median(times[1:] if len(times) > 1 else times)


def generator_batch(n_users: int, n_items: int, size: int, words: int, low: int, high: int):
    """A planted batch: a row's words come from its user's and its item's own word lists."""
    import numpy as np
    import torch

    from rexeval.models.generators.base import BOS, EOS, PAD, Batch

    rng = np.random.default_rng(SEED)
    uw = rng.integers(low, high, (n_users, words))
    iw = rng.integers(low, high, (n_items, words))
    user = rng.integers(0, n_users, size)
    item = rng.integers(0, n_items, size)
    lengths = rng.integers(words // 2, words + 1, size)
    tokens = np.full((size, words + 2), PAD)
    for r in range(size):
        row = np.where(np.arange(words) % 2 == 0, uw[user[r]], iw[item[r]])[: lengths[r]]
        tokens[r, 0], tokens[r, 1:lengths[r] + 1], tokens[r, lengths[r] + 1] = BOS, row, EOS
    rating = (1 + (user % 3) + (item % 3)).astype("float32")
    return Batch(torch.as_tensor(user), torch.as_tensor(item), torch.as_tensor(rating), torch.as_tensor(tokens))


def generator_steps(model, batch, steps: int, device: str) -> tuple[list[float], float]:
    import torch

    from rexeval.models.generators.base import build_optimizer
    from rexeval.pipelines.generate.train import train_epoch, trainable_parameters

    d = model.DEFAULTS
    model = model.to(device)
    opt = build_optimizer(d["optimizer"], trainable_parameters(model), d["lr"], d["weight_decay"])
    data = OneBatch(batch)
    gen = torch.Generator().manual_seed(SEED)
    losses, times = [], []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        losses.append(train_epoch(model, opt, data, len(batch), d["clip"], gen))
        sync(device)
        times.append(time.perf_counter() - t0)
    return losses, step_time(times)


def decode_rate(model, batch, max_words: int, device: str) -> dict:
    import torch

    from rexeval.models.generators.base import greedy

    model = model.to(device).eval()
    b = batch.to(device)
    with torch.no_grad():
        greedy(model, b.user[:8], b.item[:8], b.rating[:8], 2)  # warm-up
        sync(device)
        t0 = time.perf_counter()
        out = greedy(model, b.user, b.item, b.rating, max_words)
        sync(device)
    wall = time.perf_counter() - t0
    tokens = sum(len(o) + 1 for o in out)  # words and the EOS
    return {"rows": len(out), "max_words": max_words, "seconds": round(wall, 4),
            "tokens_per_s": round(tokens / wall, 1), "steps_per_s": round((max_words + 1) / wall, 1)}


def part_train(args, ctx) -> dict:
    import torch

    from rexeval.models.generators.lm import OFFSET
    from rexeval.models.generators.pepler import PEPLER
    from rexeval.models.generators.peter import PETER
    from rexeval.models.recommenders.bper import BPERPlus
    from rexeval.models.recommenders.expgcn import ExpGCN
    from rexeval.pipelines.star.config import MODEL_DEFAULTS

    tiny, dev = args.tiny, args.device
    out: dict = {}
    steps = 3 if tiny else 10
    graph = ranker_data(tiny)
    out["ranker_data"] = {"users": graph.n_users, "items": graph.n_items, "statements": graph.n_statements,
                          "triplets": len(graph.triplets)}
    batch = 64 if tiny else 1024
    torch.manual_seed(SEED)
    features = torch.randn(graph.n_statements, 16 if tiny else 384).numpy()
    rankers = {
        "expgcn": lambda: ExpGCN(graph.n_users, graph.n_items, graph.n_statements, graph,
                                 dim=8 if tiny else MODEL_DEFAULTS["expgcn"]["dim"], seed=SEED),
        "bper+": lambda: BPERPlus(graph.n_users, graph.n_items, graph.n_statements,
                                  dim=MODEL_DEFAULTS["bper+"]["dim"], statement_features=features, seed=SEED),
    }
    for name, make in rankers.items():
        with _part(out, name, ctx):
            base = make()
            lr = MODEL_DEFAULTS[name]["lr"]
            cpu_l, cpu_s = ranker_steps(copy.deepcopy(base), graph, steps, batch, lr, "cpu")
            dev_l, dev_s = ranker_steps(copy.deepcopy(base), graph, steps, batch, lr, dev)
            out[name] = {**curves_compare(cpu_l, dev_l), "batch": batch, "cpu_step_s": round(cpu_s, 5),
                         "device_step_s": round(dev_s, 5), "cpu_over_device": round(cpu_s / dev_s, 2)}
    # PETER at its paper's size (vocabulary 20,000, 15 words, emsize 512).
    with _part(out, "peter", ctx):
        # Dropout off: CUDA and the CPU draw different dropout masks, so only then are
        # the two curves the same computation.
        size = {**(dict(emsize=16, nhead=2, nhid=32, nlayers=1) if tiny else {}), "dropout": 0.0}
        n_u, n_i, vocab, words = (20, 20, 200, 8) if tiny else (5000, 3000, 20000, 15)
        torch.manual_seed(SEED)
        base = PETER(n_u, n_i, vocab_size=vocab, max_words=words, **size)
        b = generator_batch(n_u, n_i, 16 if tiny else 128, words, 4, vocab)
        cpu_l, cpu_s = generator_steps(copy.deepcopy(base), b, steps, "cpu")
        dev_l, dev_s = generator_steps(copy.deepcopy(base), b.to(dev), steps, dev)
        out["peter"] = {**curves_compare(cpu_l, dev_l), "batch": len(b), "cpu_step_s": round(cpu_s, 5),
                        "device_step_s": round(dev_s, 5), "cpu_over_device": round(cpu_s / dev_s, 2),
                        "decode": decode_rate(copy.deepcopy(base),
                                              generator_batch(n_u, n_i, 32 if tiny else 512, words, 4, vocab),
                                              words, dev)}
    # PEPLER on SmolLM2-135M's architecture (random weights), the LM frozen (phase 1).
    with _part(out, "pepler", ctx):
        lm = str(build_llm(ctx["assets"], ctx["work"], overrides=TINY_LLM if tiny else {}))
        from transformers import AutoTokenizer

        n_lm = len(AutoTokenizer.from_pretrained(lm))
        n_u, n_i, words = (20, 20, 8) if tiny else (5000, 3000, 20)
        torch.manual_seed(SEED)
        base = PEPLER(n_u, n_i, vocab_size=n_lm + OFFSET, max_words=words, lm=lm, dtype="float32")
        b = generator_batch(n_u, n_i, 8 if tiny else 32, words, OFFSET + 1000, OFFSET + min(n_lm, 40_000))
        k = 2 if tiny else 5
        cpu_l, cpu_s = generator_steps(copy.deepcopy(base), b, k, "cpu")
        dev_l, dev_s = generator_steps(copy.deepcopy(base), b.to(dev), k, dev)
        res = {**curves_compare(cpu_l, dev_l), "batch": len(b), "cpu_step_s": round(cpu_s, 5),
               "device_step_s_fp32": round(dev_s, 5)}
        if not dev.startswith("cuda"):  # the steps trained copies: `base` is untouched
            res["decode"] = decode_rate(base, b, words, dev)
        del base
        _free(dev)
        if dev.startswith("cuda"):  # as the trainer builds it on a GPU: the backbone in bf16
            torch.manual_seed(SEED)
            bf = PEPLER(n_u, n_i, vocab_size=n_lm + OFFSET, max_words=words, lm=lm, dtype="bfloat16")
            bb = generator_batch(n_u, n_i, 128, words, OFFSET + 1000, OFFSET + min(n_lm, 40_000))
            bl, bs = generator_steps(bf, bb.to(dev), steps, dev)
            res["bf16"] = {"batch": len(bb), "losses": [round(v, 5) for v in bl], "device_step_s": round(bs, 5),
                           "lm_dtype": str(bf.lm_dtype), "decreases": bl[-1] < bl[0]}
            res["decode"] = decode_rate(bf, bb, words, dev)
            del bf
        out["pepler"] = res
        _free(dev)
    ctx["report"].log(f"train: {json.dumps(out, default=_plain)}")
    return out


@contextlib.contextmanager
def _part(out: dict, name: str, ctx):
    """A sub-part whose failure is recorded under its name; the next one still runs."""
    t0 = time.perf_counter()
    try:
        yield
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        ctx["report"].log(f"{name} FAILED: {type(exc).__name__}: {exc}")
    if isinstance(out.get(name), dict):
        out[name]["seconds"] = round(time.perf_counter() - t0, 2)


# --- part e: the gpu-marked tests -------------------------------------------------------------

def gpu_test_files() -> list[str]:
    files = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if re.search(r"pytest\.mark\.gpu\b", path.read_text(encoding="utf-8")):
            files.append(str(path.relative_to(REPO)))
    return files


def part_tests(args, ctx) -> dict:
    """One pytest run over every file with a `gpu` test (`-m gpu`), read back per file
    from its JUnit XML; a file that cannot be collected because it imports Ray, vLLM or
    FAISS is reported as not runnable here, any other collection error as a failure."""
    import xml.etree.ElementTree as ET

    files = gpu_test_files()
    out: dict = {"files": {rel: {"cases": {}} for rel in files}}
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    junit = ctx["work"] / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", *files, "-m", "gpu", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "--continue-on-collection-errors", f"--junitxml={junit}"]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        return {**out, "error": "timed out after 300 s", "tail": str(exc.stdout)[-3000:],
                "passed": 0, "failed": 0, "skipped": 0}
    out["returncode"] = proc.returncode
    if proc.returncode not in (0, 1, 5):  # 1: some test failed (reported per case below)
        out["tail"] = (proc.stdout + proc.stderr)[-3000:]
    modules = {rel[:-3].replace("/", "."): rel for rel in files}
    for case in (ET.parse(junit).iter("testcase") if junit.is_file() else ()):
        classname, name = case.get("classname") or "", case.get("name") or ""
        rel = modules.get(name) if not classname else next(
            (r for m, r in modules.items() if classname == m or classname.startswith(m + ".")), None)
        if rel is None:
            continue
        fail = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if not classname:  # the file itself could not be collected
            text = (fail.text or "") if fail is not None else ""
            missing = re.search(r"No module named '([\w.]+)'", text)
            if missing and missing.group(1).split(".")[0] in ABSENT_THERE:
                out["files"][rel] = {"not_runnable_here": f"imports {missing.group(1)}, absent on this machine"}
            else:
                out["files"][rel]["cases"]["<collection>"] = "failed: " + text[-300:]
            continue
        out["files"][rel]["cases"][name] = (
            "failed: " + (fail.get("message") or "")[:300] if fail is not None
            else "skipped: " + (skip.get("message") or "")[:200] if skip is not None else "passed")
    results = [c for f in out["files"].values() for c in f.get("cases", {}).values()]
    out["passed"] = sum(c == "passed" for c in results)
    out["failed"] = sum(c.startswith("failed") for c in results)
    out["skipped"] = sum(c.startswith("skipped") for c in results)
    ctx["report"].log(f"tests: passed {out['passed']}, failed {out['failed']}, skipped {out['skipped']}")
    return out


# --- main ---------------------------------------------------------------------------------------

RUNNERS = {"nli": part_nli, "embed": part_embed, "hf": part_hf, "train": part_train, "tests": part_tests}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu"),
                    help="folder for gpu_check.json and gpu_check.log")
    ap.add_argument("--assets", default=None,
                    help="folder with minilm/ and smollm2/ configs and tokenizers (default: this "
                         "machine's packaged models, as rexeval's local profile resolves them)")
    ap.add_argument("--prepare-assets", metavar="DIR", default=None,
                    help="only copy the two models' configs and tokenizers into DIR, then exit")
    ap.add_argument("--work", default=None, help="where the random-weight models are built (default: a temp dir)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--tiny", action="store_true", help="tiny models and data: a CPU smoke run of seconds")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="parts that would start after this many seconds are skipped (default 450)")
    ap.add_argument("--nli-batch", type=int, default=128)
    ap.add_argument("--nli-sizes", default="minilm,large", help="NLI model sizes to run (large: CUDA only)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="warm NLI passes timed, the median reported (default 3; 1 with --tiny)")
    ap.add_argument("--embed-batch", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=16)
    args = ap.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.tiny else 3

    if args.prepare_assets:
        print(json.dumps(prepare_assets(Path(args.prepare_assets)), indent=2))
        return 0
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    import tempfile

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no GPU here; use --device cpu (with --tiny for a smoke run)")
    start = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="rexeval-gpu-check-"))
    assets = Path(args.assets) if args.assets else None
    if assets is None:
        assets = work / "assets"
        prepare_assets(assets, int8_encoder=not args.tiny)
    report = Report(Path(args.out), {
        "what": "rexeval GPU check (benchmarks/gpu_check.py)", "command": " ".join([sys.executable, *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "tiny": args.tiny,
        "git_commit": _git_commit(), "device": device_info(args.device), "versions": versions(),
        "note": "random weights in the real architectures: speeds, placement, dtype and batching, not quality"})
    report.save()
    ctx = {"report": report, "work": work, "assets": assets}
    for part in parts:
        spent = time.perf_counter() - start
        if spent > args.budget_s:
            report.data["parts"][part] = {"skipped": f"budget: {spent:.0f} s spent of {args.budget_s:.0f}"}
            report.save()
            continue
        report.log(f"part {part} ...")
        t0 = time.perf_counter()
        try:
            result = {"ok": True, **RUNNERS[part](args, ctx)}
        except Exception as exc:
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-4000:]}
            report.log(f"part {part} FAILED: {result['error']}")
        result["seconds"] = round(time.perf_counter() - t0, 2)
        if part == "train":  # a sub-part's failure fails the part
            result["ok"] = result["ok"] and not any(isinstance(v, dict) and "error" in v for v in result.values())
        report.data["parts"][part] = result
        report.data["ray_imported"] = "ray" in sys.modules
        report.save()
        _free(args.device)
    report.data["seconds"] = round(time.perf_counter() - start, 1)
    report.save()
    report.log(f"done in {report.data['seconds']} s: " + ", ".join(
        f"{p} {'ok' if r.get('ok') else r.get('skipped') or 'FAILED'}" for p, r in report.data["parts"].items()))
    return 0 if all(r.get("ok") for r in report.data["parts"].values()) else 1


def _git_commit() -> str | None:
    """HEAD here; on a machine the tree was copied to without .git, $REXEVAL_COMMIT."""
    if os.environ.get("REXEVAL_COMMIT"):
        return os.environ["REXEVAL_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
