"""Rubrics: named lists of criteria or aspects that judge and generation prompts render.

Seed 004's four evaluation criteria, seed 001's four Likert aspects and the style rules
of the explanation generators are data, not code: a user changes a criterion's wording
or adds one by editing (or overriding) `prompts/rubrics/<name>.yaml`, and the prompt
version string of every call that renders the rubric changes with it. Files are found
through the same search path as prompts (`prompts.loader.search_path`).

A rubric file holds `name` (the file stem), `version`, `description` and `items`: a list
of `{name, title, description}` with distinct lower-case names.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from rexeval.prompts.errors import PromptError
from rexeval.prompts.loader import search_path

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class RubricItem:
    """One criterion / aspect: `name` is what outputs and tables use."""

    name: str
    title: str
    description: str


@dataclass(frozen=True)
class Rubric:
    name: str
    version: str  # "<name>/v<declared>-<sha8>": changes whenever the file does
    description: str
    items: tuple[RubricItem, ...]
    path: Path | None = None

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.items]

    def item(self, name: str) -> RubricItem:
        for i in self.items:
            if i.name == name:
                return i
        raise PromptError(f"rubric {self.name!r} has no item {name!r}; it has {self.names}")

    def subset(self, names: list[str] | None) -> "Rubric":
        """The rubric limited to `names` (in the rubric's order); all items when None."""
        if not names:
            return self
        unknown = sorted(set(names) - set(self.names))
        if unknown:
            raise PromptError(f"rubric {self.name!r} has no item(s) {unknown}; it has {self.names}")
        keep = tuple(i for i in self.items if i.name in set(names))
        return Rubric(self.name, self.version, self.description, keep, self.path)


def list_rubrics(directory: str | os.PathLike | None = None) -> list[str]:
    found = set()
    for d in search_path(directory):
        if (d / "rubrics").is_dir():
            found |= {p.stem for p in (d / "rubrics").glob("*.yaml") if _NAME.match(p.stem)}
    return sorted(found)


def load_rubric(name: str, directory: str | os.PathLike | None = None) -> Rubric:
    """The rubric `name` from the first folder of the search path that has it, or a
    file path given directly (e.g. `--criteria my_criteria.yaml`)."""
    direct = Path(str(name)).expanduser()
    if direct.suffix in (".yaml", ".yml") and direct.is_file():
        return _parse(str(direct.resolve()), direct.read_bytes(), check_stem=False)
    if isinstance(name, str) and _NAME.match(name):
        for d in search_path(directory):
            path = d / "rubrics" / f"{name}.yaml"
            if path.is_file():
                return _parse(str(path), path.read_bytes(), check_stem=True)
    raise PromptError(f"unknown rubric {name!r}; known: {', '.join(list_rubrics(directory)) or 'none'} "
                      "(or give a path to a .yaml file)")


@functools.lru_cache(maxsize=32)
def _parse(path: str, raw: bytes, check_stem: bool) -> Rubric:
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise PromptError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise PromptError(f"{path}: a rubric file must be a YAML mapping")
    missing = [k for k in ("name", "version", "description", "items") if k not in data]
    unknown = sorted(set(data) - {"name", "version", "description", "items"})
    if missing or unknown:
        raise PromptError(f"{path}: missing key(s) {missing}, unknown key(s) {unknown}")
    if check_stem and data["name"] != Path(path).stem:
        raise PromptError(f"{path}: name {data['name']!r} differs from the file name")
    version = data["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PromptError(f"{path}: version must be an integer >= 1, got {version!r}")
    items = data["items"]
    if not isinstance(items, list) or not items:
        raise PromptError(f"{path}: `items` must be a non-empty list")
    out = []
    for i, it in enumerate(items):
        keys = ("name", "title", "description")
        if not (isinstance(it, dict) and set(it) == set(keys)
                and all(isinstance(it[k], str) and it[k].strip() for k in keys)):
            raise PromptError(f"{path}: item {i} needs exactly non-empty {', '.join(keys)}")
        if not _NAME.match(it["name"]):
            raise PromptError(f"{path}: item name {it['name']!r} must be lower-case a-z, 0-9, _")
        out.append(RubricItem(it["name"], it["title"].strip(), " ".join(it["description"].split())))
    names = [i.name for i in out]
    if len(set(names)) != len(names):
        raise PromptError(f"{path}: duplicate item names in {names}")
    sha = hashlib.sha256(raw).hexdigest()
    return Rubric(str(data["name"]), f"{data['name']}/v{version}-{sha[:8]}", str(data["description"]).strip(),
                  tuple(out), Path(path))
