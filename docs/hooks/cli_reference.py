"""mkdocs hook: the CLI reference (docs/reference/cli.md), generated at build time.

The page holds a marker; this hook replaces it with every command of the `rexeval` click
group (`rexeval.ray_jobs.cli:cli`, walked recursively): a heading per command, then
exactly what `rexeval ... --help` prints, run through click's CliRunner. The reference
therefore comes from the commands' own click definitions and cannot drift from them; a
command whose `--help` fails fails the build.

Why not the mkdocs-click extension (tried, 0.9.0): its table style prints
`Sentinel.UNSET` as the default of every option under click >= 8.3 and breaks a table
row at a type named `path|uri` (our `--config`); its plain style renders the options as
`--help` does but passes each command's description through Markdown, which swallows
`<placeholders>` and joins the example lines. A code block of the real `--help` has
neither problem.
"""
from __future__ import annotations

import re
import warnings

MARKER = "<!-- rexeval-cli-reference -->"
PROG = "rexeval"
WIDTH = 88
"""The terminal width the help is formatted for (fixed: the page must not depend on the
terminal of whoever builds it)."""


def commands():
    """[(path, command)] of the click group, depth first, subcommands in name order."""
    import click

    from rexeval.ray_jobs.cli import cli

    out = []

    def walk(cmd, path):
        if getattr(cmd, "hidden", False):
            return
        out.append((path, cmd))
        if isinstance(cmd, click.Group):
            for name in sorted(cmd.commands):
                walk(cmd.commands[name], [*path, name])

    walk(cli, [PROG])
    return out


def help_text(path: list[str]) -> str:
    """What `rexeval <path> --help` prints."""
    from click.testing import CliRunner

    from rexeval.ray_jobs.cli import cli

    result = CliRunner().invoke(cli, [*path[1:], "--help"], prog_name=PROG, terminal_width=WIDTH,
                                max_content_width=WIDTH)
    if result.exit_code != 0:
        raise RuntimeError(f"`{' '.join(path)} --help` exited {result.exit_code}: {result.output}"
                           f"{result.exception!r}")
    return result.output.rstrip()


def anchor(path: list[str]) -> str:
    return re.sub(r"[^a-z0-9]+", "-", " ".join(path).lower()).strip("-")


def render() -> str:
    cmds = commands()
    lines = ["## Commands", ""]
    for path, cmd in cmds[1:]:
        indent = "    " * (len(path) - 2)
        summary = (cmd.get_short_help_str(limit=100) or "").replace("|", "&#124;")
        lines.append(f"{indent}- [`{' '.join(path)}`](#{anchor(path)}): {summary}")
    lines.append("")
    for path, _ in cmds:
        text = help_text(path)
        if "```" in text:
            raise RuntimeError(f"`{' '.join(path)} --help` holds a code fence")
        level = "#" * min(len(path) + 1, 4)
        label = path[-1] if len(path) > 1 else PROG
        lines += [f"{level} {' '.join(path)} {{ #{anchor(path)} data-toc-label=\"{label}\" }}", "",
                  "```text", f"$ {' '.join(path)} --help", text, "```", ""]
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    with warnings.catch_warnings():  # the libraries' deprecation notices on import are not ours to show
        warnings.simplefilter("ignore")
        return markdown.replace(MARKER, render())
