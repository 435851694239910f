"""What loading the local LLM costs a fresh process, with transformers importing
scikit-learn as it does by itself ("plain": its candidate generator imported first, as
any Auto class would) or through `models/hf_import.py` ("lean"): the evidence for
`import_transformers`.

Every model actor of a study's LLM stage, every judge replica and every trained
generator's worker is a fresh process that pays this once. Each arm builds the `hf`
backend on SmolLM2-135M-Instruct (the local profile's `llm`) in a fresh interpreter and
reports that process's CPU and wall time from its start to the loaded model; the arms
alternate, ROUNDS times.

A second part measures what giving an actor its torch threads costs a fresh process
(`stage.use_cpus`, which every model actor calls before its backend loads): importing
torch to call `set_num_threads` ("import_torch", as before) against `use_cpus` now, which
leaves the count in OMP_NUM_THREADS where torch is not loaded ("use_cpus"); what an actor
whose backend never loads torch (a server's client, the scripted test LLM) saves.

    .venv/bin/python -m benchmarks.bench_model_import      # ~1 min on 2 cores

Results: benchmarks/results/model_import.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

from benchmarks.subprocess_run import script_result

REPO = Path(__file__).resolve().parents[1]

LOAD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
if sys.argv[1] == "plain":
    import transformers.generation.candidate_generator  # what an Auto class import does by itself
from rexeval.models.llm.base import BackendSpec
from rexeval.models.llm.hf_backend import HFBackend
HFBackend(BackendSpec(backend="hf", model="SmolLM2-135M-Instruct", options={}))
r = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT " + json.dumps({"cpu_s": round(r.ru_utime + r.ru_stime, 3),
                              "wall_s": round(time.perf_counter() - t0, 3),
                              "sklearn": "sklearn" in sys.modules, "modules": len(sys.modules)}))
"""
ARMS = ("plain", "lean")

THREADS = r"""
import json, resource, sys
if sys.argv[1] == "import_torch":
    import torch
    torch.set_num_threads(2)
else:
    from rexeval.pipelines.core.stage import Resources, use_cpus
    use_cpus(Resources(cpus=2))
r = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT " + json.dumps({"cpu_s": round(r.ru_utime + r.ru_stime, 3), "torch": "torch" in sys.modules}))
"""
THREAD_ARMS = ("import_torch", "use_cpus")


def alternate(script: str, arms: tuple[str, str], rounds: int, env: dict) -> dict[str, list[dict]]:
    """`script` once per arm and round in a fresh interpreter, the arms' order alternating."""
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for i in range(rounds):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            runs[arm].append(script_result(script, [arm], env, f"the {arm} arm"))
            print(arm, runs[arm][-1], flush=True)
    return runs


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "model_import.json"))
    a = ap.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    runs = alternate(LOAD, ARMS, a.rounds, env)
    threads = alternate(THREADS, THREAD_ARMS, a.rounds, env)
    threads_median = {arm: statistics.median(r["cpu_s"] for r in rs) for arm, rs in threads.items()}
    median = {arm: {k: statistics.median(r[k] for r in rs) for k in ("cpu_s", "wall_s")} for arm, rs in runs.items()}
    result = {"command": "python -m benchmarks.bench_model_import" + (f" --rounds {a.rounds}" if a.rounds != 5 else ""),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "model": "SmolLM2-135M-Instruct (hf backend, CPU)", "runs": runs, "median": median,
              "cpu_saved_per_process_s": round(median["plain"]["cpu_s"] - median["lean"]["cpu_s"], 2),
              "cpu_ratio_plain_to_lean": round(median["plain"]["cpu_s"] / median["lean"]["cpu_s"], 2),
              "wall_ratio_plain_to_lean": round(median["plain"]["wall_s"] / median["lean"]["wall_s"], 2),
              "actor_threads": {"runs": threads, "median_cpu_s": threads_median,
                                "cpu_saved_per_actor_s": round(threads_median["import_torch"]
                                                               - threads_median["use_cpus"], 2)}}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "actor_threads")}, indent=2))
    print(json.dumps({"actor_threads": threads_median}))
    return result


if __name__ == "__main__":
    main()
