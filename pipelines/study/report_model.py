"""What a study report is made of (instances, tables, figures, sections, provenance) and
how a study folder and its jobs' files are read (`read_study`, `Reader`, `Builder`,
Markdown pipe tables); `report.py` builds and renders it, `report_sections.py` holds
the section of each job."""
from __future__ import annotations

import base64
import fnmatch
import html
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT as MANIFEST, REPORT_OUTPUT as REPORT
from rexeval.storage import Location, PathLike, is_uri, location
from rexeval.pipelines.generate.config import GENERATE_TRAIN_OUTPUTS
from rexeval.pipelines.judge.config import DETECT_OUTPUTS
from rexeval.pipelines.star.outputs import STAR_BASELINES_OUTPUTS, STAR_TRAIN_OUTPUTS
from rexeval.pipelines.study.builtin_jobs import STATS_OUTPUTS
from rexeval.pipelines.study.plan import STATE_FILE as STUDY_FILE, state_in_todays_names

STATUSES = ("complete", "failed", "skipped", "pending")
# Section order: the order of a study's data flow (and of the seeds' tables).
JOB_ORDER = ("ingest", "split", "stats", "extract", "ground_truth", "extract_quality", "cluster", "star_build",
             "star_baselines", "star_train", "generate_train", "generate_run", "generate_llm", "evaluate",
             "judge_likert", "judge_pairwise", "judge_detect", "judge_winrate", "meta_evaluate",
             "expscore_train", "expscore_score")
MAX_FIGURE_BYTES = 8 << 20
MAX_SAMPLE_TEXT = 400


# ================================================================== the model


@dataclass
class Instance:
    """One step instance of study.json."""

    name: str
    step: str
    job: str
    dataset: str | None
    out: Location | None  # a local folder or a URI
    status: str
    reason: str | None
    fingerprint: str | None
    settings: dict
    seconds: float | None
    finished: str | None
    summary: dict | None


@dataclass
class Table:
    """A table as its builder laid it out: header and rows of cell text (Markdown
    inline marks allowed, see `inline_html`)."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    align: list[str] = field(default_factory=list)
    caption: str = ""
    note: str = ""
    sources: list[str] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)


@dataclass
class Figure:
    key: str
    title: str
    mime: str
    data: bytes
    sources: list[str] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)

    @property
    def suffix(self) -> str:
        return ".svg" if self.mime == "image/svg+xml" else ".png"

    def data_uri(self) -> str:
        return f"data:{self.mime};base64," + base64.b64encode(self.data).decode("ascii")


@dataclass
class Section:
    key: str
    title: str
    job: str
    instances: list[str] = field(default_factory=list)
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (title, preformatted text)


@dataclass
class Skip:
    where: str  # a step instance
    what: str   # the step itself, or a metric family / factor the job left out
    why: str


@dataclass
class Report:
    name: str
    directory: str
    file: str | None
    profile: str | None
    created: str | None
    updated: str | None
    generated: str
    steps: Table
    instances: list[Instance]
    provenance: dict[str, dict[str, str]]
    sections: list[Section]
    skipped: list[Skip]
    notes: list[str]

    def tables(self) -> list[Table]:
        return [self.steps] + [t for s in self.sections for t in s.tables]

    def figures(self) -> list[Figure]:
        return [f for s in self.sections for f in s.figures]


# ================================================================== Markdown cells


_INLINE = re.compile(r"\\([\\`*_|<>#\[\]])"             # a backslash escape
                     r"|(?<!\*)\*\*(?![\s*])(.+?)(?<!\s)\*\*(?!\*)"  # **strong** (not "** x **", as CommonMark)
                     r"|(?<![\w*])\*(?![\s*])(.+?)(?<![\s*])\*(?![\w*])"  # *em*
                     r"|`([^`]+)`"                      # `code`
                     r"|<u>(.*?)</u>"                   # <u>underline</u> (format_table1)
                     r"|(&(?:nbsp|lt|gt|amp|quot|#\d{1,6});)")  # a harmless entity


def inline_html(text: Any) -> str:
    """A table cell's Markdown-inline text as safe HTML: the marks above become
    <strong>, <em>, <code>, <u>; everything else is escaped."""
    text = "" if text is None else str(text)
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()], quote=True))
        esc, strong, em, code, under, entity = m.groups()
        if esc is not None:
            out.append(html.escape(esc, quote=True))
        elif strong is not None:
            out.append(f"<strong>{inline_html(strong)}</strong>")
        elif em is not None:
            out.append(f"<em>{inline_html(em)}</em>")
        elif code is not None:
            out.append(f"<code>{html.escape(code, quote=True)}</code>")
        elif under is not None:
            out.append(f"<u>{inline_html(under)}</u>")
        else:
            out.append(entity)
        pos = m.end()
    out.append(html.escape(text[pos:], quote=True))
    return "".join(out)


def inline_plain(text: Any) -> str:
    """The same cell as plain text (CSV): marks dropped, entities decoded."""
    text = "" if text is None else str(text)
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(text[pos:m.start()])
        esc, strong, em, code, under, entity = m.groups()
        if esc is not None:
            out.append(esc)
        elif strong is not None or em is not None or under is not None:
            out.append(inline_plain(strong if strong is not None else em if em is not None else under))
        elif code is not None:
            out.append(code)
        else:
            out.append(html.unescape(entity).replace("\xa0", " "))
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def md_text(value: Any) -> str:
    """Raw text (a review, a name, a number) as a cell: no mark of it is read as Markdown."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        value = f"{value:g}"
    text = " ".join(str(value).split())
    text = re.sub(r"([\\`*_|\[\]#])", r"\\\1", text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def md_safe(text: str) -> str:
    """A cell for report.md: raw "<" (other than the <u> the builders write) as &lt;."""
    return re.sub(r"<(?!/?u>)", "&lt;", text)


# ================================================================== reading Markdown tables


@dataclass
class MdTable:
    header: list[str]
    rows: list[list[str]]
    align: list[str]
    heading: str = ""
    caption: str = ""
    note: str = ""


_SEPARATOR = re.compile(r"^:?-{1,}:?$")


def _split_row(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", s)]


def markdown_tables(text: str) -> list[MdTable]:
    """The pipe tables of a Markdown text, each with the heading and the text lines just
    before it (caption); text after the last table is that table's note."""
    lines = text.splitlines()
    out: list[MdTable] = []
    heading, before, after, i = "", [], [], 0
    open_note = False  # text right after a table, before any heading
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                block.append(lines[i].strip())
                i += 1
            rows = [_split_row(b) for b in block]
            if len(rows) >= 2 and rows[1] and all(_SEPARATOR.match(c) for c in rows[1]):
                header, body, seps = rows[0], rows[2:], rows[1]
            else:
                header, body, seps = rows[0], rows[1:], []
            width = len(header)
            body = [(r + [""] * width)[:width] for r in body]
            align = [("right" if c.endswith(":") and not c.startswith(":") else "center"
                      if c.startswith(":") and c.endswith(":") else "left") for c in seps]
            align = (align + ["left"] * width)[:width]
            out.append(MdTable(header, body, align, heading, " ".join(before)))
            heading, before, after, open_note = "", [], [], True
            continue
        if line.startswith("#"):
            heading, before, after, open_note = line.lstrip("#").strip(), [], [], False
        elif line:
            before.append(line)
            if open_note:
                after.append(line)
        i += 1
    if out and after:
        out[-1].note = " ".join(after)
    return out


# ================================================================== reading files


class Reader:
    """Reads a study's files; every problem becomes a note instead of an exception."""

    def json(self, path: Location, notes: list[str], what: str = "") -> Any | None:
        text = self.text(path, notes, what)
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            notes.append(f"unreadable {path.name}: {path} ({type(exc).__name__}: {exc})")
            return None

    def text(self, path: Location, notes: list[str], what: str = "") -> str | None:
        if not path.exists():
            notes.append(f"missing {path.name}{' (' + what + ')' if what else ''}: {path}")
            return None
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            notes.append(f"unreadable {path.name}: {path} ({type(exc).__name__}: {exc})")
            return None

    @staticmethod
    def quiet_json(path: Location) -> Any | None:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None


def glob_files(folder: Location, pattern: str) -> list[Location]:
    """Entries below `folder` whose path relative to it matches `pattern` (levels split
    by "/", as pathlib's glob), sorted. A local folder is globbed on disk; a URI folder is
    listed once, recursively, and filtered (one listing instead of one per sub-folder)."""
    if "/" not in pattern:
        return folder.glob(pattern)
    if folder.is_local:
        return [location(p) for p in sorted(Path(folder.path).glob(pattern))]
    depth = pattern.count("/")
    return [f for f in folder.walk_files()
            if (rel := f.relative_to(folder)).count("/") == depth and fnmatch.fnmatchcase(rel, pattern)]


def _time(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_study(directory: PathLike) -> tuple[dict, list[Instance], list[str]]:
    """study.json's header, its step instances (in file order) and notes on entries
    that could not be read. `directory` may be a URI; so may each step's folder."""
    directory = location(directory)
    path = directory / STUDY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {STUDY_FILE} (is it the output folder of `rexeval study run`?)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with name and steps")
    data = state_in_todays_names(data)
    notes, instances = [], []
    steps = data.get("steps")
    if not isinstance(steps, dict):
        notes.append(f"{STUDY_FILE} has no steps mapping: no step can be reported")
        steps = {}
    for name, rec in steps.items():
        if not isinstance(rec, dict):
            notes.append(f"step instance {name!r}: not an object in {STUDY_FILE}; left out")
            continue
        out = rec.get("out")
        out_path = None
        if isinstance(out, str) and out:
            out_path = location(out) if is_uri(out) or Path(out).is_absolute() else directory / out
        step = str(rec.get("step") or name.split("@", 1)[0])
        status = str(rec.get("status") or "pending")
        if status not in STATUSES:
            notes.append(f"step instance {name!r}: unknown status {status!r}")
        instances.append(Instance(
            name=str(name), step=step, job=str(rec.get("job") or "?"),
            dataset=rec.get("dataset") if rec.get("dataset") not in ("", None) else
            (name.split("@", 1)[1] if "@" in name else None),
            out=out_path, status=status, reason=rec.get("reason"), fingerprint=rec.get("fingerprint"),
            settings=rec.get("settings") if isinstance(rec.get("settings"), dict) else {},
            seconds=_number(rec.get("seconds")), finished=_time(rec.get("finished")),
            summary=rec.get("summary") if isinstance(rec.get("summary"), dict) else None))
    return data, instances, notes


# ================================================================== provenance


_SKIP_SUBTREES = {"trials", "examples", "histogram", "overall", "targets", "inputs", "win_rates", "win_rates_disc",
                  "win_rates_per_criterion", "win_rates_per_criterion_disc", "accuracy", "family_counts",
                  "sensitivity", "levels", "heads", "methods", "counts", "position_bias", "factor_correlations",
                  "neighbours", "timings", "quality", "reports", "stats", "summary", "tables", "test", "runs"}
MODEL_KEYS = {"model", "models", "encoders", "reward_model", "judges", "generator", "embedder", "quality_embedder",
              "cross_encoder", "judge", "llm", "statement_encoder", "nli", "judge_llm"}
PROMPT_KEYS = {"prompt", "prompts", "prompt_version", "prompt_versions", "original_prompt_version",
               "inferior_prompt_version", "rubric", "criteria"}
SAMPLING_KEYS = {"sampling", "temperature", "top_p", "top_k", "max_tokens", "max_new_tokens", "do_sample",
                 "num_beams", "seed", "seeds", "shots", "both_orders"}


def _walk(obj: Any, path: tuple = (), depth: int = 0) -> Iterator[tuple[tuple, Any]]:
    if depth > 6:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            k = str(k)
            yield path + (k,), v
            if k not in _SKIP_SUBTREES:
                yield from _walk(v, path + (k,), depth + 1)
    elif isinstance(obj, list) and len(obj) <= 20:
        for v in obj:
            yield from _walk(v, path, depth + 1)


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool)) and not (isinstance(v, str) and not v.strip())


def _value_text(v: Any, names_only: bool = False) -> str | None:
    if _scalar(v):
        return str(v)
    if isinstance(v, dict):
        if names_only:  # a model: role -> ref, or a usage record naming its model
            if isinstance(v.get("model"), str):
                return v["model"]
            parts = [f"{k}={x}" for k, x in v.items() if isinstance(x, str) and x.strip()]
        else:
            parts = [f"{k}={x}" for k, x in v.items() if _scalar(x)]
        return ", ".join(parts) if parts else None
    if isinstance(v, list):
        parts = [str(x) for x in v if _scalar(x)]
        return ", ".join(parts) if parts else None
    return None


def find_keys(sources: Iterable[Any], keys: set[str], strings_only: set[str] = frozenset(),
              limit: int = 8, names_only: bool = False) -> list[str]:
    """"key: value" for every key of `keys` found in the JSON `sources` (deduplicated;
    a mapping found whole is not searched again inside)."""
    seen, out = set(), []
    for src in sources:
        taken: list[tuple] = []
        for path, v in _walk(src):
            k = path[-1]
            if k not in keys or (k in strings_only and not isinstance(v, str)):
                continue
            if any(path[:len(t)] == t for t in taken):
                continue
            text = _value_text(v, names_only)
            if text is None or text in ("None", "null"):
                continue
            taken.append(path)
            label = (".".join(path[-2:]) if len(path) > 1 and path[-2] not in ("config", "settings", "provenance")
                     else k)
            if text in seen or any(f"{k}={text}" in s for s in seen):  # already inside a mapping shown
                continue
            seen.add(text)
            out.append(f"{label}: {text}")
            if len(out) >= limit:
                return out
    return out


def _manifests_below(out: Location, limit: int = 8) -> list[tuple[str, dict]]:
    found = []
    for pattern in (f"*/{MANIFEST}", f"*/*/{MANIFEST}"):  # sub-jobs' (LLM chunks, metric families)
        for p in glob_files(out, pattern):
            m = Reader.quiet_json(p)
            if isinstance(m, dict):
                found.append((p.parent.relative_to(out), m))
            if len(found) >= limit:
                return found
    return found


def _column_values(path: Location, columns: tuple[str, ...], limit: int = 6) -> list[str]:
    """"column: v1, v2" of the distinct values of a few columns of a Parquet file."""
    try:
        from rexeval.pipelines.core.io import parquet_schema, read_parquet

        names = parquet_schema(path).names
        t = read_parquet(path, columns=[c for c in columns if c in names])
    except Exception:  # noqa: BLE001  (absent or unreadable: nothing to add)
        return []
    out = []
    for c in t.column_names:
        values = sorted({str(v) for v in t.column(c).to_pylist() if v is not None})
        if values:
            out.append(f"{c}: {', '.join(values[:limit])}" + (" …" if len(values) > limit else ""))
    return out


def instance_provenance(inst: Instance) -> dict[str, str]:
    """What made an instance's numbers: job, models, prompt versions, sampling, the
    settings hash its job recorded (manifest.json / report.json), when it finished."""
    prov = {"step instance": inst.name, "job": inst.job, "dataset": inst.dataset or "–", "status": inst.status,
            "finished": inst.finished or "–", "output": str(inst.out) if inst.out else "–"}
    manifest = report = None
    subs: list[tuple[str, dict]] = []
    if inst.out is not None and inst.out.is_dir():
        manifest = Reader.quiet_json(inst.out / MANIFEST)
        report = Reader.quiet_json(inst.out / REPORT)
        if inst.job in ("star_train",):
            report = {"train": [Reader.quiet_json(p) for p in inst.out.glob(STAR_TRAIN_OUTPUTS.report.pattern)][:4]}
        elif inst.job == "generate_train":
            report = Reader.quiet_json(inst.out / GENERATE_TRAIN_OUTPUTS.report)
        elif inst.job == "star_baselines":
            report = Reader.quiet_json(inst.out / STAR_BASELINES_OUTPUTS.report)
        elif inst.job == "stats":
            report = Reader.quiet_json(inst.out / STATS_OUTPUTS.stats)
        subs = _manifests_below(inst.out)
    manifest = manifest if isinstance(manifest, dict) else {}
    report = report if isinstance(report, dict) else {}
    hashes = []
    runs = report.get("train") if isinstance(report.get("train"), list) else []  # star_train: one per model
    for src in (manifest, report, *runs):
        if isinstance(src, dict) and src.get("config_hash"):
            hashes.append(str(src["config_hash"]))
    prov_block = report.get("provenance") if isinstance(report.get("provenance"), dict) else {}
    if prov_block.get("settings_hash"):
        hashes.append(str(prov_block["settings_hash"]))
    if not hashes and subs:
        hashes = [f"{name}: {m['config_hash']}" for name, m in subs if m.get("config_hash")][:4]
    hashes = list(dict.fromkeys(hashes))
    if hashes:
        prov["settings hash"] = "; ".join(hashes)
    else:
        prov["settings hash"] = ("not recorded by the job" + (f"; study fingerprint {inst.fingerprint}"
                                                             if inst.fingerprint else ""))
    sources = [manifest.get("config", {}), report, *[m.get("config", {}) for _, m in subs], inst.settings]
    models = find_keys(sources, MODEL_KEYS, names_only=True)
    prompts = find_keys(sources, PROMPT_KEYS, strings_only={"criteria", "rubric"})
    sampling = find_keys(sources, SAMPLING_KEYS)
    if inst.job == "judge_detect" and inst.out is not None:  # versions live in the generated pairs
        prompts += _column_values(inst.out / DETECT_OUTPUTS.pairs,
                                  ("original_prompt_version", "inferior_prompt_version"))
    prov["models"] = "; ".join(models) if models else "–"
    prov["prompt versions"] = "; ".join(prompts) if prompts else "–"
    prov["sampling"] = "; ".join(sampling) if sampling else "–"
    return prov


# ================================================================== building


class Builder:
    """Collects sections; hands out unique table and figure keys."""

    def __init__(self, directory: Location, instances: list[Instance]):
        self.directory = directory
        self.instances = instances
        self.by_name = {i.name: i for i in instances}
        self.keys: set[str] = {"steps", "skipped"}  # the fixed sections' ids
        self.skipped: list[Skip] = []
        self.reader = Reader()

    def key(self, *parts: str) -> str:
        base = re.sub(r"[^a-z0-9]+", "-", "-".join(p for p in parts if p).lower()).strip("-") or "table"
        base = base[:80]
        k, n = base, 2
        while k in self.keys:
            k, n = f"{base}-{n}", n + 1
        self.keys.add(k)
        return k

    def table(self, key_parts: tuple, title: str, md: MdTable | None = None, *, columns=None, rows=None,
              align=None, caption: str = "", note: str = "", sources=(), instances=()) -> Table:
        if md is not None:
            columns, rows, align = md.header, md.rows, md.align
            caption = caption or " ".join(x for x in (md.heading, md.caption) if x)
            note = note or md.note
        columns = list(columns or [])
        rows = [list(r) for r in rows or []]
        return Table(self.key(*key_parts), title, columns, rows, numeric_align(rows, align or ["left"] * len(columns)),
                     caption, note, [str(s) for s in sources], list(instances))

    def figure(self, key_parts: tuple, title: str, path: Location, notes: list[str], instances=()) -> Figure | None:
        mime = "image/svg+xml" if path.suffix.lower() == ".svg" else "image/png"
        try:
            data = path.read_bytes()
        except OSError as exc:
            notes.append(f"unreadable figure {path} ({exc})")
            return None
        if len(data) > MAX_FIGURE_BYTES:
            notes.append(f"figure {path} is {len(data) >> 20} MB, above the {MAX_FIGURE_BYTES >> 20} MB "
                         "kept inline; open it beside the report")
            return None
        if mime == "image/png" and not data.startswith(b"\x89PNG\r\n\x1a\n"):
            notes.append(f"figure {path} is not a PNG file; left out")
            return None
        return Figure(self.key("fig", *key_parts), title, mime, data, [str(path)], list(instances))

    def figures_in(self, folder: Location, inst: Instance, notes: list[str], names: list[str] | None = None
                   ) -> list[Figure]:
        """The figures a job wrote at the top of its folder (PNG; SVG where no PNG of the
        same name exists)."""
        if not folder.is_dir():
            return []
        entries = folder.iterdir()
        pngs = [p for p in entries if fnmatch.fnmatchcase(p.name, "*.png")]
        have = {p.stem for p in pngs}
        files = pngs + [p for p in entries if fnmatch.fnmatchcase(p.name, "*.svg") and p.stem not in have]
        if names is not None:
            files = [p for p in files if p.name in names]
        out = []
        for p in files:
            f = self.figure((inst.name, p.stem), f"{p.stem} ({inst.name})", p, notes, [inst.name])
            if f:
                out.append(f)
        return out

    def counts_table(self, inst: Instance, counts: dict, source: Location | str, title: str = "Counts"
                     ) -> Table | None:
        rows = [[md_text(k), md_text(v)] for k, v in counts.items()
                if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
        if not rows:
            return None
        return self.table((inst.name, "counts"), f"{title}: {inst.name}", columns=["count", "value"], rows=rows,
                          align=["left", "right"], sources=[source], instances=[inst.name])

    def md_file_tables(self, inst: Instance, path: Location, notes: list[str], title: str, what: str = "",
                       missing_ok: bool = False) -> list[Table]:
        if missing_ok and not path.exists():
            return []
        text = self.reader.text(path, notes, what)
        if text is None:
            return []
        found = markdown_tables(text)
        if not found:
            notes.append(f"{path} holds no table")
        out = []
        for k, md in enumerate(found):
            name = title if len(found) == 1 else f"{title} ({k + 1}/{len(found)})"
            out.append(self.table((inst.name, path.stem, str(k + 1) if len(found) > 1 else ""), name, md,
                                  sources=[path], instances=[inst.name]))
        return out


_NUMBER = re.compile(r"^[+\-−]?\d")


def numeric_align(rows: list[list[str]], align: list[str]) -> list[str]:
    """Right-align the columns (after the first) whose every filled cell starts with a number."""
    out = list(align)
    for j in range(1, len(out)):
        cells = [inline_plain(r[j]).strip() for r in rows if j < len(r)]
        cells = [c for c in cells if c not in ("", "–", "-", "n/a")]
        if out[j] == "left" and cells and all(_NUMBER.match(c) for c in cells):
            out[j] = "right"
    return out


def _complete(b: Builder, job: str | tuple) -> list[Instance]:
    jobs = (job,) if isinstance(job, str) else job
    return [i for i in b.instances if i.job in jobs and i.status == "complete"]


def _missing_out(inst: Instance, notes: list[str]) -> bool:
    if inst.out is None:
        notes.append(f"{inst.name}: {STUDY_FILE} gives no output folder")
        return True
    if not inst.out.is_dir():
        notes.append(f"{inst.name}: output folder missing: {inst.out}")
        return True
    return False


