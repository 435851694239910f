"""A tiny randomly initialised 3-way NLI model (no NLI weights ship on PyPI)."""
from __future__ import annotations

import pytest

from tests.doubles.tiny_encoders import build_tiny_bert


@pytest.fixture(scope="session")
def tiny_nli(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-nli") / "nli", 3,
                           id2label={0: "entailment", 1: "neutral", 2: "contradiction"})
