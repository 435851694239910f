"""Refuse an output folder that is, holds or lies inside one of the job's own inputs.

Why: a job owns its output folder. With `--overwrite` it removes what it wrote there
before; without it, it still writes shards, markers and reports into it. An `--out`
equal to the input's folder (`rexeval ingest u/r.jsonl --out u`), a folder holding an
input (`--out runs` while reading `runs/mi/ingest`), or a folder inside an input
(`--out runs/mi/ingest/x`) would let a job write into, or remove, what it is reading.
So before anything is touched, every path the job's settings name for reading is
compared with its output, and an overlap is refused naming both.

Which settings name inputs, each job's config declares (`read_paths.ReadPath` and
friends, at any depth of the settings); an explicitly given LLM-call cache counts too (a
cache inside the output would be reported as the job's own and cleared with it). Paths
are compared as the storage module addresses them: local paths absolute with links
resolved, URIs by scheme (`s3a` is `s3`, `gcs` is `gs`), bucket and key; a local path
and a URI never overlap.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from rexeval.pipelines.core.read_paths import NOT_A_PATH, WEB, read_settings
from rexeval.storage import is_uri

_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
CACHE_SETTINGS = ("cache",)
"""Settings that name a cache a job reads and writes (`llm.job.LLMJobSettings.cache`)."""


class OutputOverlapsInput(ValueError):
    """An output folder that is, holds or lies inside an input (a ValueError, so a
    command prints it as one line and exits 2)."""

    def __init__(self, out_setting: str, out: str, setting: str, path: str, relation: str):
        self.out, self.path, self.relation = out, path, relation
        what = {"is": "is", "contains": "holds", "inside": "lies inside"}[relation]
        super().__init__(
            f"--{out_setting.replace('_', '-')} {out} {what} an input of this job ({setting}: {path}); "
            "the job writes (and with --overwrite removes) files in its output folder: choose one "
            "apart from every input")


def key(path: str) -> tuple[str, ...]:
    """`path` as comparable parts: ("", dir, ...) for a local path (absolute, links
    resolved), (scheme, bucket, key, ...) for a URI."""
    text = path[len("file://"):] if path.startswith("file://") else path
    if is_uri(text):
        scheme, _, rest = text.partition("://")
        return (_SCHEMES.get(scheme.lower(), scheme.lower()), *[p for p in rest.split("/") if p])
    real = os.path.realpath(os.path.expanduser(text))
    return ("", *[p for p in real.split(os.sep) if p])


def relation(out: str, path: str) -> str | None:
    """"is", "contains" (out holds path) or "inside" (out lies inside path); None when
    the two are apart."""
    a, b = key(out), key(path)
    if a[0] != b[0]:
        return None
    if a == b:
        return "is"
    if b[:len(a)] == a:
        return "contains"
    if a[:len(b)] == b:
        return "inside"
    return None


def _paths(value: Any) -> Iterator[str]:
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, dict):  # e.g. ingest's {"path", "size"} records
            v = v.get("path")
        if (isinstance(v, str) and v.strip().lower() not in NOT_A_PATH and not v.startswith(WEB)
                and not any(c in v for c in "*?[")):
            yield v


def inputs_of(cfg: BaseModel, prefix: str = "") -> list[tuple[str, str]]:
    """(setting, path) of every input `cfg` names: its declared read settings and
    explicit caches, in nested settings too (`llm.cache`)."""
    found: list[tuple[str, str]] = []
    reads = set(read_settings(type(cfg)))
    for name in type(cfg).model_fields:
        value = getattr(cfg, name, None)
        if name in reads or name in CACHE_SETTINGS:
            found += [(prefix + name, p) for p in _paths(value)]
        elif isinstance(value, BaseModel):
            found += inputs_of(value, prefix + name + ".")
    return found


def check_apart(out: str | None, inputs: Iterable[tuple[str, str]], out_setting: str = "out") -> None:
    """Raise OutputOverlapsInput for the first input `out` is, holds or lies inside."""
    if not out:
        return
    for setting, path in inputs:
        rel = relation(str(out), str(path))
        if rel is not None:
            raise OutputOverlapsInput(out_setting, str(out), setting, str(path), rel)


class OutputIsAFile(ValueError):
    """An output folder setting that names an existing file."""


def check_output_apart(cfg: BaseModel, out_setting: str = "out") -> None:
    """A job's `out` before anything is written: not an existing file, and apart from
    every input its settings name (`check_apart`)."""
    from rexeval.storage import location

    out = getattr(cfg, out_setting, None)
    if not out:
        return
    check_apart(out, inputs_of(cfg), out_setting)
    if location(out).is_file():
        raise OutputIsAFile(f"--{out_setting.replace('_', '-')} {out} is a file; the job writes a folder "
                            "of outputs there: give a folder (new or the job's own)")
