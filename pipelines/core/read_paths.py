"""Job settings that name files or folders the job reads, declared on the config field.

A config field typed `ReadPath` (one), `OptionalReadPath` (one or none) or `ReadPaths`
(a list) is a path the job opens. A study plan checks those settings before anything runs
(`pipelines/study/plan.py`), so a missing input is found at once instead of when the
step's turn comes (a URI is checked through the storage module, like a local path);
a setting of the same name that holds a model name or a method (say
`model: nrt`) is never taken for a path, because only the field's own declaration counts.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

_READS = {"reads": True}

ReadPath = Annotated[str, Field(json_schema_extra=_READS)]
OptionalReadPath = Annotated[str | None, Field(json_schema_extra=_READS)]
ReadPaths = Annotated[list[str], Field(json_schema_extra=_READS)]


READ_SETTINGS = frozenset({
    "checkpoint", "clusters", "contexts", "data", "explanations", "human", "input", "inputs", "interactions",
    "languagetool", "meta", "model", "references", "reviews", "runs", "scores", "statements", "truth"})
"""Every name a job config gives a read field (tests/pipelines/core/test_read_paths.py
keeps it complete): a job's config hash counts the local files these name by their
content (`io.content_identity`), wherever they lie."""


def read_settings(config: type[BaseModel]) -> list[str]:
    """The names of `config`'s fields declared as paths the job reads, in field order."""
    return [name for name, info in config.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("reads")]


NOT_A_PATH = ("none", "null", "")
WEB = ("http://", "https://")  # a service the job calls (LanguageTool, an OpenAI server), not data


def path_values(config: type[BaseModel], settings: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(setting, value) for each path `settings` give to `config`'s declared read fields,
    leaving out what is no path to check: `none`, patterns (the job expands them) and
    web addresses. Local paths and storage URIs (`s3://`, `gs://`...) are both kept."""
    for name in read_settings(config):
        if name not in settings:
            continue
        value = settings[name]
        for v in value if isinstance(value, list) else [value]:
            if (not isinstance(v, str) or v.strip().lower() in NOT_A_PATH or v.startswith(WEB)
                    or any(c in v for c in "*?[")):
                continue
            yield name, v


def why_missing(path: str) -> str | None:
    """None when `path` (a local path or a URI) exists, else why it cannot be read: it
    "does not exist", or its store "cannot be reached" (a URI's scheme no filesystem
    serves is left to the job: None)."""
    from rexeval.storage import location

    if "://" not in path:
        return None if Path(path).exists() else "does not exist"
    try:
        loc = location(path)
    except (ValueError, TypeError):  # no filesystem serves this scheme here: the job says what it needs
        return None
    except OSError as exc:
        return f"cannot be reached ({type(exc).__name__}: {exc})"
    try:
        return None if loc.exists() else "does not exist"
    except OSError as exc:
        return f"cannot be reached ({type(exc).__name__}: {exc})"
