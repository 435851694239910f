"""Run one measured side of a benchmark in a process of its own: `run_side` in a spawned
process, so its peak memory is its own (the child writes `<out>.json`, results, and
`<out>.npz`, arrays to compare); `script_result` a script in a fresh interpreter in the
checkout (its own local Ray), which prints its result as one `RESULT <json>` line
(`result_of` reads it, for scripts a benchmark starts itself)."""
from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


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


def script_result(script: str, args: list[str], env: dict, what: str, timeout: float = 900) -> dict:
    """Run `script` with `args` in a fresh interpreter in the checkout; the JSON of its last
    `RESULT ` line. SystemExit with the tails of its output when it fails or prints none."""
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return result_of(proc.returncode, proc.stdout, proc.stderr, what)


def result_of(returncode: int, stdout: str, stderr: str, what: str) -> dict:
    """The JSON of a finished script's last `RESULT ` line; SystemExit with the tails of its
    output when it failed or printed none."""
    line = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    if returncode != 0 or not line:
        raise SystemExit(f"{what} failed:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])
