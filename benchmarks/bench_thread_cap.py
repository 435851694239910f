"""Two processes computing at once on this machine, each with torch threads for the
whole machine ("uncapped": what every actor, trial and backend sets for itself) or with
REXEVAL_MAX_THREADS at its share of the cores ("capped"): the evidence for
`rexeval/threads.py` and for the test session's cap (tests/conftest.py `_thread_cap`).

The work is what the platform's model processes do on a CPU, through the platform's
own code (each process sets its threads as the product does, through `cpu_threads`):

  * llm:   the hf backend on SmolLM2-135M-Instruct (the local profile's LLM: extraction
           actors, the judge replica) answering a few chats, greedy;
  * train: PETER (the trainers' Tune trials) at the demo's size, Adam steps on random
           users, items and words.

Per arm, two processes of the same kind start together (two jobs side by side); each
reports the CPU and wall time of its work after its model is built. The arms alternate,
ROUNDS times; the results are the medians, and the machine's CPU over each arm
(/proc/stat) as a check on the processes' own.

    .venv/bin/python -m benchmarks.bench_thread_cap            # ~3 min on 2 cores
    .venv/bin/python -m benchmarks.bench_thread_cap --rounds 1 --omp-wait library \
        --out benchmarks/results/thread_cap_omp_library.json    # ~3 min: threads that spin

Results: benchmarks/results/thread_cap.json (and thread_cap_omp_library.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.machine_cpu import machine_cpu_s
from benchmarks.subprocess_run import result_of
from rexeval.pipelines.core.runtime import OMP_WAIT
from rexeval.threads import MAX_THREADS_ENV

REPO = Path(__file__).resolve().parents[1]
KINDS = ("llm", "train")
ARMS = ("uncapped", "capped")

WORK = r"""
import json, resource, sys, time
kind, n = sys.argv[1], int(sys.argv[2])
import torch
from rexeval.threads import cpu_threads

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

if kind == "llm":
    from rexeval.models.llm.base import BackendSpec, ChatRequest
    from rexeval.models.llm.hf_backend import HFBackend
    backend = HFBackend(BackendSpec(backend="hf", model="SmolLM2-135M-Instruct",
                                    options={"num_threads": 2, "batch_size": 2}))
    chats = [ChatRequest(messages=[{"role": "user", "content": f"Review {i}: the strings buzz, the case is "
                                    "sturdy and the tuner drifts. List what the reviewer liked."}],
                         sampling={"max_tokens": 48}) for i in range(n)]
    work = lambda: backend.generate(chats)
else:
    from rexeval.models.generators.base import Batch
    from rexeval.models.generators.peter import PETER
    torch.set_num_threads(cpu_threads(2))  # what a trial with 2 CPUs sets (pipelines/generate/train.py)
    torch.manual_seed(0)
    model = PETER(36, 50, vocab_size=800, max_words=15, emsize=64, nhid=128)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    batch = Batch(torch.randint(0, 36, (32,), generator=g), torch.randint(0, 50, (32,), generator=g),
                  torch.rand(32, generator=g) * 4 + 1, torch.randint(4, 800, (32, 17), generator=g))
    def work():
        model.train()
        for _ in range(n):
            loss = model.losses(batch)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
c0, t0 = cpu(), time.perf_counter()
work()
print("RESULT " + json.dumps({"cpu_s": round(cpu() - c0, 3), "wall_s": round(time.perf_counter() - t0, 3),
                              "threads": torch.get_num_threads()}))
"""
UNITS = {"llm": 4, "train": 150}  # chats per process; training steps per process


def pair(kind: str, arm: str, env: dict) -> dict:
    """Two processes of `kind` started together; each one's work, and the machine's CPU."""
    env = dict(env)
    env.pop(MAX_THREADS_ENV, None)
    if arm == "capped":
        env[MAX_THREADS_ENV] = str(max(1, (os.cpu_count() or 1) // 2))
    c0, t0 = machine_cpu_s(), time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WORK, kind, str(UNITS[kind])], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    runs = [result_of(p.returncode, out, err, f"the {kind}/{arm} process") for p, (out, err) in zip(procs, outs)]
    return {"processes": runs, "machine_cpu_s": round(machine_cpu_s() - c0, 2),
            "wall_s": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--omp-wait", default=OMP_WAIT, choices=[OMP_WAIT, "library"],
                    help="the processes' OMP_WAIT_POLICY (library: libgomp's default)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "thread_cap.json"))
    a = ap.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    # OpenMP threads sleep while they wait, as on every local Ray of the platform's
    # (pipelines/core/runtime.py OMP_WAIT) and in the test session; `--omp-wait library`
    # leaves libgomp's own default (spin a while, then sleep).
    env.pop("OMP_WAIT_POLICY", None)
    if a.omp_wait != "library":
        env["OMP_WAIT_POLICY"] = a.omp_wait
    runs: dict[str, dict[str, list[dict]]] = {k: {arm: [] for arm in ARMS} for k in KINDS}
    for i in range(a.rounds):
        for kind in KINDS:
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                runs[kind][arm].append(pair(kind, arm, env))
                print(kind, arm, runs[kind][arm][-1], flush=True)
    median = {}
    for kind, arms in runs.items():
        median[kind] = {}
        for arm, rs in arms.items():
            median[kind][arm] = {
                "work_cpu_s": statistics.median(sum(p["cpu_s"] for p in r["processes"]) for r in rs),
                "work_wall_s": statistics.median(max(p["wall_s"] for p in r["processes"]) for r in rs),
                "machine_cpu_s": statistics.median(r["machine_cpu_s"] for r in rs),
                "threads": rs[0]["processes"][0]["threads"]}
        u, c = median[kind]["uncapped"], median[kind]["capped"]
        median[kind]["cpu_ratio_uncapped_to_capped"] = round(u["work_cpu_s"] / c["work_cpu_s"], 2)
        median[kind]["wall_ratio_uncapped_to_capped"] = round(u["work_wall_s"] / c["work_wall_s"], 2)
    command = "python -m benchmarks.bench_thread_cap" + (f" --rounds {a.rounds}" if a.rounds != 3 else "") \
        + (f" --omp-wait {a.omp_wait}" if a.omp_wait != OMP_WAIT else "")
    result = {"command": command, "omp_wait_policy": env.get("OMP_WAIT_POLICY", "libgomp's default"),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "units": UNITS, "median": median, "runs": runs}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(median, indent=2))
    return result


if __name__ == "__main__":
    main()
