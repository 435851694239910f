"""`rexeval study report DIR`: a study's results as one HTML page, Markdown and CSV
(the command object `study_report_cmd`; `rexeval study` attaches it)."""
from __future__ import annotations

import click

from rexeval.ray_jobs.common import Where, user_errors


@click.command("report")
@click.argument("directory", metavar="DIR", type=Where(exists=True, file_okay=False))
@click.option("--out", "-o", type=Where(file_okay=False),
              help="Folder (or URI) for the report (default DIR/report).")
@user_errors
def study_report_cmd(directory, out):
    """Summarise a study's results: one self-contained HTML file, Markdown and CSV.

    DIR is the output folder of `rexeval study run` (it holds study.json), a local
    folder or a URI (s3://bucket/studies/x); OUT may be either too. Every
    complete step's output folder is read as its command wrote it, and its tables are
    laid out by the same builders the commands use, in the seeds' layouts: seed 000
    Table II and Tables III-VI (with each mean's bootstrap interval), seed 002 Tables
    1, 2, 3 and 6, seed 004 Tables 1 and 4 and Figure 5, seed 001 Table 1 / seed 004
    Table 2, the Likert and pairwise judges' summaries, and a generic section (counts,
    tables, figures) for any other job. Under every table and figure: the step
    instance, job, models, prompt versions, sampling, settings hash and finish time
    it came from. A "Steps" table lists every instance with its status and time, and
    "Skipped and why" every step that failed, was skipped or has not run, and every
    metric family or factor a job itself left out, with the reason. A missing or
    unreadable file is a note in its section.

    Writes OUT/index.html (CSS inline, figures as data URIs: opens offline, nothing is
    fetched, no script), OUT/report.md with OUT/figures/, and OUT/tables/<table>.csv
    for every table.

    Example:

      rexeval study report runs/study-local

      rexeval study report runs/study-paper --out /tmp/paper-report

      rexeval study report s3://bucket/studies/paper
    """
    from rexeval.storage import location
    from rexeval.pipelines.study.report import build_report, write_report

    report = build_report(directory)
    paths = write_report(report, out if out else location(directory) / "report")
    notes = len(report.notes) + sum(len(s.notes) for s in report.sections)
    click.echo(f"study {report.name}: {len(report.instances)} step instance(s), {len(report.sections)} "
               f"section(s), {len(report.tables())} table(s), {len(report.figures())} figure(s), "
               f"{len(report.skipped)} skipped item(s), {notes} note(s)")
    for k in ("html", "md", "tables"):
        click.echo(f"  {k:<7} {paths[k]}")
    return paths
