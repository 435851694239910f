"""Plant one extension of each kind in a scratch copy of the checkout and run the tests there.

A metric, a prompted generator, a pairwise evaluator and a study job, one new file each
(tests/extension/planted/), plus a test that follows them through the product. The quick
round runs the tests that check every registered entry by its contract; `--full` runs the
whole suite (`-m "not gpu"`, as CI does) with them present.

    .venv/bin/python scripts/check_extension.py            # the quick round (a few minutes)
    .venv/bin/python scripts/check_extension.py --full     # the whole suite (~30 minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.extension.plant import CONTRACTS, scratch_checkout  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="run the whole suite, not only the contract tests")
    ap.add_argument("--dest", help="folder for the copy (default: a new temporary folder)")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("REXEVAL_TEST_WORKERS", "2")))
    ap.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    args = ap.parse_args(argv)
    dest = Path(args.dest or tempfile.mkdtemp(prefix="rexeval-extension-"))
    main_dir = scratch_checkout(dest)
    print(f"scratch checkout with the planted extensions: {main_dir}", flush=True)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not gpu"]
    if args.workers > 0:
        cmd += ["-n", str(args.workers), "--dist", "loadfile"]
    # The copy is not the installed checkout: the editable install still resolves
    # `rexeval` from elsewhere to the repository, which this test pins.
    cmd += ["--deselect", "tests/test_packaging.py::test_only_rexeval_is_importable_from_elsewhere"]
    cmd += ([] if args.full else CONTRACTS) + args.pytest_args
    t0 = time.time()
    rc = subprocess.run(cmd, cwd=main_dir, env=env).returncode
    print(f"check_extension: pytest exit {rc} after {time.time() - t0:.0f} s in {main_dir}", flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
