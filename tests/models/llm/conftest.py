"""Fixtures for the LLM backend tests: a tiny randomly initialised chat model built offline."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.doubles.tiny_llm import build_tiny_chat_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-llm") / "model")
