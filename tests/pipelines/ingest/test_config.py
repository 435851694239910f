"""The settings of `rexeval ingest` and `rexeval split` refuse, when they are read, every
value the job would refuse only after reading the data, or that would quietly make
nothing of it (a reversed rating scale turned every row into an error row)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from rexeval.pipelines.ingest.config import IngestConfig, SplitConfig


def ingest(**kw) -> IngestConfig:
    return IngestConfig(inputs=["r.jsonl"], out="o", **kw)


def split(**kw) -> SplitConfig:
    return SplitConfig(input="i", out="o", **kw)


@pytest.mark.parametrize("kw, message", [
    (dict(min_rating=5, max_rating=1), "min_rating (5) is above max_rating (1)"),
    (dict(min_rating=float("nan")), "finite"),
    (dict(max_rating=float("inf")), "finite"),
    (dict(chunk_mb=0), "greater than 0"),
    (dict(chunk_mb=float("inf")), "finite"),
    (dict(workers=0), "greater than or equal to 1"),
])
def test_ingest_refuses_settings_out_of_range(kw, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ingest(**kw)


def test_ingest_keeps_sensible_ratings():
    assert ingest(min_rating=0, max_rating=10).max_rating == 10
    assert ingest(min_rating=3, max_rating=3).min_rating == 3  # one valid rating: odd, but not empty


@pytest.mark.parametrize("kw, message", [
    (dict(train=1.5), "train"),
    (dict(train=0), "train"),
    (dict(valid=1), "valid"),
    (dict(valid=float("nan")), "valid"),
    (dict(train=0.9, valid=0.1), r"train \+ valid must be below 1"),
    (dict(train=0.7, valid=0.3), r"train \+ valid must be below 1"),
    (dict(min_interactions=0), "min_interactions"),
    (dict(method="leave-last-two", min_interactions=2), "at least 3 for leave-last-two"),
    (dict(kcore_user=-1), "kcore_user"),
])
def test_split_refuses_settings_out_of_range(kw, message):
    with pytest.raises(ValidationError, match=message):
        split(**kw)


def test_split_keeps_sensible_settings():
    assert split(train=0.7, valid=0.2).train == 0.7
    assert split(method="leave-last-two", min_interactions=3).min_interactions == 3
    assert split(method="leave-last-two", train=0.95, valid=0.1).method == "leave-last-two"  # unused there
