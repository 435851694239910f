"""The docs site: it builds with `mkdocs build --strict` (broken links and anchors, pages
left out of the nav fail), the README stays short and links every page, the CLI
reference is generated from the click group itself, and every command has an example."""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def _commands() -> list[tuple[list[str], click.Command]]:
    """Every command of the `rexeval` group, groups included, with its path."""
    from rexeval.ray_jobs.cli import cli

    out = []

    def walk(cmd, path):
        if getattr(cmd, "hidden", False):
            return
        out.append((path, cmd))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(cli, ["rexeval"])
    return out


def _text(page: Path) -> str:
    """The visible text of a built page's article, tags stripped, entities decoded."""
    raw = page.read_text(encoding="utf-8")
    raw = raw[raw.find("<article"):raw.find("</article>")]
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the `docs` extra: pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (the `docs` extra)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_the_site_builds_strictly_with_every_page(site):
    for page in _pages():
        rel = page.relative_to(DOCS).with_suffix("")
        built = site / (rel.parent if rel.name == "index" else rel) / "index.html"
        assert built.is_file(), f"{page.relative_to(REPO)} was not built"
    assert (site / "study_report.png").is_file()


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines (at most 200): move text into docs/"


def test_the_readme_links_every_page():
    targets = {re.sub(r"#.*$", "", t) for t in re.findall(r"\]\((docs/[^)\s]+)\)", README.read_text(encoding="utf-8"))}
    missing = [str(p.relative_to(REPO)) for p in _pages() if str(p.relative_to(REPO)) not in targets]
    assert not missing, f"README.md links no page {missing}"


def test_the_cli_reference_is_generated_from_the_click_group(site):
    text = _text(site / "reference" / "cli" / "index.html")
    sections = re.split(r"(?m)^\$ (rexeval[\w -]*?) --help$", text)
    by_path = {sections[i]: sections[i + 1] for i in range(1, len(sections), 2)}
    commands = _commands()
    assert len(commands) > 30
    for path, cmd in commands:
        name = " ".join(path)
        assert name in by_path, f"the CLI reference has no `{name} --help`"
        body = by_path[name]
        assert f"Usage: {name} " in body, name
        options = [p for p in cmd.params if isinstance(p, click.Option)] or [cmd.get_help_option(click.Context(cmd))]
        assert options[0].opts[0] in body, f"`{name}`: option {options[0].opts[0]} missing from the reference"


def test_every_command_has_an_example():
    examples = (DOCS / "commands.md").read_text(encoding="utf-8")
    leaves = [" ".join(path) for path, cmd in _commands() if not isinstance(cmd, click.Group)]
    missing = [name for name in leaves if not re.search(rf"(?m)^\s*(\S+=\S+ )*{re.escape(name)}\b(?!-)", examples)]
    assert not missing, f"docs/commands.md has no example of {missing}"


def test_placeholders_outside_code_stay_visible():
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import placeholders
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    assert placeholders.escape_line("a <baseline> b `<kept>` <br> c") == "a &lt;baseline&gt; b `<kept>` <br> c"
    md = "x <bos>\n```\n<raw>\n```\n"
    assert placeholders.on_page_markdown(md, None, None, None) == "x &lt;bos&gt;\n```\n<raw>\n```\n"
