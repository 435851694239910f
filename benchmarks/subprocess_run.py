"""Run one measured side of a benchmark in its own spawned process, so its peak memory is
its own; the child writes `<out>.json` (results) and `<out>.npz` (arrays to compare)."""
from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np


def run_side(target, args: tuple, out: str, what: str) -> tuple[dict, dict]:
    """Start `target(*args, out)` in a spawned process; its JSON and arrays when it ends."""
    p = mp.get_context("spawn").Process(target=target, args=(*args, out))
    t0 = time.perf_counter()
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"{what} failed (exit {p.exitcode})")
    res = json.loads(Path(out + ".json").read_text())
    res["process_wall_s"] = time.perf_counter() - t0
    return res, dict(np.load(out + ".npz"))
