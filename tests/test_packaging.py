"""One namespace: rexeval installs as the single top-level package `rexeval` (the
repository's folders mapped to rexeval.<folder>), carries its data files, builds without
setuptools warnings, and a checkout's code is the code that runs from that checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from rexeval import LAYERS

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _copy_checkout(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir(parents=True)
    for name in ("rexeval", *LAYERS):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    shutil.copy(REPO / "setup.py", dest / "setup.py")
    return dest


def test_only_rexeval_is_importable_from_elsewhere(tmp_path):
    """From any directory: rexeval.* imports (the installed checkout); the bare folder
    names do not, so a user's own `models` or `metrics` module is never shadowed."""
    ok = _python("import rexeval.pipelines, rexeval.metrics; print(rexeval.pipelines.__file__)", tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert Path(ok.stdout.strip()).resolve() == (REPO / "pipelines" / "__init__.py").resolve()
    for name in LAYERS:
        bad = _python(f"import {name}", tmp_path)
        assert bad.returncode != 0 and "ModuleNotFoundError" in bad.stderr, name


def test_a_checkout_runs_its_own_code(tmp_path):
    """What `ray job submit --working-dir .` does: the submitted checkout is the working
    directory; its rexeval/ adds the checkout to the package path, so every rexeval
    module comes from it, even where another rexeval is installed (here: this one)."""
    copy = _copy_checkout(tmp_path / "submitted")
    got = _python("import rexeval, rexeval.pipelines.core.stage as s, rexeval.ray_jobs.cli as c;"
                  "print(rexeval.SOURCE_ROOT); print(s.__file__); print(c.__file__)", copy)
    assert got.returncode == 0, got.stderr
    root, stage, cli = (Path(x).resolve() for x in got.stdout.split())
    assert root == copy.resolve()
    assert stage.is_relative_to(copy.resolve()) and cli.is_relative_to(copy.resolve())


def test_the_wheel_holds_one_package_with_its_data_and_builds_without_warnings(tmp_path):
    src = _copy_checkout(tmp_path / "src")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = proc.stdout + proc.stderr
    for noise in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "is absent from the `packages`"):
        assert noise not in log, log
    wheel = next((tmp_path / "dist").glob("rexeval-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"rexeval", next(t for t in tops if t.endswith(".dist-info"))}
    for data in ("rexeval/prompts/rubrics/alert_criteria.yaml", "rexeval/prompts/domains/toys.yaml",
                 "rexeval/prompts/star_verify.yaml", "rexeval/models/profiles.yaml",
                 "rexeval/pipelines/sample/reviews.jsonl", "rexeval/pipelines/sample/README.md",
                 "rexeval/pipelines/core/sharded.py", "rexeval/registry.py", "rexeval/ray_jobs/cli.py"):
        assert data in names, data
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "rexeval = rexeval.ray_jobs.cli:main" in entry
