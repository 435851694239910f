"""Find, parse, validate and cache prompt and domain files.

Files are looked up in layers, first hit wins: the `directory` argument, then the
folder named by $REXEVAL_PROMPTS_DIR, then the files shipped inside this package. A
user can thus override one prompt or add one domain without copying the rest; the
version string (which hashes the file bytes) shows which file was used. The cache is
keyed by path and bytes, so an edited file is picked up on the next load.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rexeval.prompts.errors import PromptError
from rexeval.prompts.template import PromptTemplate

PACKAGE_DIR = Path(__file__).resolve().parent
ENV_VAR = "REXEVAL_PROMPTS_DIR"
SENTIMENTS = ("positive", "negative", "neutral")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_TRIPLET_KEYS = {"statement", "topic", "sentiment"}


@dataclass(frozen=True)
class Topic:
    """One entry of a domain's fixed topic list; `name` is what the model must output."""

    name: str
    long_name: str
    description: str


@dataclass(frozen=True)
class Domain:
    """A product domain: its topic table and the few-shot examples for triplet extraction."""

    domain: str
    display_name: str
    topics: list[Topic]
    examples: list[dict] = field(default_factory=list)
    path: Path | None = None
    sha256: str = ""  # of the file bytes; empty for a Domain built in code

    @property
    def topic_names(self) -> list[str]:
        return [t.name for t in self.topics]

    @property
    def digest(self) -> str:
        """Hash that changes whenever the domain's content does (file bytes when loaded)."""
        if self.sha256:
            return self.sha256
        content = {"domain": self.domain, "display_name": self.display_name,
                   "topics": [vars(t) for t in self.topics], "examples": self.examples}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def search_path(directory: str | os.PathLike | None = None) -> list[Path]:
    """Folders searched, in order: `directory`, $REXEVAL_PROMPTS_DIR, the package."""
    layers = [directory, os.environ.get(ENV_VAR) or None]
    out: list[Path] = []
    for layer in layers:
        if layer is None:
            continue
        path = Path(layer).expanduser()
        if not path.is_dir():
            raise PromptError(f"prompts directory not found: {path}")
        out.append(path)
    out.append(PACKAGE_DIR)
    return list(dict.fromkeys(p.resolve() for p in out))


def list_prompts(directory: str | os.PathLike | None = None) -> list[str]:
    """Names of every prompt file visible through the search path, sorted."""
    return _names(search_path(directory), None)


def list_domains(directory: str | os.PathLike | None = None) -> list[str]:
    """Names of every domain file visible through the search path, sorted."""
    return _names(search_path(directory), "domains")


def load_prompt(name: str, directory: str | os.PathLike | None = None) -> PromptTemplate:
    """The prompt `name`, parsed and validated (cached while the file is unchanged)."""
    path = _find(name, directory, None, "prompt")
    return _prompt_from_bytes(str(path), path.read_bytes())


def inline_prompt(text: str, origin: str, directory: str | os.PathLike | None = None) -> PromptTemplate:
    """A prompt written as YAML text inside a plug-in's own module (so that a new prompted
    generator is one file), checked like a prompt file. A file of the same name in
    `directory` or $REXEVAL_PROMPTS_DIR still wins, as it does over the shipped files;
    `origin` (e.g. the module's name), then the prompt's name, stand for its path in messages."""
    raw = text.encode("utf-8")
    data = _parse_yaml(origin, raw)
    name = data.get("name") if isinstance(data, dict) else None
    if isinstance(name, str) and _NAME.match(name):
        for d in search_path(directory)[:-1]:  # the user's layers, not the package's
            path = d / f"{name}.yaml"
            if path.is_file():
                return _prompt_from_bytes(str(path), path.read_bytes())
    return _prompt_from_bytes(f"{origin}/{name}.yaml" if isinstance(name, str) else origin, raw)


def load_domain(name: str, directory: str | os.PathLike | None = None) -> Domain:
    """The domain `name` with its topic table and examples (cached while unchanged)."""
    path = _find(name, directory, "domains", "domain")
    return _domain_from_bytes(str(path), path.read_bytes())


def _names(dirs: list[Path], sub: str | None) -> list[str]:
    found = set()
    for d in dirs:
        folder = d / sub if sub else d
        if folder.is_dir():
            found |= {p.stem for p in folder.glob("*.yaml") if _NAME.match(p.stem)}
    return sorted(found)


def _find(name: str, directory: Any, sub: str | None, kind: str) -> Path:
    dirs = search_path(directory)
    if isinstance(name, str) and _NAME.match(name):
        for d in dirs:
            path = (d / sub if sub else d) / f"{name}.yaml"
            if path.is_file():
                return path
    known = _names(dirs, sub)
    raise PromptError(f"unknown {kind} {name!r}; known: {', '.join(known) or 'none'} "
                      f"(searched {', '.join(map(str, dirs))})")


def _parse_yaml(path: str, raw: bytes) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise PromptError(f"{path}: invalid YAML: {exc}") from exc


@functools.lru_cache(maxsize=64)
def _prompt_from_bytes(path: str, raw: bytes) -> PromptTemplate:
    return PromptTemplate(Path(path), raw, _parse_yaml(path, raw))


@functools.lru_cache(maxsize=64)
def _domain_from_bytes(path: str, raw: bytes) -> Domain:
    data = _parse_yaml(path, raw)
    if not isinstance(data, dict):
        raise PromptError(f"{path}: a domain file must be a YAML mapping")
    missing = [k for k in ("domain", "display_name", "topics") if k not in data]
    unknown = sorted(set(data) - {"domain", "display_name", "topics", "examples"})
    if missing or unknown:
        raise PromptError(f"{path}: missing key(s) {missing}, unknown key(s) {unknown}")
    if data["domain"] != Path(path).stem:
        raise PromptError(f"{path}: domain {data['domain']!r} differs from the file name")
    if not isinstance(data["display_name"], str) or not data["display_name"].strip():
        raise PromptError(f"{path}: `display_name` must be a non-empty string")
    topics = _topics(path, data["topics"])
    examples = _examples(path, data.get("examples") or [], {t.name for t in topics})
    return Domain(data["domain"], data["display_name"], topics, examples, Path(path),
                  hashlib.sha256(raw).hexdigest())


def _topics(path: str, raw: Any) -> list[Topic]:
    if not isinstance(raw, list) or not raw:
        raise PromptError(f"{path}: `topics` must be a non-empty list")
    topics = []
    for i, t in enumerate(raw):
        keys = ("name", "long_name", "description")
        if not (isinstance(t, dict) and set(t) == set(keys)
                and all(isinstance(t[k], str) and t[k].strip() for k in keys)):
            raise PromptError(f"{path}: topic {i} needs exactly non-empty {', '.join(keys)}")
        if not _NAME.match(t["name"]):
            raise PromptError(f"{path}: topic name {t['name']!r} must be lower-case a-z, 0-9, _")
        topics.append(Topic(t["name"], t["long_name"].strip(), t["description"].strip()))
    names = [t.name for t in topics]
    if len(set(names)) != len(names):
        raise PromptError(f"{path}: duplicate topic names in {names}")
    return topics


def _examples(path: str, raw: Any, topics: set[str]) -> list[dict]:
    if not isinstance(raw, list):
        raise PromptError(f"{path}: `examples` must be a list")
    for i, ex in enumerate(raw):
        if not (isinstance(ex, dict) and set(ex) == {"review", "triplets"}
                and isinstance(ex["review"], str) and isinstance(ex["triplets"], list)):
            raise PromptError(f"{path}: example {i} needs exactly `review` (text) and "
                              f"`triplets` (a list)")
        for j, t in enumerate(ex["triplets"]):
            where = f"{path}: example {i} triplet {j}"
            if not (isinstance(t, dict) and set(t) == _TRIPLET_KEYS
                    and isinstance(t["statement"], str) and t["statement"].strip()):
                raise PromptError(f"{where} needs exactly statement, topic, sentiment")
            if t["topic"] not in topics:
                raise PromptError(f"{where}: topic {t['topic']!r} is not in {sorted(topics)}")
            if t["sentiment"] not in SENTIMENTS:
                raise PromptError(f"{where}: sentiment must be one of {SENTIMENTS}")
    return raw
