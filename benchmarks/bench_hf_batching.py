"""Batched vs one-prompt-at-a-time generation with the `hf` backend (real SmolLM2).

Side by side in one process, on the SAME chat prompts (the `star_candidates` extraction
prompt over real reviews from the shared Kaggle CSV, or a fixed extraction instruction
when the prompt library is not importable) with the same greedy sampling and max_tokens:
- batched: HFBackend with `batch_size` (default 16): length-sorted, left-padded batches;
- single: the same backend class with batch_size 1, one `generate()` per prompt.

Reports wall time, generated tokens/s and reviews/s for each, the speed-up ratio
(target >= 3x) and how many outputs were identical. Greedy decoding in a padded batch
runs different matrix shapes, so a few outputs may differ in the last float bits and then
diverge; the count says how many.

`--constrained` uses the JSON-schema path (xgrammar) on both sides. `--gpu` (only where
CUDA is available) compares the `ray.data.llm` processor (rexeval's vllm backend) with
plain `vllm.LLM.generate` on the same prompts (target >= 0.8x), each in its own process.

    python benchmarks/bench_hf_batching.py --n 32 --batch-size 16 --max-tokens 128
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_CSV = REPO.parent / "shared" / "data" / "amazon_musical_instruments_2014_part.csv"
FALLBACK_SYSTEM = ("Read the customer review and list the facts it states about the product "
                   "as short statements, each with a sentiment (positive, negative or neutral). "
                   'Reply with JSON only: {"statements": [{"statement": ..., "sentiment": ...}]}.')
FALLBACK_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["statements"],
    "properties": {"statements": {"type": "array", "maxItems": 6, "items": {
        "type": "object", "additionalProperties": False, "required": ["statement", "sentiment"],
        "properties": {"statement": {"type": "string", "minLength": 1, "maxLength": 120},
                       "sentiment": {"type": "string",
                                     "enum": ["positive", "negative", "neutral"]}}}}}}


def load_reviews(path: Path, n: int, max_words: int) -> list[str]:
    """The first `n` non-empty review texts (column 5 of the headerless Kaggle CSV)."""
    out = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        for row in csv.reader(f):
            text = row[4].strip() if len(row) > 4 else ""
            if text:
                out.append(" ".join(text.split()[:max_words]))
            if len(out) == n:
                break
    return out


def build_messages(reviews: list[str]) -> tuple[list[list[dict]], dict, str]:
    """(messages per review, JSON schema, which prompt was used)."""
    try:
        from rexeval.prompts import load_prompt

        prompt = load_prompt("star_candidates")
        msgs = [prompt.render(review=r) for r in reviews]
        try:
            from rexeval.pipelines.extract.outputs import CANDIDATES

            schema = CANDIDATES.json_schema()
        except ImportError:
            schema = FALLBACK_SCHEMA
        return msgs, schema, prompt.version_for(None)
    except Exception:  # prompt library missing or changed: a fixed instruction instead
        return ([[{"role": "system", "content": FALLBACK_SYSTEM},
                  {"role": "user", "content": r}] for r in reviews], FALLBACK_SCHEMA, "fallback")


def run_side(backend, requests, one_at_a_time: bool) -> dict:
    t0 = time.perf_counter()
    if one_at_a_time:
        results = [backend.generate([r])[0] for r in requests]
    else:
        results = backend.generate(requests)
    wall = time.perf_counter() - t0
    gen = sum(r.completion_tokens for r in results)
    return {"seconds": wall, "generated_tokens": gen, "tokens_per_s": gen / wall,
            "reviews_per_s": len(requests) / wall,
            "prompt_tokens": sum(r.prompt_tokens for r in results),
            "errors": sum(not r.ok for r in results),
            "finish_length": sum(r.finish_reason == "length" for r in results),
            "texts": [r.text for r in results]}


def valid_json(texts: list[str | None]) -> int:
    n = 0
    for t in texts:
        try:
            json.loads(t or "")
            n += 1
        except ValueError:
            pass
    return n


def cpu_bench(args) -> dict:
    import torch

    from rexeval.models.llm import BackendSpec, ChatRequest, SamplingParams
    from rexeval.models.llm.hf_backend import HFBackend

    load_start = os.getloadavg()[0]  # other processes on the machine skew the timings
    reviews = load_reviews(Path(args.csv), args.n, args.max_words)
    messages, schema, prompt_name = build_messages(reviews)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    requests = [ChatRequest(messages=m, sampling=sampling,
                            json_schema=schema if args.constrained else None) for m in messages]
    mode = "xgrammar" if args.constrained else "none"
    t0 = time.perf_counter()
    backend = HFBackend(BackendSpec(model=args.model, options={
        "batch_size": args.batch_size, "device": "cpu", "constrained": mode,
        "num_threads": args.threads}))
    load_s = time.perf_counter() - t0
    # Warm-up (first-call allocations, grammar compilation) outside the timings.
    warm = [r.model_copy(update={"sampling": SamplingParams(max_tokens=4)}) for r in requests[:2]]
    backend.generate(warm)

    print(f"{len(reviews)} reviews, prompt: {prompt_name}, max_tokens {args.max_tokens}, "
          f"constrained: {args.constrained}, torch threads: {torch.get_num_threads()}")
    # One backend for both sides: "single" calls generate() with one request at a time.
    sides = {"batched": run_side(backend, requests, False)}
    print(f"batched done in {sides['batched']['seconds']:.1f}s")
    sides["single"] = run_side(backend, requests, True)
    same = sum(a == b for a, b in zip(sides["batched"]["texts"], sides["single"]["texts"]))
    result = {
        "reviews": len(reviews), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "model": args.model, "prompt": prompt_name, "batch_size": args.batch_size,
        "max_tokens": args.max_tokens, "constrained": args.constrained,
        "model_load_s": load_s,
        "load_avg_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "speedup_batched_over_single": sides["single"]["seconds"] / sides["batched"]["seconds"],
        "identical_outputs": same,
    }
    for name, side in sides.items():
        texts = side.pop("texts")
        side["valid_json"] = valid_json(texts)
        side["sample_output"] = texts[0]
        result[name] = side
    return result


def print_cpu(result: dict) -> None:
    print(f"{'':10}{'wall s':>9}{'gen tok':>9}{'tok/s':>8}{'reviews/s':>11}{'errors':>8}"
          f"{'hit max':>9}{'valid JSON':>12}")
    for name in ("batched", "single"):
        r = result[name]
        print(f"{name:10}{r['seconds']:>9.1f}{r['generated_tokens']:>9}{r['tokens_per_s']:>8.1f}"
              f"{r['reviews_per_s']:>11.3f}{r['errors']:>8}{r['finish_length']:>9}"
              f"{r['valid_json']:>12}")
    print(f"speed-up (batched / single): {result['speedup_batched_over_single']:.2f}x "
          f"(target >= 3x); identical outputs: {result['identical_outputs']}/{result['reviews']}")


# --- GPU: ray.data.llm processor vs plain vLLM ------------------------------------------

def gpu_child(args) -> dict:
    """One side of the GPU comparison, run in its own process (GPU memory is freed after)."""
    from rexeval.models.llm import BackendSpec
    from rexeval.models.refs import resolve

    reviews = load_reviews(Path(args.csv), args.gpu_n, args.max_words)
    messages, schema, _ = build_messages(reviews)
    location = resolve(args.gpu_model).location
    engine = {"max_model_len": 4096, "enable_prefix_caching": True}
    t0 = time.perf_counter()
    if args.gpu_child == "vllm":
        from transformers import AutoTokenizer
        from vllm import LLM, SamplingParams

        tok = AutoTokenizer.from_pretrained(location)
        prompts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
                   for m in messages]
        llm = LLM(model=location, **engine)
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
        gen = sum(len(o.outputs[0].token_ids) for o in outs)
    else:
        import ray

        from rexeval.models.llm import ChatRequest
        from rexeval.models.llm import SamplingParams as SP
        from rexeval.models.llm.vllm_backend import build_request_processor, request_rows
        from rexeval.pipelines.core.runtime import init_ray

        init_ray()
        spec = BackendSpec(backend="vllm", model=location, options={
            "engine_kwargs": engine, "batch_size": args.gpu_batch_size, "concurrency": 1})
        reqs = [ChatRequest(messages=m, sampling=SP(max_tokens=args.max_tokens)) for m in messages]
        rows = build_request_processor(spec)(ray.data.from_items(request_rows(reqs))).take_all()
        gen = sum(int(r["completion_tokens"] or 0) for r in rows)
    wall = time.perf_counter() - t0
    return {"seconds": wall, "generated_tokens": gen, "tokens_per_s": gen / wall,
            "reviews_per_s": len(reviews) / wall}


def gpu_bench(args) -> dict:
    me = str(Path(__file__).resolve())
    out = {}
    for side in ("vllm", "ray_data_llm"):
        cmd = [sys.executable, me, "--gpu-child", side, "--gpu-n", str(args.gpu_n),
               "--gpu-model", args.gpu_model, "--max-tokens", str(args.max_tokens),
               "--csv", args.csv, "--gpu-batch-size", str(args.gpu_batch_size)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        if proc.returncode:
            raise RuntimeError(f"{side} run failed with {proc.returncode}")
        out[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["ratio_ray_over_vllm"] = out["vllm"]["seconds"] / out["ray_data_llm"]["seconds"]
    print(f"GPU, {args.gpu_n} reviews: vLLM {out['vllm']['seconds']:.1f}s, ray.data.llm "
          f"{out['ray_data_llm']['seconds']:.1f}s, ratio {out['ratio_ray_over_vllm']:.2f}x "
          "(target >= 0.8x; both include the engine start)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="reviews (prompts)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-words", type=int, default=384, help="review truncation, as extract")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's choice, one per core); use 1 "
                         "when other processes keep a core busy: 2 contended threads are slower")
    ap.add_argument("--constrained", action="store_true", help="JSON-schema decoding on both sides")
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--gpu", action="store_true", help="also compare ray.data.llm with plain vLLM")
    ap.add_argument("--gpu-n", type=int, default=1000)
    ap.add_argument("--gpu-model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--gpu-batch-size", type=int, default=64)
    ap.add_argument("--gpu-child", choices=["vllm", "ray_data_llm"], help=argparse.SUPPRESS)
    ap.add_argument("--json-out", default=None,
                    help="default benchmarks/results/hf_batching[_constrained].json")
    args = ap.parse_args()
    if args.gpu_child:
        print(json.dumps(gpu_child(args)))
        return

    result = cpu_bench(args)
    print_cpu(result)
    if args.gpu:
        import torch

        if torch.cuda.is_available():
            result["gpu"] = gpu_bench(args)
        else:
            print("--gpu: no CUDA device here, GPU section skipped")
            result["gpu"] = None
    name = "hf_batching_constrained.json" if args.constrained else "hf_batching.json"
    out = Path(args.json_out or REPO / "benchmarks" / "results" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
