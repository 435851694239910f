"""mkdocs hook: the pages' lists that the code already holds, generated at build time.

- `<!-- rexeval-outputs -->` (docs/outputs.md): every job's output folder, from its
  `Outputs` declaration (`pipelines/core/outputs.py`): each file or folder, what it holds,
  and the columns a reader may rely on. The declaration is what the job writes and what
  the study plan and report read, so the page cannot drift from them.
- `<!-- rexeval-study-jobs -->` (docs/studies.md): every study job with its one-line
  description, from the registry (`STUDY_JOBS`), so a job added in a module of its own
  appears by itself.
- `<!-- rexeval-prompted-methods -->` (docs/methods/prompted-generators.md): every
  prompted generator (`METHODS`) with what it does (its docstring's first paragraph), what
  it conditions on and never sees, and its error rows (the class's declarations);
  `<!-- rexeval-prompted-method-names -->` their names alone, for a sentence.
- `<!-- rexeval-metric-families -->` (docs/methods/evaluation.md): every metric family of
  `rexeval evaluate` (`FAMILIES`, and `corpus`) with what it computes, its metrics and the
  profile roles it needs; `<!-- rexeval-metrics -->` every metric (`METRICS`) with its
  family, kind, direction and description.
- `<!-- rexeval-rankers -->` (docs/methods/ranking.md): every statement ranker
  (`RANKERS`), trained or baseline, with its docstring's first paragraph;
  `<!-- rexeval-trained-ranker-names -->` and `<!-- rexeval-baseline-ranker-names -->`
  their names alone.

Each list is what `--help` and the jobs read, so a thing added in a file of its own
appears on the pages by itself; an empty registry fails the build.
"""
from __future__ import annotations

import re
import warnings

OUTPUTS_MARKER = "<!-- rexeval-outputs -->"
JOBS_MARKER = "<!-- rexeval-study-jobs -->"
METHODS_MARKER = "<!-- rexeval-prompted-methods -->"
METHOD_NAMES_MARKER = "<!-- rexeval-prompted-method-names -->"
FAMILIES_MARKER = "<!-- rexeval-metric-families -->"
METRICS_MARKER = "<!-- rexeval-metrics -->"
RANKERS_MARKER = "<!-- rexeval-rankers -->"
TRAINED_RANKER_NAMES_MARKER = "<!-- rexeval-trained-ranker-names -->"
BASELINE_RANKER_NAMES_MARKER = "<!-- rexeval-baseline-ranker-names -->"


def _jobs():
    from rexeval.pipelines.core.study_registry import STUDY_JOBS

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


def _names(registry) -> list[str]:
    names = registry.names()  # imports every module of the kind, built-in or of its own
    if not names:
        raise RuntimeError(f"no {registry.kind} is registered")
    return names


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) or "—" for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _codes(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _methods():
    from rexeval.pipelines.generate.prompted.methods import METHODS

    return METHODS


def prompted_methods_table() -> str:
    from rexeval.registry import summary

    reg = _methods()
    rows = []
    for name in _names(reg):
        cls = reg.lookup(name)
        rows.append((f"`{name}`", summary(cls), getattr(cls, "conditions_on", ""), getattr(cls, "never_sees", ""),
                     _codes(getattr(cls, "errors", ()))))
    return _table(("system", "what it does", "conditions on", "never sees", "error rows"), rows)


def prompted_method_names() -> str:
    return _codes(_names(_methods()))


def metric_families_table() -> str:
    from rexeval.pipelines.evaluate.families import FAMILIES, corpus_metrics, corpus_scores
    from rexeval.registry import summary

    rows = []
    for name in _names(FAMILIES):
        cls = FAMILIES.lookup(name)
        what = summary(cls) + ("" if cls.in_all else " Run only when asked for by name, not by `all`.")
        rows.append((f"`{name}`", what, _codes(cls.metrics()), _codes(cls.roles)))
    # "corpus" is the one family that is not a class: the per-system metrics (`rexeval evaluate`'s --metrics)
    rows.append(("`corpus`", summary(corpus_scores), _codes(corpus_metrics()), ""))
    return _table(("family", "what it computes", "metrics", "profile roles"), rows)


def metrics_table() -> str:
    from rexeval.metrics.registry import METRICS

    rows = []
    for name in _names(METRICS):
        info = METRICS.lookup(name).metric_info
        rows.append((f"`{name}`", f"`{info.group}`" if info.group else "", info.kind.replace("_", " "),
                     "higher" if info.higher_is_better else "lower", info.description))
    return _table(("metric", "family", "kind", "better", "what it is"), rows)


def _rankers() -> list[tuple[str, type, bool]]:
    from rexeval.models.recommenders.base import RANKERS, TrainableRanker

    out = []
    for name in _names(RANKERS):
        cls = RANKERS.lookup(name)
        out.append((name, cls, isinstance(cls, type) and issubclass(cls, TrainableRanker)))
    return out


def rankers_table() -> str:
    from rexeval.registry import summary

    rows = [(f"`{name}`", "trained (`rexeval star train`)" if trained else "baseline (`rexeval star baselines`)",
             summary(cls)) for name, cls, trained in _rankers()]
    return _table(("ranker", "kind", "what it is"), rows)


def ranker_names(trained: bool) -> str:
    return _codes(name for name, _, t in _rankers() if t == trained)


GENERATED = {
    OUTPUTS_MARKER: outputs_page,
    JOBS_MARKER: study_jobs_list,
    METHODS_MARKER: prompted_methods_table,
    METHOD_NAMES_MARKER: prompted_method_names,
    FAMILIES_MARKER: metric_families_table,
    METRICS_MARKER: metrics_table,
    RANKERS_MARKER: rankers_table,
    TRAINED_RANKER_NAMES_MARKER: lambda: ranker_names(True),
    BASELINE_RANKER_NAMES_MARKER: lambda: ranker_names(False),
}
"""Each marker and what replaces it."""


def on_page_markdown(markdown, page, config, files):
    if "<!-- rexeval-" not in markdown:
        return markdown
    with warnings.catch_warnings():  # the libraries' deprecation notices on import are not ours to show
        warnings.simplefilter("ignore")
        for marker, make in GENERATED.items():
            if marker in markdown:
                markdown = markdown.replace(marker, make())
    unknown = re.findall(r"<!-- rexeval-[^>]*-->", markdown)
    if unknown:  # a misspelt marker would otherwise vanish from the page unseen
        raise ValueError(f"{page.file.src_path if page else 'a page'}: unknown marker(s) {unknown}; "
                         f"known: {list(GENERATED)}")
    return markdown
