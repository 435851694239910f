"""The one registry class behind every "name -> implementation" table in rexeval.

Metrics, evaluation metric families, LLM backends, statement rankers, pair scorers and
judge tasks are each one `Registry` instance, in the module that defines their
interface. Adding an implementation is one new file with `@REGISTRY.register("name")`;
using one is `REGISTRY.lookup("name")`. Every registry behaves the same way:

- Built-in entries load lazily: `lazy` maps a name to the module that registers it (or
  to "module:attr"), and `modules` lists modules imported before a name is reported
  unknown or the names are listed. CPU machines therefore never import a GPU backend
  they do not use.
- `scan` = (package, marker) makes a new module in that package an entry with no list to
  edit: every module of the package whose source contains `marker` (the decorator's
  name, e.g. "register_metric") is imported with `modules`. Modules without the marker
  are not imported, so listing names stays cheap (no torch for a `--help`). `discover`,
  a function returning module names, finds them another way (the study jobs: every
  `pipelines/<capability>/study_job.py`); both run only when the modules are loaded.
- A name of the form "package.module:attr" loads `attr` from that module without
  registering it, so a user's own implementation plugs in from a config file (the
  module must be importable wherever it runs, Ray workers included).
- Registering a second, different object under a taken name is a ValueError naming
  both; the same definition seen again (a module reloaded) replaces the entry.
- Unknown names raise ValueError listing the known ones, built-in lazy names included.

Read access is that of a mapping (`name in R`, `R[name]`, iteration over the
registered names), so reports and tests can inspect a registry like a dict.
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def load_object(spec: str) -> Any:
    """The object "package.module:attr" names (a ValueError says what is wrong)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r} must look like package.module:Name")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"cannot import {module!r} for {spec!r}: {exc}") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ValueError(f"module {module!r} has no {attr!r} (from {spec!r})") from None


def scanned_modules(package: str, marker: str) -> tuple[str, ...]:
    """The modules of `package` (not its subpackages, none starting with "_") whose source
    mentions `marker`, sorted by name; read as text, so nothing else is imported."""
    import importlib.util
    import pkgutil

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package!r} is not a package")
    found = []
    for info in pkgutil.iter_modules(list(spec.submodule_search_locations)):
        if info.ispkg or info.name.startswith("_"):
            continue
        path = getattr(info.module_finder, "path", None)
        if path is None:
            continue
        try:
            with open(f"{path}/{info.name}.py", encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        if marker in text:
            found.append(f"{package}.{info.name}")
    return tuple(sorted(set(found)))


def declared_names(package: str, marker: str) -> dict[str, tuple[str, ...]]:
    """Name -> base class names of every entry the modules of `package` register with
    `@marker("name")` on a class or function (bases empty for a function), read from
    their source with `ast`, so nothing is imported: what `--help` lists without
    importing torch. A name given by anything but a literal is not seen here."""
    import ast
    import importlib.util

    decorator = marker.lstrip("@")
    found: dict[str, tuple[str, ...]] = {}
    for module in scanned_modules(package, marker):
        origin = importlib.util.find_spec(module).origin
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), origin)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == decorator
                        and dec.args and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
                    bases = tuple(ast.unparse(b).rpartition(".")[2] for b in getattr(node, "bases", ()))
                    found[dec.args[0].value] = bases
    return found


def summary(obj: Any) -> str:
    """What a registered entry is, on one line: its declared `description` (a string
    attribute), else the first paragraph of its own docstring (not a base class's), with
    the line breaks joined; "" when it has neither. What the docs' lists and `--help`
    print beside each name."""
    declared = getattr(obj, "description", None)
    if isinstance(declared, str) and declared.strip():
        return " ".join(declared.split())
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    if not doc or not doc.strip():
        return ""
    return " ".join(re.split(r"\n[ \t]*\n", doc.strip(), maxsplit=1)[0].split())


def _same_definition(a: Any, b: Any) -> bool:
    """Identity, or the same definition seen again (e.g. after a module reload)."""
    if a is b:
        return True
    key_a = (getattr(a, "__module__", None), getattr(a, "__qualname__", None))
    key_b = (getattr(b, "__module__", None), getattr(b, "__qualname__", None))
    return key_a == key_b and key_a[1] is not None and "<lambda>" not in key_a[1]


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


class Registry(Mapping[str, T], Generic[T]):
    """A name -> implementation table of one kind (see the module docstring).

    kind         what the entries are, for messages ("LLM backend", "metric", ...)
    base         entries must be subclasses of it (checked on register and on load)
    lazy         name -> "module" (which registers the name) or "module:attr"
    modules      modules imported before a miss is reported or names are listed
    normalize    maps a requested name to its key (e.g. str.lower)
    name_attr    attribute set on a registered class to its registered name
    scan         (package, marker): also import the package's modules that mention marker
    discover     () -> module names: also import these (found when loading, not before)
    """

    def __init__(self, kind: str, *, base: type | None = None, lazy: Mapping[str, str] | None = None,
                 modules: tuple[str, ...] = (), normalize: Callable[[str], str] | None = None,
                 name_attr: str | None = "name", scan: tuple[str, str] | None = None,
                 discover: Callable[[], Iterable[str]] | None = None):
        self.kind = kind
        self.scan = scan
        self.discover = discover
        self.base = base
        self.lazy: dict[str, str] = dict(lazy or {})
        self.modules = tuple(modules)
        self.normalize = normalize or (lambda name: name)
        self.name_attr = name_attr
        self._entries: dict[str, T] = {}
        self._loaded = False

    # -- registering ---------------------------------------------------------------

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make the decorated class or function known under `name`."""

        def wrap(obj: T) -> T:
            self.add(name, obj)
            return obj

        return wrap

    def add(self, name: str, obj: T) -> T:
        if not name:
            raise ValueError(f"a {self.kind} needs a non-empty name")
        key = self.normalize(name)
        self._check_base(obj, name)
        known = self._entries.get(key)
        if known is not None and not _same_definition(known, obj):
            raise ValueError(f"{self.kind} {name!r} is already registered by {_where(known)}")
        if self.name_attr and isinstance(obj, type):
            setattr(obj, self.name_attr, name)
        self._entries[key] = obj
        return obj

    def add_lazy(self, name: str, target: str) -> None:
        """Declare a built-in entry that a higher layer provides: `target` is the module
        that registers `name`, or "module:attr"."""
        self.lazy[self.normalize(name)] = target

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries (tests register into copies)."""
        twin = Registry(self.kind, base=self.base, lazy=self.lazy, modules=self.modules,
                        normalize=self.normalize, name_attr=self.name_attr, scan=self.scan,
                        discover=self.discover)
        twin._entries, twin._loaded = dict(self._entries), self._loaded
        return twin

    def pop(self, name: str, default: Any = None) -> Any:
        """Forget an entry (tests that register a temporary one)."""
        return self._entries.pop(self.normalize(name), default)

    # -- finding -------------------------------------------------------------------

    def lookup(self, name: str) -> T:
        """The entry for `name`: registered, built in (imported now), or "module:attr"."""
        key = self.normalize(name)
        if key in self._entries:
            return self._entries[key]
        if key in self.lazy:
            target = self.lazy[key]
            if ":" in target:
                self.add(name, load_object(target))
            else:
                importlib.import_module(target)
            if key in self._entries:
                return self._entries[key]
        if ":" in name:
            obj = load_object(name)
            self._check_base(obj, name)
            return obj
        self.load_all()
        if key in self._entries:
            return self._entries[key]
        raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or 'none'}"
                         " (or package.module:Name)")

    def load_all(self) -> None:
        """Import the modules that register the built-in entries (once)."""
        if not self._loaded:
            scanned = scanned_modules(*self.scan) if self.scan else ()
            found = tuple(self.discover()) if self.discover else ()
            for module in (*self.modules, *scanned, *found):
                importlib.import_module(module)
            self._loaded = True

    def names(self) -> list[str]:
        """Every known name, sorted: registered, and built in but not loaded yet."""
        self.load_all()
        return sorted(set(self._entries) | set(self.lazy))

    def _check_base(self, obj: Any, name: str) -> None:
        if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise ValueError(f"{name!r} is not a {self.base.__name__} subclass")

    # -- mapping view (registered entries) -------------------------------------------

    def __getitem__(self, name: str) -> T:
        return self._entries[self.normalize(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.normalize(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        self.load_all()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self.load_all()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"
