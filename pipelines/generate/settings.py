"""The trained generators' settings: every setting a model takes under a preset, the
validation objectives, and what a grid may vary. No torch here: `rexeval generate train`'s
config (and so a study's `--dry-run`) checks settings with these before anything trains;
the trainer (`pipelines/generate/train.py`) uses the same functions.
"""
from __future__ import annotations

from typing import Any

from rexeval.models.generators.declared import generator_facts
from rexeval.models.generators.presets import DEFAULT_PRESET, SELECT
from rexeval.models.generators.presets import values as preset_values

DATA_KEYS = ("vocab_size", "max_words")
"""Settings the prepared data depends on (one value per experiment: not sweepable)."""
METRICS = {"loss": "val_loss", "ppl": "val_ppl", "text_rating": "val_text_rating"}
"""Validation objective (`select`) -> the metric the trainer reports it under."""
assert set(METRICS) == set(SELECT)


def resolve_settings(model: str, given: dict[str, Any], preset: str = DEFAULT_PRESET) -> dict[str, Any]:
    """Every setting of `model`: the preset's table (`models/generators/presets.py`),
    then `given`; an unknown key is refused with the list of known ones."""
    name = generator_facts(model).name
    known = preset_values(preset, name)
    unknown = sorted(set(given) - set(known) - {"model", "preset"})
    if unknown:
        raise ValueError(f"unknown {model} setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    s = {**known, **{k: v for k, v in given.items() if k not in ("model", "preset")}, "model": name,
         "preset": preset}
    if s["select"] not in METRICS:
        raise ValueError(f"select must be one of {', '.join(METRICS)}, got {s['select']!r}")
    return s


def check_grid(model: str, grid: dict[str, list]) -> None:
    """A grid may vary only `sweepable` settings of the model."""
    allowed = sweepable(model)
    for key in grid:
        if key not in allowed:
            raise ValueError(f"cannot search {key!r}: not a {model} training setting "
                             f"(sweepable: {', '.join(allowed)}; vocab_size and max_words fix the data)")


def sweepable(model: str) -> list[str]:
    """Settings a grid may vary (everything but what the prepared data depends on: the
    vocabulary, the length, the backbone, XRec's collaborative embeddings and profiles)."""
    facts = generator_facts(model)
    fixed = {*DATA_KEYS, *facts.data_keys, "lm"}
    return [k for k in preset_values(DEFAULT_PRESET, facts.name) if k not in fixed]
