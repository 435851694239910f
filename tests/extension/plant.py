"""A scratch checkout with one planted extension of each kind (tests/extension/planted/).

`PLACES` says where each planted file goes: a metric in `metrics/`, a prompted generator
in `pipelines/generate/prompted/`, a pairwise evaluator in `pipelines/judge/evaluators/`, a
study job as a capability's `study_job.py`, and the test that follows them through the
product. Nothing else of the copy is edited: each kind is one file, found by its registry.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLANTED = Path(__file__).resolve().parent / "planted"
PLACES = {
    "metric.py": "metrics/scratch_words.py",
    "method.py": "pipelines/generate/prompted/scratch_history.py",
    "evaluator.py": "pipelines/judge/evaluators/scratch_shorter.py",
    "study_job.py": "pipelines/meta_evaluate/study_job.py",
    "checks.py": "tests/test_planted_extensions.py",
}
# The suite's files that check every registered entry by its contract (the quick round);
# the whole suite is the full round (scripts/check_extension.py --full).
CONTRACTS = [
    "tests/test_planted_extensions.py",
    "tests/pipelines/generate/prompted/test_plans.py",
    "tests/pipelines/generate/prompted/test_job.py",
    "tests/pipelines/judge/test_evaluators.py",
    "tests/pipelines/study/test_study_job_module.py",
    "tests/metrics/test_registry.py",
    "tests/test_docs.py",
    "tests/test_layering.py",
    "tests/ray_jobs/test_cli_imports.py",
    "tests/ray_jobs/test_help_defaults.py",
]


def tracked_files(repo: Path = REPO) -> list[str]:
    """The checkout's files: git's tracked ones, or, outside a git checkout, every file but
    hidden folders, caches and build outputs."""
    res = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True)
    if res.returncode == 0:
        return [f for f in res.stdout.decode().split("\0") if f]
    skip = {"__pycache__", "site", "build", "dist"}
    return [str(f.relative_to(repo)) for f in sorted(repo.rglob("*")) if f.is_file()
            and not any(part.startswith(".") or part in skip or part.endswith(".egg-info")
                        for part in f.relative_to(repo).parts)]


def planted_here(repo: Path = REPO) -> bool:
    """True inside a scratch copy: the planted files are in their places already."""
    return any((repo / place).exists() for place in PLACES.values())


def scratch_checkout(dest: Path, repo: Path = REPO) -> Path:
    """The checkout's tracked files copied to `dest`/main, `../shared` linked beside it as
    in the repository, and the planted files dropped in their places. Returns the copy."""
    main = dest / "main"
    for rel in tracked_files(repo):
        src = repo / rel
        if not src.is_file():
            continue  # a file deleted in the working tree
        (main / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, main / rel)
    shared = (repo / ".." / "shared").resolve()
    if shared.is_dir() and not (dest / "shared").exists():
        os.symlink(shared, dest / "shared")
    for name, place in PLACES.items():
        target = main / place
        if target.exists():
            raise FileExistsError(f"{place} exists already: the planted {name} must be a new file")
        shutil.copy2(PLANTED / name, target)
    return main
