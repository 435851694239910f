"""mkdocs hook: keep `<placeholders>` written outside code spans visible.

The pages come from text written for GitHub and for terminals, where `<baseline>` or
`<bos>` (in the generated presets tables of docs/methods/generators.md) read as
placeholders; Markdown would pass them on as unknown HTML tags, which a browser hides.
This hook escapes `<name>` outside code spans and fenced blocks unless `name` is an HTML
tag, so the text shows as written.
"""
from __future__ import annotations

import re

HTML_TAGS = {"a", "abbr", "b", "br", "code", "details", "div", "em", "i", "img", "kbd", "li", "ol",
             "p", "pre", "small", "span", "strong", "sub", "summary", "sup", "table", "td", "th",
             "tr", "u", "ul"}
PLACEHOLDER = re.compile(r"<(/?)([A-Za-z_][\w.-]*)>")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _escape(segment: str) -> str:
    def sub(m: re.Match) -> str:
        return m.group(0) if m.group(2).lower() in HTML_TAGS else f"&lt;{m.group(1)}{m.group(2)}&gt;"

    return PLACEHOLDER.sub(sub, segment)


def escape_line(line: str) -> str:
    out, pos = [], 0
    for m in CODE_SPAN.finditer(line):
        out += [_escape(line[pos:m.start()]), m.group(0)]
        pos = m.end()
    out.append(_escape(line[pos:]))
    return "".join(out)


def on_page_markdown(markdown, page, config, files):
    lines, fence = [], None
    for line in markdown.split("\n"):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is None:
            line = escape_line(line)
        lines.append(line)
    return "\n".join(lines)
