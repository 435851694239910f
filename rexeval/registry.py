"""The one registry class behind every "name -> implementation" table in rexeval.

Metrics, evaluation metric families, LLM backends, statement rankers, pair scorers, judge
tasks and the pairwise judges' evaluators are each one `Registry` instance, in the module that defines their
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
  Without loading them, `declared_names` reads a scanned package's registered names
  from the source, and `declared_attributes` its classes' literal class attributes
  (what `--help` and a `--dry-run`'s settings checks need, without torch).
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


def _parsed(module: str, trees: dict[str, Any] | None = None):
    """The `ast` of `module`'s source (None where it has no source file), found without
    importing it: `importlib.util.find_spec` imports its parent packages only. `trees`
    keeps the modules parsed already."""
    import ast
    import importlib.util

    if trees is not None and module in trees:
        return trees[module]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    tree = None
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), spec.origin)
    if trees is not None:
        trees[module] = tree
    return tree


def _declarations(package: str, marker: str, trees: dict[str, Any] | None = None):
    """(registered name, module, node) of every class or function that the modules of
    `package` decorate with `@marker("name")`, a literal name."""
    import ast

    decorator = marker.lstrip("@")
    for module in scanned_modules(package, marker):
        for node in ast.walk(_parsed(module, trees)):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == decorator
                        and dec.args and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
                    yield dec.args[0].value, module, node


def declared_names(package: str, marker: str) -> dict[str, tuple[str, ...]]:
    """Name -> base class names of every entry the modules of `package` register with
    `@marker("name")` on a class or function (bases empty for a function), read from
    their source with `ast`, so nothing is imported: what `--help` lists without
    importing torch. A name given by anything but a literal is not seen here."""
    import ast

    return {name: tuple(ast.unparse(b).rpartition(".")[2] for b in getattr(node, "bases", ()))
            for name, _, node in _declarations(package, marker)}


def declared_attributes(package: str, marker: str, attrs: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Name -> {attr: value} of every class `declared_names` sees, for the class
    attributes `attrs`: what a settings check needs (e.g. a generator's DEFAULTS) without
    importing the class's module and the torch it imports.

    A value is read from the source when the class body assigns it a literal, or when the
    class inherits it along a chain of single bases, each a class of the same module or
    one imported by name (`from M import Base`) from a module of the same top-level
    package, followed into that module's source. Where the source does not settle a value
    (not a literal; an attribute no class of the chain assigns; a base with several bases,
    or from elsewhere, such as torch's `nn.Module`), the class is imported and the value
    read from it, so the answer is the class's own either way. What the source cannot
    show (a value changed after the class statement) is for the callers' tests to rule
    out: `tests/ray_jobs/test_cli_imports.py` compares the generators' with their classes'."""
    import ast
    import importlib

    root = package.partition(".")[0]
    trees: dict[str, Any] = {}
    found: dict[str, dict[str, Any]] = {}
    for name, module, node in _declarations(package, marker, trees):
        if not isinstance(node, ast.ClassDef):
            continue
        values: dict[str, Any] = {}
        for attr in attrs:
            value = _read_attribute(module, node, attr, root, trees)
            if value is _UNSETTLED:
                value = getattr(getattr(importlib.import_module(module), node.name), attr)
            values[attr] = value
        found[name] = values
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


_UNSETTLED = object()
"""What `_read_attribute` answers where the source does not settle a value."""


def _read_attribute(module: str, node, attr: str, root: str, trees: dict[str, Any], depth: int = 0) -> Any:
    """The literal that the body of class `node` (of `module`) assigns to `attr` last, or
    that its chain of single bases does; _UNSETTLED where the source does not say."""
    import ast

    last = None
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
            last = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == attr:
            last = stmt.value if stmt.value is not None else last
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                isinstance(n, ast.Name) and n.id == attr and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt)):
            return _UNSETTLED  # assigned under an if, a loop, ...: only running it tells
    if last is not None:
        try:
            return ast.literal_eval(last)
        except (ValueError, TypeError, SyntaxError):
            return _UNSETTLED
    if len(node.bases) != 1 or depth > 20:
        return _UNSETTLED
    base = _base_class(module, node.bases[0], root, trees)
    return _UNSETTLED if base is None else _read_attribute(*base, attr, root, trees, depth + 1)


def _base_class(module: str, base, root: str, trees: dict[str, Any], depth: int = 0):
    """(module, ClassDef) of a base written as a plain name that `module` binds once at
    its top level, by a class statement or by `from M import Name` from a module under
    `root` (followed on into M); else None (bound otherwise, or more than once)."""
    import ast

    tree = _parsed(module, trees)
    if not isinstance(base, ast.Name) or tree is None or depth > 20:
        return None
    found = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if stmt.name == base.id:
                found.append((module, stmt) if isinstance(stmt, ast.ClassDef) else None)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == base.id:
                    found.append((stmt, alias))
        elif any(isinstance(n, ast.Name) and n.id == base.id and isinstance(n.ctx, ast.Store)
                 or isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == base.id
                 or isinstance(n, (ast.Import, ast.ImportFrom))
                 and any((a.asname or a.name.partition(".")[0]) == base.id for a in n.names)
                 for n in ast.walk(stmt)):
            found.append(None)  # assigned, imported under an if or a try, ...
    if len(found) != 1 or found[0] is None:
        return None
    if isinstance(found[0][0], str):
        return found[0]
    stmt, alias = found[0]
    source = stmt.module or ""
    if stmt.level:  # relative to the importing module's package
        anchor = module.rsplit(".", stmt.level)[0]
        source = f"{anchor}.{source}" if source else anchor
    if source.partition(".")[0] != root:
        return None
    return _base_class(source, ast.Name(alias.name), root, trees, depth + 1)


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
