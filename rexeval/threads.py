"""How many CPU threads one process's torch and FAISS may use: what the process was
given (its Ray reservation, a trial's CPUs, a backend's `num_threads`), unless
REXEVAL_MAX_THREADS caps it.

Why a cap: every place that sets a thread count sizes it to what that one process was
given, as if it had the machine to itself. Where several processes compute at once on
few cores (two jobs on a laptop, a study's steps beside another study, two pytest
workers on 2 cores), their threads outnumber the cores and take turns: a second thread
gains nothing there, and for a trainer's small matrix products its hand-offs cost CPU
(PETER: 1.18x; benchmarks/bench_thread_cap.py). The cap is one number
for the whole process tree: the drivers forward it to their Ray workers
(`pipelines/core/runtime.FORWARDED_ENV`), and every place in the platform that sets
torch's or FAISS's threads goes through `cpu_threads`.
"""
from __future__ import annotations

import os

MAX_THREADS_ENV = "REXEVAL_MAX_THREADS"


def max_threads() -> int | None:
    """The cap from the environment, or None; a value that is not a positive whole number
    is refused with the variable's name."""
    raw = os.environ.get(MAX_THREADS_ENV, "").strip()
    if not raw:
        return None
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"{MAX_THREADS_ENV}={raw!r}: expected a whole number of threads, 1 or more")
    return cap


def cpu_threads(wanted: float | int) -> int:
    """The threads to set for a process given `wanted` cores: at least 1, at most the cap."""
    n = max(1, int(wanted))
    cap = max_threads()
    return n if cap is None else min(n, cap)
