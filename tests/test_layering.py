"""The house rules, checked on the source: imports run downhill only, and no circles.

Layers, top to bottom: ray_jobs -> pipelines -> serve -> metrics -> models -> prompts,
with the namespace's own modules (`rexeval/registry.py`) below them all. Inside
`pipelines/`, `core/` sits below every capability package, and the capability packages
import each other without a circle. Every import counts, including those inside
functions (a lazy import is still a dependency). The checker reads the code with `ast`
only; the tests at the bottom plant an uphill import, a circle and a core import in a
small tree and see the checker catch each.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from rexeval import LAYERS  # top first

REPO = Path(__file__).resolve().parents[1]
RANK = {name: len(LAYERS) - i for i, name in enumerate(LAYERS)}  # prompts 1 ... ray_jobs 6
ROOT_RANK = 0  # rexeval/*.py: the namespace's own modules


def module_files(root: Path) -> dict[str, Path]:
    """rexeval.<dotted module> -> file, for the six layers and rexeval/ itself."""
    out = {}
    for top in (*LAYERS, "rexeval"):
        base = root / top
        if not base.is_dir():
            continue
        for f in sorted(base.rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[0] != "rexeval":
                parts = ["rexeval", *parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that `name` (a module or module.attribute) names."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_edges(root: Path) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import between rexeval modules."""
    modules = module_files(root)
    edges = []
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] or [base]
            for t in targets:
                if not t.startswith("rexeval"):
                    continue
                hit = _resolve(t, modules)
                if hit and hit != mod:
                    edges.append((mod, hit, node.lineno))
    return edges


def layer(mod: str) -> tuple[int, str]:
    """(rank, name) of a module's layer."""
    parts = mod.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return (RANK[top], top) if top in RANK else (ROOT_RANK, "rexeval")


def capability(mod: str) -> str | None:
    """The pipelines package a module belongs to (None outside pipelines/ or at its top)."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "pipelines" else None


def uphill(edges) -> list[str]:
    bad = []
    for a, b, line in edges:
        (ra, la), (rb, lb) = layer(a), layer(b)
        if rb > ra:
            bad.append(f"{a}:{line} imports {b}: {la} may not import {lb} (a higher layer)")
        elif capability(a) == "core" and capability(b) not in (None, "core"):
            bad.append(f"{a}:{line} imports {b}: pipelines/core sits below the capability packages")
    return bad


def cycles(pairs) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    graph = defaultdict(set)
    for a, b in pairs:
        if a != b:
            graph[a].add(b)
            graph.setdefault(b, set())
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def problems(root: Path) -> list[str]:
    edges = import_edges(root)
    found = uphill(edges)
    found += [f"circle between modules: {' <-> '.join(c)}" for c in cycles((a, b) for a, b, _ in edges)]
    caps = [(capability(a), capability(b)) for a, b, _ in edges if capability(a) and capability(b)]
    found += [f"circle between pipelines packages: {' <-> '.join(c)}" for c in cycles(caps)]
    return found


# ------------------------------------------------------------------ the real house


def test_the_product_imports_only_downhill_and_without_circles():
    assert len(module_files(REPO)) > 100  # the checker sees the product
    assert problems(REPO) == []


def test_every_pipelines_package_says_what_it_does():
    """Each capability package has a short __init__ docstring (a reader's first stop)."""
    for init in sorted((REPO / "pipelines").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init} needs a docstring saying what the package does"


# ------------------------------------------------------------------ the checker itself


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


BASE = {
    "rexeval/__init__.py": "",
    "rexeval/registry.py": "",
    "prompts/__init__.py": "",
    "models/__init__.py": "from rexeval.prompts import x\n",
    "metrics/__init__.py": "import rexeval.models\n",
    "serve/__init__.py": "",
    "pipelines/__init__.py": "",
    "pipelines/core/__init__.py": "",
    "pipelines/core/io.py": "from rexeval.registry import Registry\n",
    "pipelines/star/__init__.py": "",
    "pipelines/star/build.py": "from rexeval.pipelines.core import io\nfrom rexeval.metrics import m\n",
    "pipelines/paraphrase/__init__.py": "",
    "pipelines/paraphrase/graph.py": "from rexeval.pipelines.star.build import f\n",
    "ray_jobs/__init__.py": "",
    "ray_jobs/cli.py": "from rexeval.pipelines.star import build\n",
}


def test_a_clean_tree_passes(tmp_path):
    assert problems(_tree(tmp_path, BASE)) == []


@pytest.mark.parametrize("rel,text,expected", [
    ("metrics/summac.py", "def f():\n    from rexeval.pipelines.paraphrase.graph import g\n",
     "metrics may not import pipelines"),
    ("models/llm.py", "import rexeval.serve\n", "models may not import serve"),
    ("prompts/loader.py", "from rexeval.models import refs\n", "prompts may not import models"),
    ("rexeval/registry.py", "from rexeval.metrics import x\n", "rexeval may not import metrics"),
    ("pipelines/core/io.py", "from rexeval.pipelines.star import build\n", "pipelines/core sits below"),
])
def test_a_planted_uphill_import_is_caught(tmp_path, rel, text, expected):
    found = problems(_tree(tmp_path, {**BASE, rel: text}))
    assert any(expected in p for p in found), found


def test_a_planted_circle_is_caught(tmp_path):
    files = {**BASE, "pipelines/star/report.py": "from rexeval.pipelines.star.build import x\n",
             "pipelines/star/build.py": "from rexeval.pipelines.star.report import y\n"}
    found = problems(_tree(tmp_path, files))
    assert any("circle between modules" in p and "star.report" in p for p in found), found


def test_a_circle_between_capability_packages_is_caught(tmp_path):
    files = {**BASE, "pipelines/star/data.py": "def f():\n    from rexeval.pipelines.paraphrase import graph\n"}
    found = problems(_tree(tmp_path, files))
    assert any("circle between pipelines packages: paraphrase <-> star" in p for p in found), found
