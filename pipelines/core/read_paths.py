"""Job settings that name files or folders the job reads, declared on the config field.

A config field typed `ReadPath` (one), `OptionalReadPath` (one or none) or `ReadPaths`
(a list) is a path the job opens. A study plan checks those settings before anything runs
(`pipelines/study/plan.py`), so a missing input is found at once instead of when the
stage's turn comes; a setting of the same name that holds a model name or a method (say
`model: nrt`) is never taken for a path, because only the field's own declaration counts.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

_READS = {"reads": True}

ReadPath = Annotated[str, Field(json_schema_extra=_READS)]
OptionalReadPath = Annotated[str | None, Field(json_schema_extra=_READS)]
ReadPaths = Annotated[list[str], Field(json_schema_extra=_READS)]


def read_settings(config: type[BaseModel]) -> list[str]:
    """The names of `config`'s fields declared as paths the job reads, in field order."""
    return [name for name, info in config.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("reads")]
