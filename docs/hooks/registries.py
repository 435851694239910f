"""mkdocs hook: the pages' lists that the code already holds, generated at build time.

- `<!-- rexeval-outputs -->` (docs/outputs.md): every job's output folder, from its
  `Outputs` declaration (`pipelines/core/outputs.py`): each file or folder, what it holds,
  and the columns a reader may rely on. The declaration is what the job writes and what
  the study plan and report read, so the page cannot drift from them.
- `<!-- rexeval-study-jobs -->` (docs/studies.md): every study job with its one-line
  description, from the registry (`STUDY_JOBS`), so a job added in a module of its own
  appears by itself.

The same walk as `rexeval study jobs`; an empty registry fails the build.
"""
from __future__ import annotations

import warnings

OUTPUTS_MARKER = "<!-- rexeval-outputs -->"
JOBS_MARKER = "<!-- rexeval-study-jobs -->"


def _jobs():
    from rexeval.pipelines.core.study_jobs import STUDY_JOBS

    names = STUDY_JOBS.names()  # imports every job's module, built-in or of its own
    if not names:
        raise RuntimeError("no study job is registered")
    return [STUDY_JOBS[n] for n in names]


def _cell(text: str) -> str:
    return text.replace("|", "&#124;").replace("\n", " ")


def _columns(out) -> tuple[str, ...]:
    """The declared columns; for a table folder named after one of the schemas
    (`reviews/`, `statements/`, `errors/`, ...) its schema's columns."""
    from rexeval.pipelines.core.schema import TABLES

    if out.columns:
        return out.columns
    stem = out.name.removesuffix(".parquet")
    return tuple(TABLES[stem].names) if stem in TABLES and (out.folder or out.name.endswith(".parquet")) else ()


def outputs_page() -> str:
    lines = []
    for job in _jobs():
        lines += [f"## {job.name}", "", _cell(job.description) + ".", ""]
        if not job.outputs:
            lines += ["It declares no files.", ""]
            continue
        lines += ["| path | holds | columns |", "|---|---|---|"]
        for out in job.outputs.values():
            path = f"`{out}/`" if out.folder else f"`{out}`"
            cols = ", ".join(f"`{c}`" for c in _columns(out)) or "—"
            lines.append(f"| {path} | {_cell(out.what) or '—'} | {cols} |")
        lines.append("")
    return "\n".join(lines)


def study_jobs_list() -> str:
    return "\n".join(f"- `{job.name}`: {job.description}" for job in _jobs())


def on_page_markdown(markdown, page, config, files):
    if OUTPUTS_MARKER not in markdown and JOBS_MARKER not in markdown:
        return markdown
    with warnings.catch_warnings():  # the libraries' deprecation notices on import are not ours to show
        warnings.simplefilter("ignore")
        if OUTPUTS_MARKER in markdown:
            markdown = markdown.replace(OUTPUTS_MARKER, outputs_page())
        if JOBS_MARKER in markdown:
            markdown = markdown.replace(JOBS_MARKER, study_jobs_list())
    return markdown
