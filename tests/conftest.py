"""Shared fixtures: one local Ray per test session, and the shared real data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("REXEVAL_SHARED", REPO.parent / "shared"))
SHARED_CSV = SHARED / "data" / "amazon_musical_instruments_2014_part.csv"


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started once for the whole session (3-5 s to start)."""
    from rexeval.pipelines.core.runtime import init_ray

    ray = init_ray(num_cpus=2)
    yield ray


@pytest.fixture(scope="session")
def shared_csv() -> Path:
    if not SHARED_CSV.exists():
        pytest.skip(f"shared data not found at {SHARED_CSV}")
    return SHARED_CSV
