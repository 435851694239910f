"""docs/seeds.md, the map of the five seeds' tables and figures, cannot go stale: it has a
row for every table and figure each paper names, and a row that says a step produces
something names a step of that seed's study whose job declares the file it names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEEDS_MD = REPO / "docs" / "seeds.md"
PAPERS = REPO.parent / "shared" / "seeds"

_ROMAN = ["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII", "XIII", "XIV"]


def _items(seed: str, tables: int, figures: int, roman: bool = False) -> set[str]:
    names = _ROMAN if roman else [str(i) for i in range(1, 15)]
    return ({f"{seed} Table {names[i]}" for i in range(tables)}
            | {f"{seed} Fig. {i}" for i in range(1, figures + 1)})


# Counted by hand in the papers (../shared/seeds/): 16 + 6 + 11 + 8 + 13 = 54.
EXPECTED = (_items("000", 14, 2, roman=True) | _items("001", 2, 4) | _items("002", 8, 3)
            | _items("003", 4, 4) | _items("004", 6, 7))

_ITEM = re.compile(r"^(\d{3}) (Table|Fig\.) ([0-9IVX]+)$")
_PRODUCER = re.compile(r"^`seed(\d{3})` step `([a-z0-9_]+)`$")
_OUTPUT = re.compile(r"^`([a-z0-9_]+)/([^`]+)`$")
_DEMO = re.compile(r"^demo \(`([a-z0-9_]+)`\)$")


def _rows() -> list[dict]:
    rows = []
    for line in SEEDS_MD.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 5 and _ITEM.match(cells[0]):
            rows.append(dict(zip(("item", "what", "by", "output", "status"), cells)))
    return rows


def test_every_table_and_figure_of_the_papers_has_one_row():
    assert len(EXPECTED) == 54
    items = [r["item"] for r in _rows()]
    assert sorted(set(items) - EXPECTED) == [], "rows for items the papers do not name"
    assert sorted(EXPECTED - set(items)) == [], "tables or figures without a row"
    assert len(items) == len(set(items)), "an item has two rows"


@pytest.mark.skipif(not PAPERS.is_dir(), reason="the papers are read from ../shared/seeds")
def test_the_expected_items_are_the_ones_the_papers_name():
    """The hand count above against the papers' own text: every "Table N" / "Fig. N" they
    mention (captions and references alike), whatever the case or spelling."""
    named = set()
    for paper in PAPERS.glob("*.txt"):
        seed = paper.name[:3]
        for kind, num in re.findall(r"\b(TABLE|Table|FIGURE|Figure|Fig\.)\s+([0-9]+|[IVX]+)\b", paper.read_text()):
            named.add(f"{seed} {'Table' if kind.lower() == 'table' else 'Fig.'} {num}")
    assert named == EXPECTED


def test_a_produced_row_names_a_file_its_step_declares():
    from rexeval.pipelines.core.study_registry import STUDY_JOBS
    from rexeval.pipelines.study.config import load_study

    STUDY_JOBS.names()  # loads every study_job module, as a study plan does
    studies: dict[str, object] = {}

    def study(name: str):
        if name not in studies:
            studies[name] = load_study(REPO / "studies" / f"{name}.yaml")
        return studies[name]

    problems = []
    for row in _rows():
        item, seed = row["item"], row["item"][:3]
        status = row["status"]
        if status.startswith("n/a:"):
            if row["by"] != "—" or row["output"] != "—" or len(status) < len("n/a: ") + 8:
                problems.append(f"{item}: not produced, so no step or file, and a reason")
            continue
        demo = _DEMO.match(status)
        if status != "real models" and not demo:
            problems.append(f"{item}: status {status!r} is none of 'demo (`step`)', 'real models', 'n/a: reason'")
            continue
        jobs = {}
        for part in row["by"].split("; "):
            m = _PRODUCER.match(part)
            if not m or m[1] != seed:
                problems.append(f"{item}: {part!r} is not a step of studies/seed{seed}.yaml")
                continue
            spec = study(f"seed{seed}").steps.get(m[2])
            if spec is None:
                problems.append(f"{item}: studies/seed{seed}.yaml has no step {m[2]!r}")
                continue
            jobs[m[2]] = spec.job
        for part in row["output"].split("; "):
            m = _OUTPUT.match(part)
            if not m or m[1] not in jobs:
                problems.append(f"{item}: output {part!r} is not `step/file` of a step the row names")
                continue
            declared = STUDY_JOBS[jobs[m[1]]].outputs.values()
            if not any(out.matches(m[2]) for out in declared):
                problems.append(f"{item}: the {jobs[m[1]]} job of step {m[1]!r} declares no {m[2]!r} "
                                f"(it writes {sorted(map(str, declared))})")
        if demo:
            spec = study("demo").steps.get(demo[1])
            if spec is None or spec.job not in jobs.values():
                problems.append(f"{item}: studies/demo.yaml has no step {demo[1]!r} running {sorted(jobs.values())}")
    assert problems == []


def test_the_map_names_the_papers_and_is_in_the_site():
    text = SEEDS_MD.read_text()
    for seed in ("000", "001", "002", "003", "004"):
        assert f"studies/seed{seed}.yaml" in text
    assert "seeds.md" in (REPO / "mkdocs.yml").read_text()
