"""`rexeval study report DIR`: one self-contained HTML page (plus Markdown and CSV)
summarising a study's results, in the seeds' layouts.

Built in three plain functions:

1. `build_report(DIR)` reads `DIR/study.json` (the study runner's state: every step
   instance with its job, output folder, status, settings and timing) and each complete
   instance's output folder, exactly as the existing command wrote it, into a `Report`:
   sections of tables and figures, each with its provenance.
2. `render_html(report)` / `render_markdown(report)` lay the model out.
3. `write_report(report, OUT)` writes OUT/index.html (one file: CSS inline, figures as
   base64 data URIs, no script, nothing fetched), OUT/report.md (figures beside it under
   OUT/figures/) and OUT/tables/<table>.csv for every table.

DIR and OUT may be URIs (`s3://bucket/studies/x`): every file is read and written
through the storage module, so a study run on a cluster is reported from its bucket.

No number is computed here. Tables come from the jobs' own table builders
(`ingest.stats.format_table`, `evaluate.report`'s tables.md, `cluster.quality.format_table3`,
`star.build.format_table6`, `star.report.table1`/`format_table1`, `judge.winrate`'s
table4.md and winrate.md, `meta_evaluate.report`'s meta_evaluation.md, the judges'
likert.md / pairwise.md / detection.md, ...), read back from the Markdown they write
(pipe tables) or rebuilt with the same builder from the JSON the job wrote. The only
addition is the bootstrap interval that `rexeval evaluate` stores beside each mean
(aggregates.parquet), appended to its cell as "mean±std [lo, hi]".

Sections (where the study has such a step): seed 000 Table II (stats) and Tables III-VI
(evaluate); seed 002 Tables 2 (extract_quality), 3 (cluster), 6 (star_build) and 1
(star_baselines / star_train, one table per ranking folder set); seed 004 Table 1
(judge_detect), Table 4 and Figure 5 (judge_winrate); seed 001 Table 1 / seed 004
Table 2 (meta_evaluate); the Likert and pairwise judges' summaries; and for every other
job a generic section (its manifest's counts, the tables of its own Markdown, its
figures). A missing or unreadable file is a visible note in its section, never an error.

Every text is escaped: table cells may carry the Markdown marks the builders use
(**bold**, *italic*, `code`, <u>underline</u>), which become those HTML elements and
nothing else; any other "<" is shown as text.
"""
from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rexeval.pipelines.core.outputs import Output, Outputs
from rexeval.storage import Location, PathLike, location
from rexeval.pipelines.study.report_model import (JOB_ORDER, STUDY_FILE, Builder, Report, Section, Skip, Table, _time,
                                                  inline_html, inline_plain, instance_provenance, md_safe, md_text,
                                                  read_study)
from rexeval.pipelines.study.report_sections import (COMBINED, GENERIC_TITLES, PER_INSTANCE, _safe, sample_explanations,
                                                     section_generic)

# What `rexeval study report` writes in its folder (pipelines/core/outputs.py).
STUDY_REPORT_OUTPUTS = Outputs(
    html=Output("index.html", "the report: one self-contained page"),
    md=Output("report.md", "the same as Markdown (figures beside it)"),
    tables=Output("tables", "every table as <key>.csv", folder=True),
    figures=Output("figures", "every figure as <key>.png|svg", folder=True),
)


def build_report(directory: PathLike) -> Report:
    """Read DIR/study.json and every complete step's outputs into a `Report` (DIR, and
    the steps' folders, may be URIs)."""
    directory = location(directory)
    data, instances, notes = read_study(directory)
    rank = {j: k for k, j in enumerate(JOB_ORDER)}
    instances.sort(key=lambda i: (rank.get(i.job, len(rank)), i.step, i.dataset or "", i.name))
    b = Builder(directory, instances)
    step_rows = [[md_text(i.name), md_text(i.job), md_text(i.dataset), md_text(i.status),
                   "–" if i.seconds is None else f"{i.seconds:.1f}", md_text(i.finished), md_text(i.reason)]
                  for i in instances]
    steps = b.table(("steps", "table"), "Steps", columns=["instance", "job", "dataset", "status", "seconds", "finished",
                                                     "reason"], rows=step_rows,
                     align=["left", "left", "left", "left", "right", "left", "left"],
                     sources=[directory / STUDY_FILE], instances=[])
    for i in instances:
        if i.status in ("failed", "skipped"):
            b.skipped.append(Skip(i.name, f"step {i.status}", i.reason or "no reason recorded"))
        elif i.status == "pending":
            b.skipped.append(Skip(i.name, "step pending", i.reason or "not run yet"))
    provenance = {i.name: instance_provenance(i) for i in instances}
    sections: list[Section] = []
    jobs = list(JOB_ORDER) + sorted({i.job for i in instances} - set(JOB_ORDER))
    for job in jobs:
        done = [i for i in instances if i.job == job and i.status == "complete"]
        if job in COMBINED:
            sections += _safe(b, COMBINED[job], title=job, job=job, instances=[i.name for i in done])
        elif job == "star_train":
            continue  # in the ranking section (star_baselines)
        elif job in PER_INSTANCE:
            for inst in done:
                sections += _safe(b, PER_INSTANCE[job], inst, title=inst.name, job=job, instances=[inst.name])
        else:
            title, intro = GENERIC_TITLES.get(job, (None, ""))
            for inst in done:
                def generic(bb, ii, t=title, x=intro):
                    sec = section_generic(bb, ii, f"{t}: {ii.name}" if t else None,
                                          x or "A job this report has no seed layout for: its counts, the "
                                               "tables of its Markdown files and its figures.")
                    if ii.job.startswith("generate"):
                        sample_explanations(bb, ii, sec)
                    return sec
                sections += _safe(b, generic, inst, title=inst.name, job=job, instances=[inst.name])
    return Report(name=str(data.get("name") or directory.name), directory=str(directory),
                  file=_time(data.get("file")), profile=_time(data.get("profile")), created=_time(data.get("created")),
                  updated=_time(data.get("updated")),
                  generated=datetime.now(timezone.utc).isoformat(timespec="seconds"), steps=steps,
                  instances=instances, provenance=provenance, sections=sections, skipped=b.skipped, notes=notes)


# ================================================================== rendering


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;color:#1d232a;
background:#fff}
main{max-width:1200px;margin:0 auto;padding:1.5rem 2rem 4rem}
h1{font-size:1.7rem;margin:.2rem 0 .4rem}h2{font-size:1.3rem;margin:2.2rem 0 .4rem;border-bottom:2px solid #dde3ea;
padding-bottom:.2rem}h3{font-size:1.05rem;margin:1.4rem 0 .3rem}
.meta{color:#55606b;margin:.2rem 0 1rem}.meta span{margin-right:1.2rem}
nav ol{columns:2;margin:.3rem 0 1rem;padding-left:1.4rem}
.block{margin:1rem 0 1.6rem;overflow-x:auto}
table{border-collapse:collapse;margin:.3rem 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d5dbe1;padding:.25rem .5rem;vertical-align:top;text-align:left}
th{background:#f2f5f8}td.right,th.right{text-align:right}td.center,th.center{text-align:center}
tbody tr:nth-child(even){background:#fafbfc}
.caption{color:#333;margin:.2rem 0}.tnote{color:#55606b;font-size:.9em;margin:.2rem 0}
dl.prov{display:grid;grid-template-columns:max-content 1fr;gap:.05rem .8rem;font-size:.82em;color:#4a545e;
margin:.3rem 0 0;padding:.35rem .6rem;background:#f6f8fa;border-left:3px solid #c5cfd9}
dl.prov dt{font-weight:600}dl.prov dd{margin:0;word-break:break-word}
.note{background:#fff6e0;border-left:3px solid #e0a800;padding:.3rem .6rem;margin:.3rem 0}
figure{margin:1rem 0}figure img{max-width:min(100%,900px);height:auto;border:1px solid #e3e7eb}
table[data-table=steps] td:nth-child(6){white-space:nowrap}
figcaption{color:#333;font-weight:600;margin:.2rem 0}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto}
code{background:#f2f5f8;padding:0 .2em;border-radius:3px}
"""

_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="rexeval study report">
<title>Study {{ r.name }}: results</title>
<style>{{ css }}</style>
</head>
<body>
<main>
<h1>Study <span id="study-name">{{ r.name }}</span></h1>
<p class="meta">
{% if r.file %}<span>study file: <code>{{ r.file }}</code></span>{% endif %}
{% if r.profile %}<span>profile: <code>{{ r.profile }}</code></span>{% endif %}
<span>folder: <code>{{ r.directory }}</code></span>
{% if r.created %}<span>created {{ r.created }}</span>{% endif %}
{% if r.updated %}<span>updated {{ r.updated }}</span>{% endif %}
<span>report generated {{ r.generated }}</span>
</p>
{% for n in r.notes %}<p class="note" data-note>{{ n }}</p>{% endfor %}
<nav><strong>Contents</strong><ol>
<li><a href="#steps">Steps</a></li>
<li><a href="#skipped">Skipped and why</a></li>
{% for s in r.sections %}<li><a href="#{{ s.key }}">{{ s.title }}</a></li>{% endfor %}
</ol></nav>

<section id="steps">
<h2>Steps</h2>
{{ table(r.steps, prov=False) }}
</section>

<section id="skipped">
<h2>Skipped and why</h2>
{% if r.skipped %}<ul class="skipped">
{% for s in r.skipped %}<li data-skip="{{ s.where }}"><strong>{{ s.where }}</strong> — {{ s.what }}: {{ s.why }}</li>
{% endfor %}</ul>{% else %}<p>Nothing was skipped: every step completed and no job left anything out.</p>{% endif %}
</section>

{% for s in r.sections %}
<section id="{{ s.key }}" data-job="{{ s.job }}">
<h2>{{ s.title }}</h2>
{% if s.intro %}<p>{{ inline(s.intro) }}</p>{% endif %}
{% for n in s.notes %}<p class="note" data-note>{{ n }}</p>{% endfor %}
{% for t in s.tables %}{{ table(t) }}{% endfor %}
{% for title, text in s.texts %}<div class="block"><h3>{{ title }}</h3><pre>{{ text }}</pre></div>{% endfor %}
{% for f in s.figures %}
<figure id="{{ f.key }}" data-figure="{{ f.key }}">
<figcaption>{{ f.title }}</figcaption>
<img src="{{ f.data_uri() }}" alt="{{ f.title }}" data-figure-img="{{ f.key }}">
{{ prov(f) }}
</figure>
{% endfor %}
{% if not s.tables and not s.figures %}<p class="note" data-note>Nothing to show for this section.</p>{% endif %}
</section>
{% endfor %}
</main>
</body>
</html>
"""

_TABLE = """<div class="block" id="block-{{ t.key }}">
{% if prov %}<h3>{{ t.title }}</h3>{% endif %}
{% if t.caption and t.caption.strip() %}<p class="caption">{{ inline(t.caption) }}</p>{% endif %}
<table id="{{ t.key }}" data-table="{{ t.key }}">
<thead><tr>{% for c in t.columns %}<th class="{{ t.align[loop.index0] }}">{{ inline(c) }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in t.rows %}<tr>{% for c in row %}<td class="{{ t.align[loop.index0] }}">{{ inline(c) }}</td>{% endfor %}</tr>
{% endfor %}</tbody>
</table>
{% if t.note %}<p class="tnote">{{ inline(t.note) }}</p>{% endif %}
{% if prov %}{{ provfn(t) }}{% endif %}
</div>
"""

_PROV = """<dl class="prov" data-prov-for="{{ x.key }}">
<dt>source</dt><dd>{% for s in x.sources %}<code>{{ s }}</code>{% if not loop.last %}, {% endif %}{% endfor %}</dd>
{% for name in x.instances %}{% set p = provenance.get(name, {}) %}
<dt>step instance</dt><dd><strong>{{ name }}</strong> (job {{ p.get("job", "?") }}{% if p.get("dataset") and p.get("dataset") != "–" %}, dataset {{ p.get("dataset") }}{% endif %}), finished {{ p.get("finished", "–") }}</dd>
<dt>models</dt><dd>{{ p.get("models", "–") }}</dd>
<dt>prompt versions</dt><dd>{{ p.get("prompt versions", "–") }}</dd>
<dt>sampling</dt><dd>{{ p.get("sampling", "–") }}</dd>
<dt>settings hash</dt><dd data-config-hash>{{ p.get("settings hash", "–") }}</dd>
{% endfor %}
</dl>
"""


def _env():
    import jinja2
    from markupsafe import Markup

    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined), Markup


def render_html(report: Report) -> str:
    """The whole report as one HTML document (no script, no external resource)."""
    env, Markup = _env()
    prov_t = env.from_string(_PROV)
    table_t = env.from_string(_TABLE)

    def inline(text: Any) -> Any:
        return Markup(inline_html(text))

    def provenance_block(x) -> Any:
        return Markup(prov_t.render(x=x, provenance=report.provenance))

    def table(t: Table, prov: bool = True) -> Any:
        return Markup(table_t.render(t=t, inline=inline, prov=prov, provfn=provenance_block))

    page = env.from_string(_HTML)
    return page.render(r=report, css=Markup(_CSS), inline=inline, table=table, prov=provenance_block)


def _md_table(t: Table) -> list[str]:
    def cell(c: str) -> str:
        return md_safe(str(c)).replace("\n", " ")

    cols = [cell(c) or " " for c in t.columns]
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if a == "right" else ":---:" if a == "center" else "---"
                            for a in (t.align + ["left"] * len(cols))[:len(cols)]) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in t.rows]
    return lines


def _md_prov(report: Report, x) -> list[str]:
    lines = ["", "<sub>source: " + ", ".join(md_text(s) for s in x.sources) + "</sub>"]
    for name in x.instances:
        p = report.provenance.get(name, {})
        lines.append("<sub>" + md_text(
            f"{name} (job {p.get('job', '?')}, finished {p.get('finished', '–')}); models: {p.get('models', '–')}; "
            f"prompt versions: {p.get('prompt versions', '–')}; sampling: {p.get('sampling', '–')}; "
            f"settings hash: {p.get('settings hash', '–')}") + "</sub>")
    return lines


def render_markdown(report: Report, figure_dir: str = STUDY_REPORT_OUTPUTS.figures) -> str:
    """The same report as Markdown; figures are linked from `figure_dir` (written by
    `write_report`)."""
    out = [f"# Study {md_text(report.name)}", ""]
    meta = [f"study file: `{report.file}`" if report.file else "", f"profile: `{report.profile}`" if report.profile
            else "", f"folder: `{report.directory}`", f"created {report.created}" if report.created else "",
            f"updated {report.updated}" if report.updated else "", f"report generated {report.generated}"]
    out += [" · ".join(m for m in meta if m), ""]
    out += [f"> **Note:** {md_text(n)}\n" for n in report.notes]
    out += ["## Steps", "", *_md_table(report.steps), "", "## Skipped and why", ""]
    if report.skipped:
        out += [f"- **{md_text(s.where)}** — {md_text(s.what)}: {md_text(s.why)}" for s in report.skipped]
    else:
        out.append("Nothing was skipped: every step completed and no job left anything out.")
    for s in report.sections:
        out += ["", f"## {md_safe(inline_plain(s.title))}", ""]
        if s.intro:
            out += [md_safe(s.intro), ""]
        out += [f"> **Note:** {md_text(n)}\n" for n in s.notes]
        for t in s.tables:
            out += ["", f"### {md_safe(inline_plain(t.title))}", ""]
            if t.caption.strip():
                out += [md_safe(t.caption), ""]
            out += _md_table(t)
            if t.note:
                out += ["", md_safe(t.note)]
            out += _md_prov(report, t)
        for title, text in s.texts:
            out += ["", f"### {md_text(title)}", "", "```", text.replace("```", "'''"), "```"]
        for f in s.figures:
            out += ["", f"### {md_safe(inline_plain(f.title))}", "",
                    f"![{md_text(f.title)}]({figure_dir}/{f.key}{f.suffix})"]
            out += _md_prov(report, f)
    return "\n".join(out).rstrip() + "\n"


def table_csv(t: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([inline_plain(c) for c in t.columns])
    for r in t.rows:
        w.writerow([inline_plain(c) for c in r])
    return buf.getvalue()


def write_report(report: Report, out: PathLike) -> dict[str, Path | Location]:
    """OUT/index.html, OUT/report.md, OUT/tables/<key>.csv, OUT/figures/<key>.png|svg.
    OUT may be a URI; the paths returned are Locations then, local `Path`s otherwise
    (a browser opens those)."""
    from rexeval.pipelines.core.io import write_bytes_atomic

    out = location(out)
    tables_dir, fig_dir = out / STUDY_REPORT_OUTPUTS.tables, out / STUDY_REPORT_OUTPUTS.figures
    for d in (tables_dir, fig_dir):
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():  # a previous report's files are not this one's
            if old.is_file():
                old.unlink()
    for t in report.tables():
        write_bytes_atomic(tables_dir / f"{t.key}.csv", table_csv(t).encode("utf-8"))
    for f in report.figures():
        write_bytes_atomic(fig_dir / f"{f.key}{f.suffix}", f.data)
    write_bytes_atomic(out / STUDY_REPORT_OUTPUTS.md, render_markdown(report).encode("utf-8"))
    write_bytes_atomic(out / STUDY_REPORT_OUTPUTS.html, render_html(report).encode("utf-8"))
    paths = {name: out / path for name, path in STUDY_REPORT_OUTPUTS.items()}
    return {k: v.local_path() for k, v in paths.items()} if out.is_local else paths
