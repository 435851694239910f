"""The evaluation job: explanations + references in, per-example scores, aggregates
and seed 000's tables out.

1. Inputs become one EXAMPLES table (`pipelines.evaluate.inputs`); rows that cannot be
   scored go to `errors.parquet` with the reason. With `extract`, the extraction stage
   (`rexeval extract`, seed 000 triplets) first writes the statements of the systems
   that came without them.
2. Each metric family (`pipelines.evaluate.families`) whose models are available runs
   as a Ray Data job over chunks of examples: an actor pool loads the family's model
   once per actor and writes each chunk's long-format scores as a shard, so a re-run
   resumes at the first unfinished chunk (and a family whose settings changed is
   recomputed alone).
3. The NLI families call the NLI Serve deployment: the one named by `nli_service`, or
   one this job starts on its Ray cluster (and stops at the end) when none is running.
4. One worker task gathers the families' shards into scores.parquet, aggregates them
   (mean, population std, n, bootstrap interval; plus the corpus-level metrics) and,
   from the files just written, computes the Kendall tau between every pair of metrics
   (`pipelines.evaluate.correlations`); only the aggregates come back, from which the
   driver writes the tables, Figure 2 and the report.

The output folder and every input may be a local path or a URI: all reads and writes go
through `rexeval/storage.py`, and a shard counts only once its marker is there.

Families that cannot run (no model for a role in the profile, missing data, no
statement sets for a system) are listed in the report with the reason; no other model
stands in for a missing one.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.evaluate.config import EVALUATE_OUTPUTS, EvaluateConfig
from rexeval.pipelines.evaluate.families import (FAMILIES, EvalContext, Family, corpus_scores,
                                                 asked_metrics, references_needed, select_families)
from rexeval.pipelines.evaluate.inputs import (
    EXAMPLES,
    build_examples,
    input_warnings,
    reference_kind,
    systems_of,
)
from rexeval.pipelines.core.inputs import read_explanation_rows, resolved_text
from rexeval.pipelines.core.io import ShardedOutput, read_table, write_json_atomic, write_parquet_atomic
from rexeval.pipelines.core.schema import EXPLANATION_STATEMENTS, SCORE_AGGREGATES, SCORES, validate_table
from rexeval.pipelines.core.sharded import ShardedJob, shard_line
from rexeval.pipelines.core.stage import Resources, Stage, worker_resources
from rexeval.storage import Location, PathLike, location

JOB = "evaluate"


# ------------------------------------------------------------------ selection


def missing_roles(cls: type[Family], profile, nli_remote: bool) -> list[str]:
    roles = [r for r in cls.roles if not (r == "nli" and cls.uses_nli and nli_remote)]
    return [r for r in roles if profile.ref(r) is None]


def role_reason(profile, roles: list[str]) -> str:
    notes = [f"{r}: {profile.notes[r]}" if r in profile.notes else f"{r}: not set" for r in roles]
    return (f"profile {profile.name!r} has no model for " + "; ".join(notes)
            + " (pass --model " + " --model ".join(f"{r}=PATH" for r in roles) + ")")


def statement_gaps(examples: pa.Table) -> dict[str, str]:
    """Systems whose statement sets are unknown, with why."""
    gaps = {}
    gen_null = pc.is_null(examples.column("gen_sentences")).to_numpy(zero_copy_only=False)
    ref_null = pc.is_null(examples.column("ref_sentences")).to_numpy(zero_copy_only=False)
    sys = np.asarray(examples.column("system").to_pylist(), dtype=object)
    for s in systems_of(examples):
        m = sys == s
        if ref_null[m].all():
            gaps[s] = "no reference statements (pass --references: a ground-truth job folder)"
        elif gen_null[m].all():
            gaps[s] = (f"no statements for system {s!r} (pass --statements FILE, or --extract to run "
                       "the extraction stage on its explanations)")
    return gaps


# ------------------------------------------------------------------ running


class FamilyStage(Stage):
    """Scores chunks of examples for one family and writes each chunk as a shard."""

    batch_size = 1

    def __init__(self, family: type[Family], ctx: EvalContext, examples_path: str, rows: np.ndarray,
                 chunk: int, output: ShardedOutput, resources: Resources):
        self.family, self.ctx, self.examples_path = family, ctx, examples_path
        self.rows, self.chunk, self.output, self.resources = rows, chunk, output, resources
        self.name = f"evaluate:{family.name}"

    def setup(self) -> None:
        from rexeval.pipelines.core.stage import use_cpus

        use_cpus(self.resources)
        self.impl = self.family(self.ctx)
        self.impl.setup()
        self.examples = read_table(self.examples_path, EXAMPLES)

    def process(self, batch: pa.Table) -> pa.Table:
        out = []
        for shard in batch.column("shard").to_pylist():
            rows = self.rows[shard * self.chunk:(shard + 1) * self.chunk]
            part = self.examples.take(pa.array(rows))
            cols = {c: part.column(c).to_pylist() for c in part.column_names}
            values, counts = self.impl.score(cols)
            table = long_scores(cols["example_id"], cols["system"], values, self.family.metrics())
            counts = {"examples": part.num_rows, **{k: v for k, v in counts.items() if k != "n_examples"}}
            self.output.write_shard(shard, {"scores": table}, counts)
            out.append({"shard": shard, "examples": part.num_rows, "counts": json.dumps(counts)})
        return pa.Table.from_pylist(out)


def long_scores(example_ids: list[str], systems: list[str], values: dict[str, np.ndarray],
                metrics: tuple[str, ...]) -> pa.Table:
    """Per-example values -> SCORES rows (example, system, metric, value), metric order kept."""
    n = len(example_ids)
    names = [m for m in metrics if m in values]
    for m in names:
        if len(values[m]) != n:
            raise ValueError(f"metric {m} returned {len(values[m])} values for {n} examples")
    return pa.table({
        "example_id": pa.array(example_ids * len(names), pa.string()),
        "system": pa.array(systems * len(names), pa.string()),
        "metric": pa.array([m for m in names for _ in range(n)], pa.string()),
        "value": pa.array(np.concatenate([np.asarray(values[m], dtype=np.float64) for m in names])
                          if names else np.zeros(0), pa.float64()),
    }, schema=SCORES)


def _hash_file(path: PathLike) -> str:
    h = hashlib.blake2b(digest_size=16)
    with location(path).open_input() as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _family_resources(cls: type[Family], cfg: EvaluateConfig) -> Resources:
    """NLI and model-free families: one CPU per actor. Model families: the CPUs free now
    (a running Serve replica may hold some) shared by `workers` actors. (LLM families
    stream instead: `_run_family_streamed`.)"""
    if cls.uses_nli or not cls.roles:
        return Resources(cpus=1)
    return worker_resources(cfg, free=True)


def _file_info(paths) -> list[dict]:
    return [{"path": resolved_text(p), "size": _size(location(p))} for p in paths]


def _size(loc: Location) -> int:
    """Bytes in a file, or in every file below a folder (one listing, not one request a file)."""
    import pyarrow.fs as pafs

    if not loc.is_dir():
        return loc.size()
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True))
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


class NLIService:
    """The NLI scorer the job's families call; starts a deployment when asked to."""

    def __init__(self, cfg: EvaluateConfig, profile, progress):
        from rexeval.serve.common import AppLease
        from rexeval.serve.nli import APP_NAME

        self.cfg, self.profile, self.progress = cfg, profile, progress
        self.lease = AppLease(APP_NAME, "NLI", progress)

    def address(self) -> str:
        s = self.cfg.nli_service
        if s == "none" or s.startswith(("http://", "https://", "serve:")):
            return s
        from rexeval.serve.common import idle_to_zero
        from rexeval.serve.nli import NLIServeConfig, start_nli_service

        ref = self.profile.require("nli")
        serve_cfg = idle_to_zero(NLIServeConfig(model=ref, scorer=self.cfg.nli_scorer, device=self.cfg.device,
                                                max_replicas=self.cfg.nli_replicas, num_gpus=self.cfg.nli_gpus))
        return self.lease.acquire(lambda: start_nli_service(serve_cfg, port=self.cfg.serve_port), ref,
                                  f"127.0.0.1:{self.cfg.serve_port}")

    def stop(self) -> None:
        """Leave the cluster as the job found it (see `serve.common.AppLease`)."""
        self.lease.release()


def evaluation_task(cfg: EvaluateConfig) -> str:
    """"review" (seed 000's Table VII: generators trained on the reviews, scored against
    them) or "explanation" (Tables III-VI); see `EvaluateConfig.task`."""
    if cfg.task != "auto":
        return cfg.task
    if cfg.references:  # a ground truth: the references are explanations
        return "explanation"
    return reference_kind(cfg.explanations) or "explanation"


def run_evaluate(cfg: EvaluateConfig, overwrite: bool = False,
                 progress: Callable[[str], None] = print) -> dict:
    """Run the job end to end (resuming) and return its report."""
    from rexeval.models.profiles import load_profile
    from rexeval.models.refs import NodeModels

    t0 = time.time()
    profile = load_profile(cfg.profile, cfg.models)
    root = location(cfg.out)
    explanations, origins = read_explanation_rows(cfg.explanations, cfg.columns)
    task = evaluation_task(cfg)
    conf = {"explanations": _file_info(cfg.explanations),
            "references": _file_info([cfg.references]) if cfg.references else None,
            "statements": _file_info(cfg.statements), "extract": cfg.extract, "domain": cfg.domain,
            "systems": cfg.systems, "limit": cfg.limit}
    statement_files = list(cfg.statements)
    families = select_families(cfg.metrics, cfg.skip)
    # An explanation without a reference is an error row unless no metric asked compares with one.
    need_refs = references_needed(families, asked_metrics(cfg.metrics))
    # Every input read (and so checked) before the output is opened: --overwrite removes
    # an earlier evaluation only once this one can start. With --extract the examples
    # are built again below, with the statements the extraction found.
    examples, errors, counts = build_examples(explanations, cfg.references, statement_files, cfg.limit,
                                              cfg.systems, origins=origins, columns=cfg.columns,
                                              require_reference=need_refs)
    top = ShardedOutput(root, JOB, conf, [], owns=EVALUATE_OUTPUTS.paths()).open(overwrite=overwrite)
    extract_errors = None
    if cfg.extract:
        path, extract_errors, extracted = extract_statements(cfg, explanations, statement_files,
                                                             root / EVALUATE_OUTPUTS.extract, progress, origins)
        if path:
            statement_files.append(path)
        examples, errors, counts = build_examples(explanations, cfg.references, statement_files, cfg.limit,
                                                  cfg.systems, known_systems=extracted, origins=origins,
                                                  columns=cfg.columns, require_reference=need_refs)
    if extract_errors is not None and extract_errors.num_rows:
        errors = pa.concat_tables([errors, extract_errors])
    write_parquet_atomic(root / EVALUATE_OUTPUTS.examples, examples)
    write_parquet_atomic(root / EVALUATE_OUTPUTS.errors, errors)
    systems = systems_of(examples)
    progress(f"evaluate: {examples.num_rows} example(s) of {len(systems)} system(s) "
             f"({', '.join(systems)}); {errors.num_rows} error row(s) -> {root}")
    warnings = input_warnings(errors)
    for w in warnings:
        progress(f"  warning: {w}")
    if task == "review":
        progress("  references: the reviews themselves (review generation): text similarity is seed 000's Table VII")
    if counts.get("without_reference"):
        progress(f"  references: {counts['without_reference']} example(s) have none; the metrics asked compare "
                 "with none, so they are scored")

    gaps = statement_gaps(examples)
    remote = cfg.nli_service.startswith(("http://", "https://", "serve:"))
    skipped: dict[str, str] = {}
    partial: dict[str, dict[str, str]] = {}
    plan: list[tuple[type[Family], np.ndarray]] = []
    sys_col = np.asarray(examples.column("system").to_pylist(), dtype=object)
    for name in families:
        if name == "corpus":
            continue
        cls = FAMILIES[name]
        miss = missing_roles(cls, profile, remote)
        why = role_reason(profile, miss) if miss else cls.unavailable(EvalContext())
        if why:
            skipped[name] = why
            continue
        ok = np.ones(len(sys_col), dtype=bool)
        if cls.needs_statements and gaps:
            partial[name] = {s: gaps[s] for s in systems if s in gaps}
            ok = ~np.isin(sys_col, list(gaps))
            if not ok.any():
                skipped[name] = "; ".join(f"{s}: {w}" for s, w in partial.pop(name).items())
                continue
        plan.append((cls, np.flatnonzero(ok)))

    needed = {r for cls, _ in plan for r in cls.roles if not (r == "nli" and cls.uses_nli and remote)}
    refs = {r: profile.ref(r) for r in needed}
    # A model URI stays one: each actor copies it on its node; a missing path names its role.
    locations = NodeModels({r: profile.shipped(r) for r in needed})
    llm = {}
    if any(cls.uses_llm for cls, _ in plan):
        c = cfg.with_resolved_cache(cfg.out)
        llm = {"backend": cfg.backend or profile.llm_backend, "model": refs["judge_llm"],
               "options": dict(cfg.backend_options), "cache": c.cache_path(), "max_retries": cfg.max_retries}
        from rexeval.models.llm.base import check_model_here

        check_model_here(llm["backend"], llm["model"])
    vocab = tuple(sorted({t for ts in examples.column("ref_topics").to_pylist() for t in (ts or [])}))
    from rexeval.models.encoders.embedder import resolve_device

    ctx = EvalContext(locations=locations, refs=refs, bertscore_num_layers=profile.bertscore_num_layers,
                      questeval_bertscore_num_layers=profile.questeval_bertscore_num_layers,
                      device=resolve_device(cfg.device), empty=cfg.empty, unparseable=cfg.unparseable,
                      st2exp_population=cfg.st2exp_population,
                      nli_scorer=cfg.nli_scorer, feature_vocabulary=vocab, llm=llm,
                      only=asked_metrics(cfg.metrics))
    service = NLIService(cfg, profile, progress)
    examples_hash = _hash_file(root / EVALUATE_OUTPUTS.examples)
    family_counts: dict[str, dict] = {}
    # Families that call the NLI service run last, so the deployment's replica does
    # not hold CPUs the other families' actor pools wait for.
    plan.sort(key=lambda p: p[0].uses_nli)
    nli_error: Exception | None = None
    try:
        for cls, rows in plan:
            try:
                if cls.uses_nli and nli_error is not None:
                    raise nli_error
                if (cls.uses_nli and ctx.nli_service == "none" and cfg.nli_service != "none"
                        and not family_done(root, cls, family_config(cls, ctx, cfg, rows, examples_hash))):
                    try:
                        ctx.nli_service = service.address()
                    except Exception as exc:  # noqa: BLE001  (reported for every NLI family)
                        nli_error = exc
                        raise
                family_counts[cls.name] = run_family(cls, ctx, cfg, root, rows, examples_hash, progress)
            except Exception as exc:  # noqa: BLE001  (one broken family must not sink the others)
                reason = failure_reason(exc)
                skipped[cls.name] = reason
                progress(f"  {cls.name}: {reason}")
    finally:
        service.stop()

    ran = [cls.name for cls, _ in plan if cls.name in family_counts]
    corpus = corpus_frame(corpus_rows(examples, vocab), ctx.only.get("corpus")) if "corpus" in families else None
    summary = on_worker(summarise, str(root), ran, corpus, cfg, ctx.only)
    agg, n_scores = summary["aggregates"], summary["scores"]
    from rexeval.pipelines.evaluate.report import plot_stent_bin, results_csv, results_markdown

    md = results_markdown(agg, dataset=cfg.dataset, systems=systems, task=task)
    (root / EVALUATE_OUTPUTS.tables_md).write_text(md)
    (root / EVALUATE_OUTPUTS.tables_csv).write_text(results_csv(agg, task=task))
    plot_stent_bin(agg, root / EVALUATE_OUTPUTS.figure2, dataset=cfg.dataset, systems=systems)
    report = {"counts": {**counts, "scores": n_scores}, "task": task,
              "families_run": ran, "skipped": skipped, "skipped_for_systems": partial,
              "family_counts": family_counts, "nli_service": ctx.nli_service,
              "models": refs, "warnings": warnings, "elapsed_s": round(time.time() - t0, 2)}
    write_json_atomic(root / EVALUATE_OUTPUTS.report, report)
    for line in summary["said"]:
        progress(line)
    top.finish(0, counts={**counts, "scores": n_scores})
    report["tables_md"] = md
    report["correlations_md"] = summary["correlations_md"]
    return report


def summarise(root: str, families: list[str], corpus: pd.DataFrame | None, cfg: EvaluateConfig,
              only: dict[str, tuple[str, ...]] | None = None) -> dict:
    """The families' shards -> scores.parquet, aggregates.parquet (with the corpus-level
    rows) and the metric agreement files (Kendall tau, rebuilt from the files just
    written). Runs where the shards are read (`on_worker`): only the aggregates, a few
    rows per system and metric, come back."""
    from rexeval.pipelines.evaluate.correlations import write_metric_correlations

    root = location(root)
    scores = collect_scores(root, families, only or {})
    write_parquet_atomic(root / EVALUATE_OUTPUTS.scores, scores)
    agg = aggregate(scores, cfg)
    if corpus is not None:
        agg = pd.concat([agg, corpus], ignore_index=True)
    agg_table = validate_table(pa.Table.from_pandas(agg, preserve_index=False), SCORE_AGGREGATES,
                               source="aggregates")
    write_parquet_atomic(root / EVALUATE_OUTPUTS.aggregates, agg_table)
    said: list[str] = []
    corr_md = write_metric_correlations(root, dataset=cfg.dataset, progress=said.append)
    return {"scores": scores.num_rows, "aggregates": agg, "correlations_md": corr_md, "said": said}


def on_worker(fn: Callable[..., dict], *args) -> dict:
    """`fn(*args)` as one Ray task when Ray runs (so a worker, not the driver, reads what
    the workers wrote), else here."""
    import ray

    if not ray.is_initialized():
        return fn(*args)
    return ray.get(ray.remote(num_cpus=1)(fn).remote(*args))


def family_config(cls: type[Family], ctx: EvalContext, cfg: EvaluateConfig, rows: np.ndarray,
                  examples_hash: str) -> dict:
    """What decides a family's results (its folder is recomputed when this changes)."""
    metrics = ctx.only.get(cls.name) if cls.computes_subset else None
    return {"family": cls.name, "metrics": list(metrics or cls.metrics()), "examples": examples_hash,
            "rows": hashlib.blake2b(rows.tobytes(), digest_size=8).hexdigest(),
            "models": {r: ctx.refs.get(r) for r in cls.roles},
            "empty": cfg.empty, "unparseable": cfg.unparseable, "chunk": cfg.chunk_size,
            "bertscore_num_layers": {"bertscore": ctx.bertscore_num_layers,
                                     "questeval": ctx.questeval_bertscore_num_layers}.get(cls.name),
            "nli_scorer": cfg.nli_scorer if cls.uses_nli else None,
            # Only St2Exp's own settings move (the other families' folders stay valid).
            **({"population": cfg.st2exp_population} if cls.name == "st2exp" else {}),
            "llm": {k: v for k, v in ctx.llm.items() if k != "cache"} if cls.uses_llm else None}


def family_done(root: Location, cls: type[Family], fconf: dict) -> bool:
    """A family whose folder is complete for these settings (then the NLI deployment
    need not start for it)."""
    from rexeval.pipelines.core.io import config_hash

    p = root / EVALUATE_OUTPUTS.families / cls.name / "manifest.json"
    if not p.exists():
        return False
    m = p.read_json()
    return m.get("status") == "complete" and m.get("config_hash") == config_hash(fconf)


def failure_reason(exc: BaseException) -> str:
    """One line for the report: the root error, not Ray's wrapper around it."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    root = next((ln for ln in reversed(lines) if ln.split(":", 1)[0].endswith(("Error", "Exception",
                                                                               "Unavailable"))), None)
    return "failed: " + (root or f"{type(exc).__name__}: {lines[0] if lines else ''}")[:400]


def run_family(cls: type[Family], ctx: EvalContext, cfg: EvaluateConfig, root: Location, rows: np.ndarray,
               examples_hash: str, progress) -> dict:
    """One family over its examples, chunk by chunk on Ray Data; finished chunks kept."""
    fconf = family_config(cls, ctx, cfg, rows, examples_hash)
    n_chunks = max(1, -(-len(rows) // cfg.chunk_size))
    # A family's folder holds derived results only: other settings replace them.
    job = ShardedJob(ShardedOutput(root / EVALUATE_OUTPUTS.families / cls.name, f"{JOB}:{cls.name}", fconf, ["scores"]),
                     n_chunks, overwrite=True, progress=progress)
    job.say_chunks(cls.name, f"{len(rows)} examples")
    if job.todo and cls.uses_llm:
        _run_family_streamed(cls, ctx, cfg, root, rows, examples_hash, job, n_chunks, progress)
    elif job.todo:
        res = _family_resources(cls, cfg)
        stage = FamilyStage(cls, ctx, str(root / EVALUATE_OUTPUTS.examples), rows, cfg.chunk_size, job.output, res)
        # Model families: `workers` actors (each loads the model); the others: as many
        # as the CPUs free now allow.
        job.run(stage, workers=cfg.workers if cls.roles else None, min_workers=cfg.min_workers,
                report=lambda row, k, n: shard_line(f"{row['shard'] + 1}/{n_chunks}", k, n, unit="chunk",
                                                   label=cls.name, indent="    "))
    return job.finish()["counts"]


class FamilyChunk:
    """One chunk of a family's examples, scored on a worker by the family itself with a
    stand-in for its LLM (`llm.calls.Recorder`: which questions, `Replayer`: the streamed
    answers), so an LLM family streams through `core.llm.stream` like any LLM job."""

    def __init__(self, family: type[Family], ctx: EvalContext, examples_path: str, examples_hash: str,
                 rows: np.ndarray, chunk: int, output: ShardedOutput):
        self.family, self.ctx, self.examples_path, self.examples_hash = family, ctx, examples_path, examples_hash
        self.rows, self.chunk, self.output = rows, chunk, output

    def columns(self, shard: int) -> dict[str, list]:
        from rexeval.pipelines.core.llm.stream import kept

        rows = self.rows[shard * self.chunk:(shard + 1) * self.chunk]
        examples = kept(("examples", self.examples_path, self.examples_hash),
                        lambda: read_table(self.examples_path, EXAMPLES))
        part = examples.take(pa.array(rows))
        return {c: part.column(c).to_pylist() for c in part.column_names}

    def scored(self, llm, cols: dict[str, list]):
        impl = self.family(self.ctx)
        impl.llm = llm  # in place of what `setup` would load
        return impl.score(cols)

    def questions(self, shard: int) -> pa.Table:
        import json

        from rexeval.pipelines.core.llm.calls import Recorder

        recorder = Recorder(self.ctx.llm["model"])
        self.scored(recorder, self.columns(shard))
        qs = [json.dumps(q) for q in recorder.questions.values()] or [None]
        return pa.table({"question": pa.array(qs, pa.string())})

    def write(self, shard: int, works: list[dict]) -> dict:
        from rexeval.pipelines.core.llm.calls import Replayer

        cols = self.columns(shard)
        values, counts = self.scored(Replayer(self.ctx.llm["model"], works), cols)
        table = long_scores(cols["example_id"], cols["system"], values, self.family.metrics())
        counts = {"examples": len(cols["example_id"]), **{k: v for k, v in counts.items() if k != "n_examples"}}
        self.output.write_shard(shard, {"scores": table}, counts)
        return counts


def _run_family_streamed(cls: type[Family], ctx: EvalContext, cfg: EvaluateConfig, root: Location,
                         rows: np.ndarray, examples_hash: str, job: ShardedJob, n_chunks: int,
                         progress) -> None:
    """An LLM family's chunks through the streaming LLM path (`core.llm.stream`), its calls
    against the backend's engines (`llm.calls_plan.job_plan`); raises AwaitingRerun
    when transport failures left chunks unwritten."""
    from rexeval.pipelines.core.llm.calls_plan import job_plan
    from rexeval.pipelines.core.llm.chunks import ChunkSteps
    from rexeval.pipelines.core.llm.stream import awaiting_line, retry_settings, run_stream, source_rows
    from rexeval.pipelines.core.runtime import init_ray

    init_ray()
    chunk = FamilyChunk(cls, ctx, str(root / EVALUATE_OUTPUTS.examples), examples_hash, rows, cfg.chunk_size,
                        job.output)
    plan = job_plan(cfg.with_resolved_cache(cfg.out), ctx.llm["backend"], ctx.llm["model"])
    done = [0]

    def on_shard(row: dict) -> None:
        if row["written"]:
            done[0] += 1
            progress(shard_line(f"{row['shard'] + 1}/{n_chunks}", done[0], len(job.todo), unit="chunk",
                                label=cls.name, indent="    "))

    summary = run_stream(source_rows(chunk.questions, sorted(job.todo)), ChunkSteps, {"llm": plan}, chunk.write,
                         label=cls.name, progress=progress, on_shard=on_shard,
                         **retry_settings(cfg.backend_options))
    job.engines = summary.engines  # the manifest's llm_engines
    if summary.awaiting:
        progress("  " + awaiting_line(summary, "verifier question(s)"))
        job.finish_partial(summary.awaiting, "verifier question(s)")  # raises AwaitingRerun


def collect_scores(root: Location, families: list[str], only: dict[str, tuple[str, ...]] | None = None) -> pa.Table:
    """The families' scores; of a family asked for some of its metrics by name
    (`only`), those metrics' rows alone."""
    parts = []
    for f in families:
        folder = root / EVALUATE_OUTPUTS.families / f / "scores"
        if folder.exists():
            part = read_table(folder, SCORES)
            if (only or {}).get(f):
                part = part.filter(pc.is_in(part.column("metric"), pa.array(list(only[f]))))
            parts.append(part)
    return pa.concat_tables(parts) if parts else SCORES.empty_table()


def aggregate(scores: pa.Table, cfg: EvaluateConfig) -> pd.DataFrame:
    from rexeval.metrics.aggregate import aggregate_scores

    df = scores.select(["system", "metric", "value"]).to_pandas()
    agg = aggregate_scores(df, confidence=cfg.confidence, n_resamples=cfg.bootstrap, seed=cfg.seed)
    agg["kind"] = "per_example"
    return agg


def corpus_rows(examples: pa.Table, vocab: tuple[str, ...]) -> dict[str, dict[str, float]]:
    out = {}
    sys = examples.column("system").to_pylist()
    expl, ref = examples.column("explanation").to_pylist(), examples.column("reference").to_pylist()
    for s in sorted(set(sys)):
        idx = [i for i, x in enumerate(sys) if x == s]
        out[s] = corpus_scores([expl[i] for i in idx], [ref[i] for i in idx], vocab) | {"_n": len(idx)}
    return out


def corpus_frame(corpus: dict[str, dict[str, float]], only: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The corpus-level rows of the aggregates (`only`: the corpus metrics asked by name)."""
    rows = [{"system": s, "metric": m, "mean": v, "std": np.nan, "n": vals["_n"], "n_missing": 0,
             "ci_low": np.nan, "ci_high": np.nan, "kind": "corpus"}
            for s, vals in corpus.items() for m, v in vals.items() if m != "_n" and (not only or m in only)]
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ extraction


def extract_statements(cfg: EvaluateConfig, explanations: pa.Table, statement_files: list[str], folder: Location,
                       progress, origins: list[tuple[str, int]] | None = None
                       ) -> tuple[str | None, pa.Table | None, list[str]]:
    """Run the extraction stage (seed 000 triplets) on the explanations of systems that
    have no statements yet; returns an EXPLANATION_STATEMENTS file and the stage's
    error rows. `origins` (file, 1-based row of each explanation) become the rows'
    source and line, so the stage's error rows point into the user's files."""
    from rexeval.pipelines.evaluate.inputs import read_statement_rows
    from rexeval.pipelines.extract.pipeline import ExtractConfig, run_extract

    have = {str(r["system"]) for _, _, r in read_statement_rows(statement_files, cfg.columns)}
    t = explanations
    if origins is None:
        origins = [("explanations", n) for n in range(1, t.num_rows + 1)]
    keep = [s not in have and (cfg.systems is None or s in cfg.systems) for s in t.column("system").to_pylist()]
    if cfg.limit is not None:
        seen: dict[str, int] = {}
        for i, s in enumerate(t.column("system").to_pylist()):
            if keep[i]:
                seen[s] = seen.get(s, 0) + 1
                keep[i] = seen[s] <= cfg.limit
    t = t.filter(pa.array(keep, pa.bool_()))
    origins = [o for o, k in zip(origins, keep) if k]
    if not t.num_rows:
        return None, None, []
    ids = [f"{s}::{e}" for s, e in zip(t.column("system").to_pylist(), t.column("example_id").to_pylist())]
    reviews = pa.table({"review_id": ids, "user_id": t.column("user_id"), "item_id": t.column("item_id"),
                        "rating": pa.array([0.0] * t.num_rows, pa.float32()),
                        "timestamp": pa.array([0] * t.num_rows, pa.int64()),
                        "text": t.column("explanation"), "category": pa.array([cfg.domain] * t.num_rows, pa.string()),
                        "source": pa.array([o[0] for o in origins], pa.string()),
                        "line": pa.array([o[1] for o in origins], pa.int64())})
    reviews = validate_table(reviews, "reviews", source="explanations")
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(folder / "explanations_as_reviews.parquet", reviews)
    progress(f"  extract: statements of {t.num_rows} explanation(s) with the extraction stage")
    fields = {k: getattr(cfg, k) for k in ("profile", "models", "backend", "backend_options", "max_retries",
                                           "workers", "min_workers", "cpus_per_worker", "gpus_per_worker",
                                           "memory_per_worker", "resources_per_worker",
                                           "cache", "use_cache")}
    run_extract(ExtractConfig(input=str(folder / "explanations_as_reviews.parquet"), out=str(folder / "run"),
                              method="triplets", domain=cfg.domain, **fields), progress=progress)
    st = read_table(folder / "run" / "statements", "statements")
    st = st.filter(pc.equal(st.column("stage"), "triplet"))
    keys = [r.split("::", 1) for r in st.column("review_id").to_pylist()]
    out = pa.table({"example_id": [k[1] for k in keys], "system": [k[0] for k in keys],
                    "statement": st.column("statement"), "topic": st.column("topic"),
                    "sentiment": st.column("sentiment")}, schema=EXPLANATION_STATEMENTS)
    write_parquet_atomic(folder / "statements.parquet", out)
    errors = read_table(folder / "run" / "errors", "errors") if (folder / "run" / "errors").exists() else None
    return str(folder / "statements.parquet"), errors, sorted(set(t.column("system").to_pylist()))
