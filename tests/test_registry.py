"""The one registry class (rexeval/registry.py): lazy built-ins, "module:attr" plug-ins,
collisions, unknown names, base-class checks, and the mapping view."""
from __future__ import annotations

import sys

import pytest

from rexeval.registry import Registry, load_object


class Base:
    pass


class One(Base):
    pass


class Two(Base):
    pass


def plain_function():
    return "plain"


LAZY: Registry[type] = Registry("thing", lazy={"lazy-one": "rexeval_test_plugin"})


def test_register_sets_the_name_and_lookup_finds_it():
    reg: Registry[type] = Registry("thing", base=Base)
    reg.register("one")(One)
    assert reg.lookup("one") is One and One.name == "one"
    assert "one" in reg and reg["one"] is One and list(reg) == ["one"] and len(reg) == 1


def test_a_second_definition_under_a_taken_name_is_refused():
    reg: Registry[type] = Registry("thing", base=Base)
    reg.register("x")(One)
    reg.register("x")(One)  # the same class again is fine (a module reloaded)
    with pytest.raises(ValueError, match=r"thing 'x' is already registered by .*One"):
        reg.register("x")(Two)
    assert reg.lookup("x") is One


def test_unknown_names_list_the_known_ones_including_lazy_built_ins():
    reg: Registry[type] = Registry("thing", lazy={"later": "rexeval_no_such_module"})
    reg.add("one", One)
    with pytest.raises(ValueError, match=r"unknown thing 'nope'; known: later, one"):
        reg.lookup("nope")


def test_lazy_built_ins_import_their_module_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "rexeval_test_plugin.py").write_text(
        "from tests.test_registry import LAZY, One\nLAZY.add('lazy-one', One)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rexeval_test_plugin", raising=False)
    assert "lazy-one" not in LAZY and "lazy-one" in LAZY.names()  # known, not loaded yet
    assert LAZY.lookup("lazy-one") is One
    assert "rexeval_test_plugin" in sys.modules and "lazy-one" in LAZY
    LAZY.pop("lazy-one")


def test_lazy_module_colon_attr_and_add_lazy():
    reg: Registry = Registry("function", name_attr=None)
    reg.add_lazy("plain", f"{__name__}:plain_function")
    assert reg.lookup("plain") is plain_function
    assert reg.names() == ["plain"]


def test_module_colon_attr_loads_a_plug_in_without_registering_it():
    reg: Registry[type] = Registry("thing", base=Base)
    assert reg.lookup(f"{__name__}:Two") is Two
    assert "tests.test_registry:Two" not in reg and list(reg) == []
    with pytest.raises(ValueError, match="is not a Base subclass"):
        reg.lookup(f"{__name__}:plain_function")
    with pytest.raises(ValueError, match="has no 'Missing'"):
        reg.lookup(f"{__name__}:Missing")
    with pytest.raises(ValueError, match="cannot import"):
        reg.lookup("rexeval_no_such_module:Thing")


def test_base_class_is_checked_on_register():
    reg: Registry[type] = Registry("thing", base=Base)
    with pytest.raises(ValueError, match="is not a Base subclass"):
        reg.register("f")(plain_function)


def test_normalised_names_and_modules_loaded_before_a_miss():
    reg: Registry[type] = Registry("ranker", normalize=str.lower, modules=(__name__,))
    reg.register("BPER+")(One)
    assert reg.lookup("bper+") is One and reg.lookup("BpEr+") is One and One.name == "BPER+"
    assert "BPER+" in reg and reg["bper+"] is One


def test_copy_and_pop_isolate_temporary_entries():
    reg: Registry[type] = Registry("thing")
    reg.add("one", One)
    twin = reg.copy()
    twin.add("two", Two)
    assert "two" in twin and "two" not in reg
    assert twin.pop("two") is Two and "two" not in twin
    assert reg.get("missing") is None


def test_load_object_says_what_is_wrong():
    assert load_object(f"{__name__}:One") is One
    with pytest.raises(ValueError, match="must look like package.module:Name"):
        load_object("no_colon_here")


def test_every_registry_of_the_product_is_one_registry_instance():
    """The six tables behind names: metrics, metric families, LLM backends, rankers,
    pair scorers and judge tasks."""
    from rexeval.metrics.registry import METRICS
    from rexeval.models.encoders.pair_scorer import PAIR_SCORERS
    from rexeval.models.llm.base import BACKENDS
    from rexeval.models.recommenders.base import RANKERS
    from rexeval.pipelines.evaluate.families import FAMILIES
    from rexeval.pipelines.judge.tasks import TASKS

    for reg in (METRICS, FAMILIES, BACKENDS, RANKERS, PAIR_SCORERS, TASKS):
        assert isinstance(reg, Registry)
    assert {"hf", "openai", "vllm"} <= set(BACKENDS.names())
    assert {"random", "userpop", "itempop", "globalpop", "bper+", "expgcn"} <= set(RANKERS.names())
    assert {"likert", "pairwise", "detect_generate"} <= set(TASKS)


def test_scan_imports_the_packages_modules_that_use_the_marker_and_no_other(tmp_path, monkeypatch):
    pkg = tmp_path / "rexeval_scan_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("from rexeval.registry import Registry\n"
                                 "THINGS = Registry('thing', scan=('rexeval_scan_pkg', '@register_thing'))\n"
                                 "register_thing = THINGS.register\n")
    (pkg / "new_one.py").write_text("from rexeval_scan_pkg.base import register_thing\n\n"
                                    "@register_thing('new')\nclass New:\n    pass\n")
    (pkg / "heavy.py").write_text("raise RuntimeError('imported although it registers nothing')\n")
    (pkg / "_private.py").write_text("# @register_thing, but private\nraise RuntimeError('private')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("rexeval_scan_pkg")]:
        monkeypatch.delitem(sys.modules, name)
    from rexeval.registry import scanned_modules

    # base.py names the marker itself (harmless: it is the registry's own module)
    assert scanned_modules("rexeval_scan_pkg", "@register_thing") == ("rexeval_scan_pkg.base",
                                                                      "rexeval_scan_pkg.new_one")
    base = __import__("rexeval_scan_pkg.base", fromlist=["THINGS"])
    assert base.THINGS.names() == ["new"]  # no list names new_one.py; heavy.py stays unimported
    assert "rexeval_scan_pkg.heavy" not in sys.modules
    for name in [m for m in sys.modules if m.startswith("rexeval_scan_pkg")]:
        monkeypatch.delitem(sys.modules, name)


def test_summary_is_the_declared_description_or_the_docstrings_first_paragraph():
    """What the docs' generated lists and --help print beside a name."""
    from rexeval.registry import summary

    class Base:
        """A base's docstring, which a subclass does not inherit here."""

    class Documented(Base):
        """Scores a thing
        in two lines.

        Details that stay out of the one-liner."""

    class Declared(Base):
        """Not this."""

        description = "  the declared\n description "

    class Bare(Base):
        pass

    def fn():
        """A function's line."""

    assert summary(Documented) == "Scores a thing in two lines."
    assert summary(Declared) == "the declared description"
    assert summary(Bare) == ""
    assert summary(fn) == "A function's line."


def test_declared_attributes_reads_literals_along_the_bases_and_imports_the_rest(tmp_path, monkeypatch):
    """Class attributes read from the source: a literal on the class, or inherited through
    single bases imported by name (relatively, under another name); a value the source
    does not settle (not a literal, several bases, a base bound under a try) comes from
    importing the class."""
    pkg = tmp_path / "rexeval_attr_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("from rexeval.registry import Registry\n"
                                 "THINGS = Registry('thing', scan=('rexeval_attr_pkg', '@register_thing'))\n"
                                 "register_thing = THINGS.register\n\n"
                                 "class Root:\n    DEFAULTS = {'a': 1}\n    KEYS: tuple = ()\n")
    (pkg / "mid.py").write_text("from rexeval_attr_pkg.base import Root\n\n"
                                "class Mid(Root):\n    KEYS = ('k',)\n")
    (pkg / "one.py").write_text("from rexeval_attr_pkg.base import register_thing\n"
                                "from .mid import Mid as Parent\n\n"
                                "@register_thing('one')\nclass One(Parent):\n    pass\n")
    (pkg / "two.py").write_text("from rexeval_attr_pkg.base import Root, register_thing\n"
                                "from rexeval_attr_pkg.mid import Mid\n\n"
                                "@register_thing('two')\nclass Two(Root):\n"
                                "    DEFAULTS = {**Root.DEFAULTS, 'b': 2}\n\n"
                                "@register_thing('three')\nclass Three(Mid, Root):\n    pass\n")
    (pkg / "four.py").write_text("from rexeval_attr_pkg.base import register_thing\n"
                                 "try:\n    from rexeval_attr_pkg.mid import Mid\n"
                                 "except ImportError:\n    Mid = object\n\n"
                                 "@register_thing('four')\nclass Four(Mid):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("rexeval_attr_pkg")]:
        monkeypatch.delitem(sys.modules, name)
    from rexeval.registry import declared_attributes

    got = declared_attributes("rexeval_attr_pkg", "@register_thing", ("DEFAULTS", "KEYS"))
    assert got == {"one": {"DEFAULTS": {"a": 1}, "KEYS": ("k",)},
                   "two": {"DEFAULTS": {"a": 1, "b": 2}, "KEYS": ()},
                   "three": {"DEFAULTS": {"a": 1}, "KEYS": ("k",)},
                   "four": {"DEFAULTS": {"a": 1}, "KEYS": ("k",)}}
    assert "rexeval_attr_pkg.one" not in sys.modules  # settled by its source alone
    assert "rexeval_attr_pkg.two" in sys.modules  # Two's DEFAULTS and Three's needed the classes
    assert "rexeval_attr_pkg.four" in sys.modules  # which Mid Four derives from: only running it tells
    for name in [m for m in sys.modules if m.startswith("rexeval_attr_pkg")]:
        monkeypatch.delitem(sys.modules, name)
