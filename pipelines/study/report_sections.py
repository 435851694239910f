"""The report's sections, one builder per job (or per group of jobs whose tables combine,
such as Table 3 over every cluster step), in the seeds' layouts; `PER_INSTANCE` and
`COMBINED` map jobs to them (see report.py for the rules every section follows)."""
from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rexeval.pipelines.paraphrase.config import CLUSTER_OUTPUTS as CLUSTER
from rexeval.pipelines.core.io import read_parquet
from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT as MANIFEST, REPORT_OUTPUT as REPORT
from rexeval.storage import Location, location
from rexeval.pipelines.evaluate.config import EVALUATE_OUTPUTS as EVALUATE
from rexeval.pipelines.expscore.config import EXPSCORE_SCORE_OUTPUTS, EXPSCORE_TRAIN_OUTPUTS
from rexeval.pipelines.extract.config import QUALITY_OUTPUTS
from rexeval.pipelines.generate.config import GENERATE_RUN_OUTPUTS
from rexeval.pipelines.generate.prompted.config import PROMPTED_OUTPUTS
from rexeval.pipelines.judge.config import DETECT_OUTPUTS, JUDGE_REPORT, LIKERT_OUTPUTS, PAIRWISE_OUTPUTS
from rexeval.pipelines.judge.winrate import WINRATE_OUTPUTS as WINRATE
from rexeval.pipelines.meta_evaluate.config import META_EVALUATE_OUTPUTS as META
from rexeval.pipelines.star.outputs import PER_INTERACTION, RESULTS, STAR_BUILD_OUTPUTS, STAR_TRAIN_OUTPUTS
from rexeval.pipelines.study.builtin_jobs import STATS_OUTPUTS

from rexeval.pipelines.study.report_model import (MAX_SAMPLE_TEXT, STUDY_FILE, Builder, Instance, Reader, Section, Skip,
                                                  _complete, _missing_out, _number, inline_plain, markdown_tables,
                                                  md_text)

# Every file a section reads is named by the declaration of the job that writes it
# (`outputs`, pipelines/core/outputs.py), never by a literal here.


# ------------------------------------------------------------------ seed 000 Table II


def _stats_of(obj: Any) -> dict[str, dict] | None:
    """{name: dataset_stats} from a stats job's stats.json (its "stats" mapping, or the
    mapping itself, or one dataset's stats)."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("stats"), dict):
        obj = obj["stats"]
    if "users" in obj and "interactions" in obj:
        return {"all": obj}
    out = {str(k): v for k, v in obj.items() if isinstance(v, dict) and "users" in v}
    return out or None


def section_stats(b: Builder) -> list[Section]:
    insts = _complete(b, "stats")
    if not insts:
        return []
    from rexeval.pipelines.ingest.stats import format_table

    sec = Section(b.key("sec", "stats"), "Dataset statistics (seed 000, Table II)", "stats", [i.name for i in insts],
                  intro="Users, items, interactions, splits and review statistics of each dataset, as "
                        "`rexeval info` prints them (pipelines/ingest/stats.py).")
    columns: dict[str, dict] = {}
    sources, used = [], []
    per: list[tuple[Instance, dict]] = []
    for inst in insts:
        if _missing_out(inst, sec.notes):
            continue
        stats = _stats_of(b.reader.json(inst.out / STATS_OUTPUTS.stats, sec.notes, "Table II numbers"))
        if stats is None:
            fallback = inst.out / STATS_OUTPUTS.table
            if fallback.exists():
                text = b.reader.text(fallback, sec.notes)
                if text and markdown_tables(text):
                    sec.tables += b.md_file_tables(inst, fallback, sec.notes, f"Table II: {inst.name}")
                elif text:
                    sec.texts.append((f"Table II: {inst.name} ({fallback})", text))
            continue
        per.append((inst, stats))
    names = [n for _, s in per for n in s]
    clash = len(names) != len(set(names))
    for inst, stats in per:
        for name, s in stats.items():
            label = f"{inst.dataset or inst.name}: {name}" if clash else name
            columns[label] = s
        sources.append(inst.out / STATS_OUTPUTS.stats)
        used.append(inst.name)
    if columns:
        try:
            md = markdown_tables(format_table(columns, markdown=True))[0]
            sec.tables.insert(0, b.table(("table2",), "Table II: dataset statistics", md, sources=sources,
                                         instances=used))
        except Exception as exc:  # noqa: BLE001  (a stats.json of another layout)
            sec.notes.append(f"Table II could not be laid out from {', '.join(map(str, sources))}: "
                             f"{type(exc).__name__}: {exc}")
    return [sec]


# ------------------------------------------------------------------ seed 000 Tables III-VI


def _evaluate_intervals(folder: Location, notes: list[str]) -> dict[tuple[str, str], tuple[float, float]] | None:
    """(metric, system) -> bootstrap interval, from aggregates.parquet (else tables.csv)."""
    out = {}
    agg, table = folder / EVALUATE.aggregates, folder / EVALUATE.tables_csv
    try:
        if agg.exists():
            rows = read_parquet(agg, columns=["system", "metric", "ci_low", "ci_high"]).to_pylist()
        elif table.exists():
            text = table.read_text(encoding="utf-8")
            rows = [{"system": r["system"], "metric": r["key"], "ci_low": r.get("ci_low"),
                     "ci_high": r.get("ci_high")} for r in csv.DictReader(io.StringIO(text, newline=""))]
            notes.append(f"{agg} missing: intervals read from {EVALUATE.tables_csv}")
        else:
            notes.append(f"missing {EVALUATE.aggregates} and {EVALUATE.tables_csv} in {folder}: tables shown without "
                         "intervals")
            return None
    except Exception as exc:  # noqa: BLE001
        notes.append(f"unreadable {agg}: {type(exc).__name__}: {exc}; tables shown without intervals")
        return None
    for r in rows:
        lo, hi = _number(r.get("ci_low")), _number(r.get("ci_high"))
        if lo is not None and hi is not None:
            out[(str(r["metric"]), str(r["system"]))] = (lo, hi)
    return out


def _evaluate_correlations(b: Builder, inst: Instance, sec: Section) -> None:
    """Metric agreement (Kendall tau between metrics, seed 000's question of how far the
    metrics agree): the tables of metric_correlations.md and its heat maps, when the
    job wrote them (older evaluate folders have none: nothing to add)."""
    folder = inst.out
    path = folder / EVALUATE.correlations_md
    if path.is_file():
        text = b.reader.text(path, sec.notes, "metric agreement")
        for k, md in enumerate(markdown_tables(text or "")):
            sec.tables.append(b.table((inst.name, "metric_correlations", str(k)),
                                      f"{md.heading or 'Kendall τ between metrics'} ({inst.name})", md,
                                      sources=[path, folder / EVALUATE.correlations_csv], instances=[inst.name]))
    for png in folder.glob(EVALUATE.correlation_figures.pattern):
        over = png.stem.rsplit("_", 1)[-1]
        fig = b.figure((inst.name, png.stem), f"Kendall τ between metrics over {over} ({inst.name})", png,
                       sec.notes, instances=[inst.name])
        if fig:
            sec.figures.append(fig)


def section_evaluate(b: Builder, inst: Instance) -> Section:
    from rexeval.pipelines.evaluate.report import tables_for

    sec = Section(b.key("sec", inst.name), f"Evaluation metrics (seed 000, Tables III–VI): {inst.name}",
                  inst.job, [inst.name],
                  intro="Mean±std per system and metric with the bootstrap interval [lo, hi] of the mean "
                        "(`rexeval evaluate`); best system per metric in bold, worst in italics.")
    if _missing_out(inst, sec.notes):
        return sec
    folder = inst.out
    report = b.reader.json(folder / EVALUATE.report, sec.notes, "counts, skipped metrics")
    task = report.get("task") if isinstance(report, dict) else None
    if task == "review":  # generators trained on the reviews, scored against them
        sec.title = f"Review generation (seed 000, Table VII): {inst.name}"
        sec.intro += " The references are the reviews themselves, not ground-truth explanations."
    text = b.reader.text(folder / EVALUATE.tables_md, sec.notes, "Table VII" if task == "review" else "Tables III–VI")
    intervals = _evaluate_intervals(folder, sec.notes) if text else None
    keys_by_title = {title: {label: m for m, label in rows} for title, rows in tables_for(task or "explanation")}
    for md in markdown_tables(text or ""):
        title = md.heading or "results"
        labels = keys_by_title.get(title, {})
        if intervals is not None and len(md.header) > 2:
            systems = [inline_plain(h) for h in md.header[2:]]
            for row in md.rows:
                key = labels.get(inline_plain(row[1]), inline_plain(row[1]))
                for j, system in enumerate(systems, start=2):
                    ci = intervals.get((key, system))
                    if ci is not None and row[j] not in ("–", ""):
                        row[j] = f"{row[j]} [{ci[0]:.4f}, {ci[1]:.4f}]"
        sec.tables.append(b.table((inst.name, title.split(":")[0]), f"{title} ({inst.name})", md,
                                  caption=" ", sources=[folder / EVALUATE.tables_md, folder / EVALUATE.aggregates],
                                  instances=[inst.name]))
    if text is not None and not sec.tables:
        sec.notes.append(f"{folder / EVALUATE.tables_md} holds no table: no metric was computed")
    if (folder / EVALUATE.figure2).is_file():  # seed 000's Figure 2 (StEnt-bin), drawn by the job
        fig = b.figure((inst.name, "figure2"), f"Figure 2: StEnt-bin ({inst.name})", folder / EVALUATE.figure2,
                       sec.notes, instances=[inst.name])
        if fig:
            sec.figures.append(fig)
    _evaluate_correlations(b, inst, sec)
    if isinstance(report, dict):
        t = b.counts_table(inst, report.get("counts") or {}, folder / EVALUATE.report)
        if t:
            sec.tables.append(t)
        for fam, why in (report.get("skipped") or {}).items():
            b.skipped.append(Skip(inst.name, f"metric family {fam}", str(why)))
        for fam, per in (report.get("skipped_for_systems") or {}).items():
            for system, why in (per or {}).items():
                b.skipped.append(Skip(inst.name, f"metric family {fam} for system {system}", str(why)))
    return sec


# ------------------------------------------------------------------ seed 002 Table 2 (extract_quality)


def section_generic(b: Builder, inst: Instance, title: str | None = None, intro: str = "") -> Section:
    """Any job: its manifest's counts (else its report's, else the study's summary),
    the tables of the Markdown files at the top of its folder and its figures."""
    sec = Section(b.key("sec", inst.name), title or f"{inst.job}: {inst.name}", inst.job, [inst.name], intro=intro)
    if _missing_out(inst, sec.notes):
        if inst.summary:
            t = b.counts_table(inst, inst.summary, f"{STUDY_FILE} summary")
            if t:
                sec.tables.append(t)
        return sec
    folder = inst.out
    manifest = Reader.quiet_json(folder / MANIFEST)
    report = Reader.quiet_json(folder / REPORT)
    counts, source = None, None
    for src, name in ((manifest, MANIFEST), (report, REPORT)):
        if isinstance(src, dict) and isinstance(src.get("counts"), dict) and src["counts"]:
            counts, source = src["counts"], folder / name
            break
    if counts is None and isinstance(report, dict):  # a report whose counts are its top-level numbers
        top = {k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if top:
            counts, source = top, folder / REPORT
    if counts is None and inst.summary:
        counts, source = inst.summary, f"{STUDY_FILE} summary"
    if counts is None:
        sec.notes.append(f"{folder}: no {MANIFEST} or {REPORT} with counts")
    else:
        t = b.counts_table(inst, counts, source)
        if t:
            sec.tables.append(t)
    for md in folder.glob("*.md"):
        name = MD_TITLES.get((inst.job, md.name), md.name)
        sec.tables += b.md_file_tables(inst, md, sec.notes, f"{name} ({inst.name})")
    sec.figures += b.figures_in(folder, inst, sec.notes)
    if isinstance(report, dict) and isinstance(report.get("unavailable"), dict):
        for factor, why in report["unavailable"].items():
            b.skipped.append(Skip(inst.name, f"factor {factor}", str(why)))
    return sec


def _explanation_files(folder: Location) -> list[Location]:
    """The explanations of a `generate llm` folder (one file), else the first part of a
    `generate run` folder's table."""
    if (folder / PROMPTED_OUTPUTS.explanations).is_file():
        return [folder / PROMPTED_OUTPUTS.explanations]
    if (folder / GENERATE_RUN_OUTPUTS.explanations).is_dir():
        parts = (folder / GENERATE_RUN_OUTPUTS.explanations).glob("*.parquet")
        return [p for p in parts if not p.name.startswith(".")][:1]
    return []


def sample_explanations(b: Builder, inst: Instance, sec: Section, per_system: int = 2) -> None:
    """The first explanations of each system, as written (escaped, shortened)."""
    files = _explanation_files(inst.out) if inst.out and inst.out.is_dir() else []
    if not files:
        return
    try:
        t = read_parquet(files[0])
        cols = [c for c in ("example_id", "system", "explanation") if c in t.column_names]
        if "explanation" not in cols:
            sec.notes.append(f"{files[0]} has no explanation column")
            return
        rows, seen = [], {}
        for r in t.select(cols).slice(0, 5000).to_pylist():
            s = r.get("system")
            if seen.get(s, 0) >= per_system:
                continue
            seen[s] = seen.get(s, 0) + 1
            text = str(r["explanation"] or "")
            text = text if len(text) <= MAX_SAMPLE_TEXT else text[:MAX_SAMPLE_TEXT] + " …"
            rows.append([md_text(r.get(c)) if c != "explanation" else md_text(text) for c in cols])
    except Exception as exc:  # noqa: BLE001
        sec.notes.append(f"unreadable explanations {files[0]}: {type(exc).__name__}: {exc}")
        return
    sec.tables.append(b.table((inst.name, "samples"), f"Sample explanations ({inst.name})", columns=cols,
                              rows=rows, caption=f"The first {per_system} explanation(s) of each system.",
                              sources=[files[0]], instances=[inst.name]))


# ------------------------------------------------------------------ seed 002 Table 3 (cluster)


def section_cluster(b: Builder) -> list[Section]:
    insts = _complete(b, "cluster")
    if not insts:
        return []
    from rexeval.pipelines.paraphrase.quality import format_table3

    sec = Section(b.key("sec", "cluster"), "Statement clustering (seed 002, Table 3)", "cluster", [i.name for i in insts],
                  intro="Clusters, reduction %, SSE (lower is better) and SSB (higher is better) of each "
                        "clustering run (`rexeval cluster`, pipelines/paraphrase/quality.py).")
    by_dataset: dict[str, list[tuple[Instance, dict]]] = {}
    for inst in insts:
        if _missing_out(inst, sec.notes):
            continue
        rep = b.reader.json(inst.out / CLUSTER.report, sec.notes, "Table 3 numbers")
        if not isinstance(rep, dict) or not all(k in rep for k in ("method", "clusters", "reduction_pct", "sse",
                                                                   "ssb")):
            if rep is not None:
                sec.notes.append(f"{inst.out / CLUSTER.report} lacks Table 3's fields; left out")
            continue
        by_dataset.setdefault(inst.dataset or rep.get("dataset") or "", []).append((inst, rep))
    header, rows, sources, used = None, [], [], []
    for dataset, items in by_dataset.items():
        md = markdown_tables(format_table3([r for _, r in items], dataset=dataset))[0]
        header, align = md.header, md.align
        rows += md.rows
        sources += [i.out / CLUSTER.report for i, _ in items]
        used += [i.name for i, _ in items]
    if header:
        sec.tables.append(b.table(("table3",), "Table 3: clustering quality", columns=header, rows=rows,
                                  align=align, caption="Best SSB per dataset in bold.", sources=sources,
                                  instances=used))
    for dataset, items in by_dataset.items():
        for inst, rep in items:
            hist = rep.get("histogram") or []
            lines = []
            for ex in rep.get("examples") or []:
                members = " · ".join(md_text(m) for m in ex.get("members") or [])
                lines.append([md_text(ex.get("cluster")), md_text(ex.get("kind")), md_text(ex.get("size")),
                              md_text(ex.get("representative")), members or "–"])
            if lines:
                sec.tables.append(b.table((inst.name, "examples"), f"Cluster examples ({inst.name})",
                                          columns=["cluster", "kind", "size", "representative", "members"],
                                          rows=lines, sources=[inst.out / CLUSTER.report], instances=[inst.name]))
            figs = b.figures_in(inst.out, inst, sec.notes, names=[CLUSTER.sizes_figure])
            for f in figs:
                f.title = f"Cluster sizes ({inst.name}, {rep.get('method')}, {len(hist)} distinct sizes)"
            sec.figures += figs
            if rep.get("pair_filter"):
                sec.notes.append(f"{inst.name}: pair filter: {rep['pair_filter']}")
    return [sec]


# ------------------------------------------------------------------ seed 002 Table 6 (star_build)


def section_star_build(b: Builder) -> list[Section]:
    insts = _complete(b, "star_build")
    if not insts:
        return []
    from rexeval.pipelines.star.build import format_table6

    sec = Section(b.key("sec", "star-build"), "STAR benchmark statistics (seed 002, Table 6)", "star_build",
                  [i.name for i in insts],
                  intro="Users, items, interactions and statements before and after clustering "
                        "(`rexeval star build`, pipelines/star/build.py).")
    per = []
    for inst in insts:
        if _missing_out(inst, sec.notes):
            continue
        stats = b.reader.json(inst.out / STAR_BUILD_OUTPUTS.stats, sec.notes, "Table 6 numbers")
        if isinstance(stats, dict) and stats:
            per.append((inst, stats))
        elif (inst.out / STAR_BUILD_OUTPUTS.stats_md).exists():
            sec.tables += b.md_file_tables(inst, inst.out / STAR_BUILD_OUTPUTS.stats_md, sec.notes,
                                           f"Table 6 ({inst.name})")
    names = [n for _, s in per for n in s]
    clash = len(names) != len(set(names))
    merged = {}
    for inst, stats in per:
        for n, s in stats.items():
            merged[f"{n} ({inst.dataset or inst.name})" if clash else n] = s
    if merged:
        try:
            md = markdown_tables(format_table6(merged))[0]
            sec.tables.insert(0, b.table(("table6",), "Table 6: benchmark statistics", md,
                                         sources=[i.out / STAR_BUILD_OUTPUTS.stats for i, _ in per],
                                         instances=[i.name for i, _ in per]))
        except Exception as exc:  # noqa: BLE001
            sec.notes.append(f"Table 6 could not be laid out: {type(exc).__name__}: {exc}")
    for inst, _ in per:
        m = Reader.quiet_json(inst.out / STAR_BUILD_OUTPUTS.manifest)
        if isinstance(m, dict) and isinstance(m.get("counts"), dict):
            t = b.counts_table(inst, m["counts"], inst.out / STAR_BUILD_OUTPUTS.manifest)
            if t:
                sec.tables.append(t)
    return [sec]


# ------------------------------------------------------------------ seed 002 Table 1 (ranking)


def _train_name(settings: dict) -> str:
    model = str((settings.get("settings") or {}).get("model") or "expgcn")
    base = model.replace("+", "plus")
    sweep = settings.get("sweep")
    return f"{base}-sweep-{sweep}" if sweep else base


def _link_method(d: Location, target: Path) -> None:
    """One method's results folder inside the merged local view Table 1 reads: a link to
    a local folder (a copy where links fail), its per-interaction table copied down from
    a URI (the only file Table 1 reads)."""
    if d.is_local:
        try:
            target.symlink_to(d.local_path(), target_is_directory=True)
        except OSError:
            shutil.copytree(d.local_path(), target)
        return
    target.mkdir(parents=True)
    (d / PER_INTERACTION.name).download(target / PER_INTERACTION.name)


def section_star_ranking(b: Builder) -> list[Section]:
    insts = _complete(b, ("star_baselines", "star_train"))
    if not insts:
        return []
    from rexeval.pipelines.star.report import effect_details, format_table1, table1

    sec = Section(b.key("sec", "star-ranking"), "Statement ranking (seed 002, Table 1)", "star_ranking", [i.name for i in insts],
                  intro="P/R/NDCG@10 per method at global and item level; under each learned model its gain "
                        "over the best popularity baseline with paired t-test stars (`rexeval star report`, "
                        "pipelines/star/report.py).")
    # A study gives every step its own folder: one dataset's baselines and trained
    # models sit in several run folders, which Table 1 reads as one (a merged view of
    # their results/<METHOD>/ folders).
    by_dataset: dict[str, dict[Location, list[Instance]]] = {}
    for inst in insts:
        if _missing_out(inst, sec.notes):
            continue
        if not (inst.out / RESULTS).is_dir():
            sec.notes.append(f"{inst.name}: no results/ folder in {inst.out}")
            continue
        folder = location(inst.out.local_path().resolve()) if inst.out.is_local else inst.out
        by_dataset.setdefault(inst.dataset or "all", {}).setdefault(folder, []).append(inst)
    used = [i.name for folders in by_dataset.values() for group in folders.values() for i in group]
    sources = [f / RESULTS for folders in by_dataset.values() for f in folders]
    if by_dataset:
        tmp = Path(tempfile.mkdtemp(prefix="rexeval-report-"))
        try:
            runs = {}
            for k, (dataset, folders) in enumerate(by_dataset.items()):
                run = tmp / f"run-{k}"
                (run / RESULTS).mkdir(parents=True)
                taken: dict[str, Location] = {}  # method -> the folder Table 1 reads it from
                for folder, group in folders.items():
                    for d in (folder / RESULTS).iterdir():
                        if not (folder / PER_INTERACTION.format(method=d.name)).is_file():
                            continue
                        if d.name in taken:
                            sec.notes.append(f"{dataset}: method {d.name} is in more than one folder; Table 1 "
                                             f"shows the one of {taken[d.name]}, not {folder}")
                            continue
                        taken[d.name] = folder
                        _link_method(d, run / RESULTS / d.name)
                runs[dataset] = run
            df = table1(runs)
            md = markdown_tables(format_table1(df))[0]
            sec.tables.append(b.table(("table1-ranking",), "Table 1: statement ranking", md, sources=sources,
                                      instances=used))
            details = effect_details(df)
            if len(details):
                rows = [[md_text(r.dataset), md_text(r.method), md_text(r.level), md_text(r.metric),
                         md_text(r.baseline), f"{r.gain:+.5f}", f"{r.p:.3g}", r.stars if isinstance(r.stars, str)
                         and r.stars else "–", f"{r.cohens_d:+.3f}", f"{r.cliffs_delta:+.3f}", md_text(r.pairs)]
                        for r in details.itertuples()]
                sec.tables.append(b.table(("table1-effects",), "Effect sizes against the best popularity baseline",
                                          columns=["dataset", "method", "level", "metric", "baseline", "gain", "p",
                                                   "stars", "Cohen's d", "Cliff's delta", "pairs"], rows=rows,
                                          align=["left"] * 5 + ["right"] * 6, sources=sources, instances=used))
        except Exception as exc:  # noqa: BLE001  (a results folder of another layout)
            sec.notes.append(f"Table 1 could not be built from {', '.join(map(str, sources))}: "
                             f"{type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for inst in insts:
        if inst.out is None or not inst.out.is_dir():
            continue
        if inst.job == "star_train":
            name = _train_name(inst.settings)
            path = inst.out / STAR_TRAIN_OUTPUTS.report.format(name=name)
            rep = b.reader.json(path, sec.notes, "the training run")
            if isinstance(rep, dict):
                best = rep.get("best") or {}
                rows = [["best settings", md_text(json.dumps(best.get("config")) if best.get("config") else
                                                  "single configuration")],
                        ["best epoch", md_text(best.get("epoch"))]]
                rows += [[md_text(k), md_text(v)] for k, v in best.items()
                         if k not in ("config", "epoch", "checkpoint") and isinstance(v, (int, float))]
                for run in rep.get("runs") or []:  # `--seeds N`: each seed's best (Table 1 shows their mean)
                    rb = run.get("best") or {}
                    vals = [f"{k} {v:.4f}" for k, v in rb.items() if isinstance(v, float)]
                    rows.append([md_text(f"run seed {run.get('seed')}"),
                                 md_text(", ".join([f"epoch {rb.get('epoch')}", *vals]))])
                rows += [["trials", md_text(len(rep.get("trials") or []))],
                         ["trials with errors", md_text(rep.get("trial_errors"))],
                         ["seconds", md_text(rep.get("seconds"))]]
                sec.tables.append(b.table((inst.name, "training"), f"Training ({inst.name}, {name})",
                                          columns=["", "value"], rows=rows, align=["left", "right"],
                                          sources=[path], instances=[inst.name]))
                if rep.get("trial_errors"):
                    sec.notes.append(f"{inst.name}: {rep['trial_errors']} Tune trial(s) ended with an error")
            sens = inst.out / STAR_TRAIN_OUTPUTS.sensitivity.format(name=name)
            if sens.exists():
                f = b.figure((inst.name, "sensitivity"), f"Sensitivity of {name} (seed 002, Figure 3 style)", sens,
                             sec.notes, [inst.name])
                if f:
                    sec.figures.append(f)
    return [sec]


# ------------------------------------------------------------------ judges


def _judge_section(b: Builder, inst: Instance, title: str, intro: str, md_name: str, what: str,
                   table_title: str) -> tuple[Section, dict | None]:
    """A judge job's section: the tables of its Markdown `md_name`, its counts and LLM
    usage from its report (the same file for every judge job)."""
    sec = Section(b.key("sec", inst.name), f"{title}: {inst.name}", inst.job, [inst.name], intro=intro)
    if _missing_out(inst, sec.notes):
        return sec, None
    report_file = inst.out / JUDGE_REPORT
    report = b.reader.json(report_file, sec.notes, "counts and usage")
    sec.tables += b.md_file_tables(inst, inst.out / md_name, sec.notes, f"{table_title} ({inst.name})", what)
    if isinstance(report, dict):
        counts = {k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        usage = report.get("usage") if isinstance(report.get("usage"), dict) else {}
        rows = []
        for name, u in ([("", usage)] if "calls" in usage else usage.items()):
            if isinstance(u, dict) and "calls" in u:
                rows.append([md_text(u.get("model") or name), md_text(u.get("calls")), md_text(u.get("cached_calls")),
                             md_text(u.get("prompt_tokens")), md_text(u.get("completion_tokens")),
                             md_text(u.get("seconds")), md_text(u.get("unparseable")), md_text(u.get("cost_usd"))])
        t = b.counts_table(inst, counts, report_file)
        if t:
            sec.tables.append(t)
        if rows:
            sec.tables.append(b.table((inst.name, "usage"), f"LLM usage ({inst.name})",
                                      columns=["model", "calls", "cached", "prompt tokens", "completion tokens",
                                               "seconds", "unreadable", "cost (USD)"], rows=rows,
                                      align=["left"] + ["right"] * 7, sources=[report_file],
                                      instances=[inst.name]))
        if isinstance(report.get("usage_disc"), dict):  # a reward model judged too: seed 004 Table 3
            from rexeval.pipelines.judge.cost import COST_COLUMNS, cost_note, cost_rows

            # pairwise.md holds the same table: keep the one built from report.json, renumber the rest
            sec.tables = [x for x in sec.tables if x.columns != COST_COLUMNS]
            from_md = [x for x in sec.tables if x.sources == [str(inst.out / md_name)]]
            for k, x in enumerate(from_md, 1):
                x.title = f"{table_title} ({inst.name})" + (f" ({k}/{len(from_md)})" if len(from_md) > 1 else "")
            sec.tables.append(b.table((inst.name, "cost"), f"Judge cost, tokens vs GPU-hours ({inst.name})",
                                      columns=COST_COLUMNS, rows=[[md_text(c) for c in r] for r in cost_rows(report)],
                                      align=["left", "left"] + ["right"] * 5, note=md_text(cost_note(report)),
                                      sources=[report_file], instances=[inst.name]))
    return sec, report if isinstance(report, dict) else None


def section_likert(b: Builder, inst: Instance) -> Section:
    sec, _ = _judge_section(b, inst, "Likert ratings (seed 001)",
                            "Mean 1–5 score per judge, system and aspect (unreadable answers left out and "
                            "counted; `rexeval judge likert`).", LIKERT_OUTPUTS.table, "the means", "Likert means")
    return sec


def section_pairwise(b: Builder, inst: Instance) -> Section:
    sec, _ = _judge_section(b, inst, "Pairwise verdicts (seed 004)",
                            "Win / tie / loss shares of each system against the baseline, per evaluator, and "
                            "the LLM judge's position bias (`rexeval judge pairwise`).", PAIRWISE_OUTPUTS.table,
                            "win rates", "Pairwise win rates")
    return sec


def section_detect(b: Builder, inst: Instance) -> Section:
    sec, _ = _judge_section(b, inst, "Inferior-explanation detection (seed 004, Table 1)",
                            "Accuracy per condition: how often the evaluator preferred the good explanation "
                            "(random = 0.5; `rexeval judge detect`).", DETECT_OUTPUTS.table, "Table 1",
                            "Table 1: detection accuracy")
    return sec


def section_winrate(b: Builder, inst: Instance) -> Section:
    sec = Section(b.key("sec", inst.name), f"Win rates (seed 004, Figure 5 and Table 4): {inst.name}", inst.job,
                  [inst.name], intro="Shares of pairs each system won, lost and tied against the baseline, with "
                                     "percentile bootstrap intervals over the pairs (`rexeval judge winrate`).")
    if _missing_out(inst, sec.notes):
        return sec
    folder = inst.out
    report = b.reader.json(folder / WINRATE.report, sec.notes, "counts and settings")
    sec.tables += b.md_file_tables(inst, folder / WINRATE.figure5_md, sec.notes, f"Figure 5 as a table ({inst.name})",
                                   "Figure 5's numbers")
    sec.tables += b.md_file_tables(inst, folder / WINRATE.table4, sec.notes, f"Table 4: win rate per criterion "
                                   f"({inst.name})", "Table 4")
    if (folder / WINRATE.table6).exists():  # written with `repeats`: the judge against itself
        sec.tables += b.md_file_tables(inst, folder / WINRATE.table6, sec.notes, f"Table 6: the judge's agreement "
                                       f"with itself over runs ({inst.name})", "Table 6")
    png, svg = folder / WINRATE.figure5, folder / WINRATE.figure5_svg
    path = png if png.exists() else svg if svg.exists() else None
    if path is None:
        sec.notes.append(f"missing {WINRATE.figure5} / {WINRATE.figure5_svg} (Figure 5): {folder}")
    else:
        f = b.figure((inst.name, "figure5"), f"Figure 5: win rate against the baseline ({inst.name})", path,
                     sec.notes, [inst.name])
        if f:
            sec.figures.append(f)
    if isinstance(report, dict):
        t = b.counts_table(inst, report.get("counts") or {}, folder / WINRATE.report)
        if t:
            sec.tables.append(t)
    return sec


def section_meta_evaluate(b: Builder, inst: Instance) -> Section:
    sec = Section(b.key("sec", inst.name), f"Meta-evaluation: {inst.name}", inst.job, [inst.name])
    if _missing_out(inst, sec.notes):
        return sec
    folder = inst.out
    report = b.reader.json(folder / META.report, sec.notes, "mode and counts")
    mode = report.get("mode") if isinstance(report, dict) else None
    if mode == "pairwise":
        sec.title = f"Agreement with human verdicts (seed 004, Table 2): {inst.name}"
        first = "Table 2: agreement with human verdicts"
    else:
        sec.title = f"Correlation with human ratings (seed 001, Table 1): {inst.name}"
        first = "Table 1: correlation with human ratings (×100)"
    sec.intro = ("`rexeval meta-evaluate`; the second table gives every cell with its bootstrap 95% interval and "
                 "the rows or groups it rests on.")
    text = b.reader.text(folder / META.table, sec.notes, "the tables")
    for k, md in enumerate(markdown_tables(text or "")):
        title = first if k == 0 else ("Every cell, with its 95% interval" if md.heading == "Every cell" else
                                      md.heading or f"table {k + 1}")
        sec.tables.append(b.table((inst.name, "meta", str(k + 1)), f"{title} ({inst.name})", md,
                                  sources=[folder / META.table], instances=[inst.name]))
    if isinstance(report, dict) and isinstance(report.get("ensemble_sweep"), dict):  # --ensemble-sweep
        sweep_md = b.reader.text(folder / META.sweep_table, sec.notes, "the ensemble sweep")
        found = markdown_tables(sweep_md or "")
        if found:  # the first table only (mean [min, max] per N); every cell stays in the file
            sec.tables.append(b.table((inst.name, "ensemble"), f"Figure 4 as a table: ensemble size ({inst.name})",
                                      found[0], sources=[folder / META.sweep_table, folder / META.sweep],
                                      instances=[inst.name]))
        png = folder / META.sweep_figure
        if png.is_file():
            fig = b.figure((inst.name, "ensemble"), f"Figure 4: correlation against ensemble size ({inst.name})",
                           png, sec.notes, [inst.name])
            if fig:
                sec.figures.append(fig)
        else:
            sec.notes.append(f"missing {META.sweep_figure} (Figure 4): {folder}")
    if isinstance(report, dict):
        t = b.counts_table(inst, report.get("counts") or {}, folder / META.report)
        if t:
            sec.tables.append(t)
        n_err = (report.get("counts") or {}).get("errors")
        if n_err:
            sec.notes.append(f"{n_err} row(s) or value(s) could not be used; see {folder / META.errors}")
    return sec


# ------------------------------------------------------------------ per-job dispatch


GENERIC_TITLES = {
    "ingest": ("Ingested reviews", "Reviews read and rows rejected (`rexeval ingest`)."),
    "split": ("Split", "k-core and temporal split (`rexeval split`)."),
    "extract": ("Statement extraction", "Statements extracted from the reviews (`rexeval extract`)."),
    "ground_truth": ("Ground truth", "Rule-based reference explanations (`rexeval ground-truth`)."),
    "extract_quality": ("Extraction quality (seed 002, Table 2)",
                        "Share of explanatory and atomic statements by the judge (`rexeval extract-quality`)."),
    "generate_train": ("Generator training", "A seed 000 generator trained on Ray Tune (`rexeval generate train`)."),
    "generate_run": ("Generated explanations", "A trained generator decoding a split (`rexeval generate run`)."),
    "generate_llm": ("Prompted explanations (seed 004)", "Prompted generators (`rexeval generate llm`)."),
    "expscore_train": ("ExpScore training (seed 003)", "`rexeval expscore train`."),
    "expscore_score": ("ExpScore scores (seed 003)", "`rexeval expscore score`."),
}
# The tables of a generic job's own Markdown, by (job, file).
MD_TITLES = {("extract_quality", QUALITY_OUTPUTS.report_md): "Table 2: extraction quality",
             ("expscore_train", EXPSCORE_TRAIN_OUTPUTS.report_md): "ExpScore against human ratings",
             ("expscore_score", EXPSCORE_SCORE_OUTPUTS.report_md): "ExpScore against human ratings",
             ("generate_llm", PROMPTED_OUTPUTS.table): "Explanations and errors per method"}
PER_INSTANCE = {"evaluate": section_evaluate, "judge_likert": section_likert, "judge_pairwise": section_pairwise,
                "judge_detect": section_detect, "judge_winrate": section_winrate,
                "meta_evaluate": section_meta_evaluate}
COMBINED = {"stats": section_stats, "cluster": section_cluster, "star_build": section_star_build,
            "star_baselines": section_star_ranking}


def _safe(b: Builder, fn, *args, title: str, job: str, instances: list[str]) -> list[Section]:
    """A section builder that cannot sink the report: its error becomes a note."""
    try:
        got = fn(b, *args)
    except Exception as exc:  # noqa: BLE001
        sec = Section(b.key("sec", title), title, job, instances)
        sec.notes.append(f"this section could not be built: {type(exc).__name__}: {exc}")
        return [sec]
    return got if isinstance(got, list) else [got]


