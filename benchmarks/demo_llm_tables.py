"""The demo's LLM tables before and after a change, with one shared call cache (issue 46:
"the demo's LLM tables are identical before and after").

Runs `rexeval demo` from a git worktree of `--baseline` (default 74945fb, the last commit
of the pass design) and from this checkout, one after the other, both with the same
`REXEVAL_CACHE` (the second run is answered from the cache the first filled: same
answers), then compares every Parquet table of the two outputs. A table equals when its
rows are equal, NaN matching NaN, after dropping what records where or how a call was
made, not what it answered: `source` (the output's own path), `provenance`, and the
`usage` tables' token, seconds and cached-call counts (a cached call costs nothing).

    python benchmarks/demo_llm_tables.py              # writes results/demo_llm_tables.json
    python benchmarks/demo_llm_tables.py --compare-only OLD_OUT NEW_OUT
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHERE_NOT_WHAT = {"source", "provenance", "seconds", "elapsed_s", "created"}
COST = {"cached_calls", "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "cached_completion_tokens"}


def _same(a, b) -> bool:
    import pyarrow as pa
    import pyarrow.compute as pc

    if a.num_rows != b.num_rows or a.column_names != b.column_names:
        return False
    for name in a.column_names:
        x, y = a.column(name), b.column(name)
        if x.type != y.type:
            return False
        if x.equals(y):
            continue
        if not pa.types.is_floating(x.type):  # floats: NaN matches NaN
            return False
        both_nan = pc.and_(pc.is_nan(x), pc.is_nan(y))
        if not pc.all(pc.or_(pc.fill_null(pc.equal(x, y), False), pc.fill_null(both_nan, False))).as_py():
            return False
    return True


def compare(old: Path, new: Path) -> dict:
    import pyarrow.parquet as pq

    fa = {str(p.relative_to(old)) for p in old.rglob("*.parquet")}
    fb = {str(p.relative_to(new)) for p in new.rglob("*.parquet")}
    equal, differ = [], []
    for f in sorted(fa & fb):
        a, b = pq.read_table(old / f), pq.read_table(new / f)
        drop = WHERE_NOT_WHAT | (COST if "/usage/" in f else set())
        keep = [c for c in a.column_names if c not in drop]
        (equal if _same(a.select(keep), b.select([c for c in keep if c in b.column_names])) else differ).append(f)
    return {"tables": len(fa | fb), "equal": len(equal), "differ": differ,
            "only_before": sorted(fa - fb), "only_after": sorted(fb - fa)}


def run_demo(tree: Path, out: Path, cache: Path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "REXEVAL_CACHE": str(cache), "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", "rexeval.ray_jobs.demo", "--out", str(out)], cwd=tree, env=env,
                   check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default="74945fb")
    ap.add_argument("--compare-only", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "demo_llm_tables.json"))
    a = ap.parse_args()
    if a.compare_only:
        old, new = map(Path, a.compare_only)
    else:
        work = Path(tempfile.mkdtemp(prefix="rexeval-demo-cmp-"))
        base = work / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base), a.baseline], check=True)
        try:
            old, new = work / "before", work / "after"
            run_demo(base, old, work / "cache")
            run_demo(REPO, new, work / "cache")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    result = {"command": "python benchmarks/demo_llm_tables.py", "baseline": a.baseline, **compare(old, new)}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if result["differ"] or result["only_before"] or result["only_after"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
