"""What the settings checks need of a trained generator (its registered name, `DEFAULTS`
and `DATA_KEYS`), without importing torch.

The generators' modules import torch, and a `--dry-run` that checks a study's settings
should not pay for it (seconds and hundreds of MB). So, until something has loaded the
generators' registry, these facts are read from the modules' source
(`rexeval.registry.declared_attributes`, which imports a class only where its source
does not settle a value); once the registry is loaded (torch with it), and for a name the
source does not show (a "package.module:Name" class, a misspelling, whose error message
is the registry's), they come from the class itself. `tests/ray_jobs/test_cli_imports.py`
checks that both ways give the same facts.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

from rexeval.models.generators import NORMALIZE, SCAN

REGISTRY_MODULE = "rexeval.models.generators.base"
"""The module that holds the generators' registry (and imports torch)."""


@dataclass(frozen=True)
class GeneratorFacts:
    name: str  # the registered name (the class's `name`)
    defaults: dict[str, Any]  # its DEFAULTS
    data_keys: tuple[str, ...]  # its DATA_KEYS


@functools.cache
def declared_generators() -> dict[str, GeneratorFacts]:
    """Every generator's facts as its module's source gives them, by registry key."""
    from rexeval.registry import declared_attributes

    return {NORMALIZE(name): GeneratorFacts(name, attrs["DEFAULTS"], tuple(attrs["DATA_KEYS"]))
            for name, attrs in declared_attributes(*SCAN, ("DEFAULTS", "DATA_KEYS")).items()}


def generator_facts(model: str) -> GeneratorFacts:
    """The facts of generator `model` (a registered name, any case, or "package.module:Name");
    an unknown name raises the registry's ValueError listing the known ones."""
    if REGISTRY_MODULE not in sys.modules:
        facts = declared_generators().get(NORMALIZE(model))
        if facts is not None:
            return GeneratorFacts(facts.name, dict(facts.defaults), facts.data_keys)
    from rexeval.models.generators.base import generator_class

    cls = generator_class(model)
    return GeneratorFacts(cls.name, dict(cls.DEFAULTS), tuple(cls.DATA_KEYS))
