"""`rexeval judge likert|pairwise|detect`: inputs, the chunked runs and the reports.

- likert (seed 001): each explanation rated 1-5 on the four aspects by one or more LLM
  judges; with several judges, their average (the ensemble) is added as one more judge.
- pairwise (seed 004, ALERT-Gen and/or ALERT-Disc): each system's explanation against
  the baseline system's for the same example, by the LLM judge and/or a reward model;
  win / loss / tie rates and the LLM judge's position-bias statistics
  (`pipelines.judge.winrate` turns the outputs into the win-rate study).
- detect (seed 004, section 4.2): an LLM writes a good explanation and deliberately
  worse ones for the same interactions; the judges must prefer the good one
  (accuracy per condition; a coin flip scores 0.5).

Inputs and `out` may be local paths or URIs (`rexeval/storage.py`): the driver
reads the inputs and writes the chunks' rows to `out`, the chunk actors read them from
there and commit their shards there (each with its marker last), and the driver reads
back the finished shards, never a worker's local disk.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.inputs import resolved_text
from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.storage import is_uri, location
from rexeval.pipelines.judge.config import (DETECT_OUTPUTS, LIKERT_OUTPUTS, PAIRWISE_OUTPUTS, DetectJobConfig,
                                            LikertJobConfig, PairwiseJobConfig)
from rexeval.pipelines.core.llm.chunks import llm_spec, run_chunks, usage_totals, write_report
from rexeval.pipelines.judge.evaluators import JudgeRun, evaluator, in_order, judge_service, pairwise_markdown
from rexeval.pipelines.judge.tasks import TASKS


# ------------------------------------------------------------------ helpers


def _profile(cfg):
    from rexeval.models.profiles import load_profile

    return load_profile(cfg.profile, cfg.models)


def _with_contexts(cfg, expl: pd.DataFrame, progress) -> tuple[pd.DataFrame, int]:
    from rexeval.pipelines.judge.inputs import attach_contexts, load_contexts

    ctx = load_contexts(cfg.contexts, cfg.reviews, expl, cfg.max_history, cfg.columns)
    if ctx is None:
        progress("  no --contexts or --reviews: judges see the item id only and no purchase history")
    return attach_contexts(expl, ctx)


def _frame(out, table: str) -> pd.DataFrame:
    return out.read(table).to_pandas()


# ------------------------------------------------------------------ likert


def run_likert(cfg: LikertJobConfig, progress: Callable[[str], None] = print) -> dict:
    from rexeval.pipelines.judge.inputs import explanations_frame
    from rexeval.pipelines.judge.likert import LikertConfig, count_fallbacks, ensemble

    t0 = time.time()
    root = location(cfg.out)
    profile = _profile(cfg)
    expl = explanations_frame(cfg.explanations, cfg.systems, cfg.limit, cfg.columns)
    rows, no_ctx = _with_contexts(cfg, expl, progress)
    rows = rows[["example_id", "system", "user_id", "item_id", "explanation", "item_description"]]
    judges = cfg.judges or [profile.require("judge_llm")]
    lcfg = LikertConfig(aspects=cfg.aspects or LikertConfig().aspects, mode=cfg.mode, shots=cfg.shots,
                        seed=cfg.seed, max_retries=cfg.max_retries, max_tokens=cfg.max_tokens,
                        constrained=cfg.constrained)
    examples = _examples(cfg, root) if cfg.shots != "zero" else {"examples": None}
    progress(f"judge likert: {len(rows)} explanation(s) of {rows['system'].nunique()} system(s), "
             f"{len(judges)} judge(s), aspects {', '.join(lcfg.aspects)} ({cfg.mode}, {cfg.shots}-shot)")
    parts, usage = [], {}
    for j, model in enumerate(judges):
        spec = llm_spec(cfg, profile, model=model)
        settings = {"likert": lcfg.model_dump(), **examples}
        out = judge_service(cfg, spec, progress, lambda addr, j=j, s=settings, sp=spec: run_chunks(
            "likert", TASKS.lookup("likert"), rows, root / LIKERT_OUTPUTS.judges / f"judge-{j}", ["likert"], s, sp, addr, cfg, progress))
        parts.append(_frame(out, "likert"))
        usage[spec["model"]] = usage_totals([out], cfg.price_table, spec["model"])
    scores = pd.concat(parts, ignore_index=True)
    fallbacks = int(count_fallbacks(scores)) if cfg.shots != "zero" else 0
    if len(judges) > 1:
        scores = pd.concat([scores, ensemble(scores, missing=cfg.ensemble_missing)], ignore_index=True)
    write_parquet_atomic(root / LIKERT_OUTPUTS.scores, pa.Table.from_pandas(scores, preserve_index=False))
    table = likert_table(scores)
    (root / LIKERT_OUTPUTS.table).write_text(table)
    report = {"job": "judge likert", "explanations": len(rows), "no_context": no_ctx,
              "one_shot_fallbacks": fallbacks,
              "unreadable": int(scores["score"].isna().sum()), "usage": usage,
              "total_cost_usd": _total_cost(usage), "elapsed_s": round(time.time() - t0, 2)}
    write_report(root, report)
    report["table_md"] = table
    return report


def _examples(cfg: LikertJobConfig, root) -> dict:
    """The one-shot pool as the chunks find it: `examples` names the user's file (what the
    chunks' configuration records); a local file with a URI output is also copied under
    the output (`examples_at`), since the chunk actors may run on nodes without that disk."""
    from rexeval.pipelines.core.io import told_format
    from rexeval.pipelines.judge.inputs import pool_columns, read_examples
    from rexeval.pipelines.judge.likert import ASPECTS

    given = resolved_text(cfg.examples)  # the config checked that examples are given
    aspects = cfg.aspects or list(ASPECTS)
    # The pool's entries of the mapping (one mapping serves every table); none: the key
    # stays out of the chunks' settings, as before the pool took any format.
    own = {ours: theirs for ours, theirs in cfg.columns.items() if ours in pool_columns(aspects)}
    read_examples(given, aspects, own)  # here, before any judge starts: a missing column is named now
    mapped = {"examples_columns": own} if own else {}
    if is_uri(given) or not is_uri(root):
        return {"examples": given, **mapped}
    # The copy keeps the file's format in its name (the readers tell the format by it).
    gz = ".gz" if given.lower().endswith(".gz") else ""
    staged = root / LIKERT_OUTPUTS.inputs / f"examples.{told_format(given, 'examples')}{gz}"
    staged.write_bytes(location(given).read_bytes())
    return {"examples": given, "examples_at": str(staged), **mapped}


def likert_table(scores: pd.DataFrame) -> str:
    """Mean score per judge and system (rows) and aspect (columns), unreadable left out."""
    g = scores.groupby(["judge", "system", "aspect"], sort=True)["score"]
    wide = g.mean().unstack("aspect")[list(dict.fromkeys(scores["aspect"]))]
    n_bad = scores["score"].isna().groupby([scores["judge"], scores["system"]]).sum()
    lines = ["| judge | system | " + " | ".join(wide.columns) + " | unreadable |",
             "|---|---|" + "---|" * (len(wide.columns) + 1)]
    for (judge, system), r in wide.iterrows():
        cells = ["–" if pd.isna(v) else f"{v:.2f}" for v in r]
        lines.append(f"| {judge} | {system} | " + " | ".join(cells) + f" | {int(n_bad.loc[(judge, system)])} |")
    return "\n".join(lines) + "\n"


def _total_cost(usage: dict) -> float | None:
    costs = [u.get("cost_usd") for u in usage.values()]
    return None if not costs or any(c is None for c in costs) else round(sum(costs), 6)


# ------------------------------------------------------------------ pairwise


PAIR_KEYS = ["pair_id", "system", "baseline", "example_id", "user_id", "item_id"]
"""The columns that name a pair in verdicts.parquet and verdicts_disc.parquet."""


def run_pairwise(cfg: PairwiseJobConfig, progress: Callable[[str], None] = print) -> dict:
    """Each system against the baseline, by the LLM judge (gen: verdicts.parquet,
    calls.parquet, position bias) and/or the reward model (disc: verdicts_disc.parquet);
    win rates of each in pairwise.md and report.json. With the reward model, report.json
    also holds its scoring time, GPUs and cost (`usage_disc`) and pairwise.md a table of
    what each judge cost (tokens vs GPU-hours, seed 004 Table 3)."""
    from rexeval.metrics.preference import win_rates
    from rexeval.pipelines.judge.inputs import baseline_pairs, explanations_frame

    t0 = time.time()
    root = location(cfg.out)
    evaluators = list(dict.fromkeys(cfg.evaluators))
    profile = _profile(cfg)
    systems = None if not cfg.systems else sorted(set(cfg.systems) | {cfg.baseline})
    expl = explanations_frame(cfg.explanations, systems, cfg.limit, cfg.columns)
    rows, no_ctx = _with_contexts(cfg, expl, progress)
    pairs, errors = baseline_pairs(rows, cfg.baseline)
    root.mkdir()
    write_parquet_atomic(root / PAIRWISE_OUTPUTS.errors, errors)
    progress(f"judge pairwise: {len(pairs)} pair(s) against baseline {cfg.baseline!r}, "
             f"{errors.num_rows} error row(s); evaluators {', '.join(evaluators)}")
    cols = ["pair_id", "user_profile", "item_description", "explanation_a", "explanation_b"]
    report = {"job": "judge pairwise", "pairs": len(pairs), "errors": errors.num_rows, "no_context": no_ctx,
              "evaluators": evaluators, "win_rates": [], "win_rates_per_criterion": {}, "position_bias": {},
              "usage": {}}
    md_parts = []
    run = JudgeRun(cfg, profile, root, "pairwise", progress)
    for ev in map(evaluator, in_order(evaluators)):
        judged = ev.judge(pairs[cols], run)
        verdicts = pairs[PAIR_KEYS].merge(judged.verdicts, on="pair_id", how="left")
        write_parquet_atomic(root / ev.verdicts_file, pa.Table.from_pandas(verdicts, preserve_index=False))
        if judged.detail is not None:
            write_parquet_atomic(root / ev.calls_file, pa.Table.from_pandas(judged.detail, preserve_index=False))
        wins = win_rates(verdicts)
        report.update(ev.report_fields(cfg, judged))
        report.update({f"win_rates{ev.tag}": wins.to_dict("records"),
                       f"win_rates_per_criterion{ev.tag}": _per_criterion(verdicts), f"usage{ev.tag}": judged.usage})
        md_parts.append(pairwise_markdown(wins, ev.position_bias(cfg, judged), cfg.baseline, judge=ev.who(cfg, judged)))
        md_parts += ev.notes(report)
    md = "\n".join(md_parts)
    (root / PAIRWISE_OUTPUTS.table).write_text(md)
    report["elapsed_s"] = round(time.time() - t0, 2)
    write_report(root, report)
    report["table_md"] = md
    return report


def _per_criterion(verdicts: pd.DataFrame) -> dict:
    from rexeval.metrics.preference import win_rates

    return {c[len("verdict_"):]: win_rates(verdicts, verdict_col=c).to_dict("records")
            for c in verdicts.columns if c.startswith("verdict_")}


# ------------------------------------------------------------------ detect


def detect_contexts(cfg: DetectJobConfig) -> pd.DataFrame:
    """The interactions to explain, with their contexts: the --interactions given, else
    every row of --contexts, else each user's latest purchase in --reviews (seed 004
    explains the most recent purchase); sorted, then the first --limit."""
    from rexeval.pipelines.core.inputs import given_text
    from rexeval.pipelines.judge.inputs import load_contexts, need_columns, read_contexts, read_frame, reviews_table

    if cfg.interactions:
        p = given_text(cfg.interactions)
        inter = read_frame(cfg.interactions, cfg.columns, ("user_id", "item_id"), "interactions")
        need_columns(inter, ("user_id", "item_id"), p, "interactions")
        contexts = load_contexts(cfg.contexts, cfg.reviews, inter[["user_id", "item_id"]].astype(str),
                                 cfg.max_history, cfg.columns)
        if cfg.contexts:
            contexts = contexts.merge(inter[["user_id", "item_id"]].astype(str), on=["user_id", "item_id"])
    elif cfg.contexts:
        contexts = read_contexts(cfg.contexts, cfg.columns)
    else:
        from rexeval.pipelines.core.context import build_contexts, last_interactions

        reviews = pd.concat([reviews_table(r, cfg.columns) for r in cfg.reviews], ignore_index=True)
        contexts = build_contexts(reviews, last_interactions(reviews), max_history=cfg.max_history)
    contexts = contexts.sort_values(["user_id", "item_id"]).reset_index(drop=True)
    return contexts.head(cfg.limit) if cfg.limit else contexts


def detect_suite(cfg: DetectJobConfig):
    """How the detection test's generator is asked: conditions, caps and sampling."""
    from rexeval.pipelines.judge.detect import ALL_CONDITIONS, DetectSuiteConfig

    return DetectSuiteConfig(conditions=cfg.conditions or list(ALL_CONDITIONS), seed=cfg.seed,
                             max_retries=cfg.max_retries, max_tokens=cfg.generation_max_tokens,
                             max_words=cfg.generation_max_words, temperature=cfg.generation_temperature)


def run_detect(cfg: DetectJobConfig, progress: Callable[[str], None] = print) -> dict:
    from rexeval.pipelines.judge.detect import detection_accuracy, judge_layout, plan_conditions

    t0 = time.time()
    root = location(cfg.out)
    profile = _profile(cfg)
    suite = detect_suite(cfg)
    contexts = detect_contexts(cfg)
    if not len(contexts):
        raise ValueError(f"judge detect: no interaction to explain in {cfg.contexts or ', '.join(cfg.reviews)}"
                         + (f" (with --interactions {cfg.interactions})" if cfg.interactions else "")
                         + ": give reviews or contexts that hold at least one user and item")
    # Planned once over every interaction, so replacement items and users are drawn from
    # the whole set; the chunks only generate.
    plan = plan_conditions(contexts, suite.conditions, suite.seed)
    progress(f"judge detect: {len(contexts)} interaction(s) x {len(suite.conditions)} condition(s); "
             f"evaluators {', '.join(cfg.evaluators)}")
    gen_spec = llm_spec(cfg, profile, role="llm", model=cfg.generator)
    gen = judge_service(cfg, gen_spec, progress, lambda addr: run_chunks(
        "detect_generate", TASKS.lookup("detect_generate"), plan, root / DETECT_OUTPUTS.generate, ["pairs", "errors"],
        {"generate": suite.model_dump()}, gen_spec, addr, cfg, progress))
    pairs = _frame(gen, "pairs")
    gen_errors = gen.read("errors")
    layout = judge_layout(pairs, seed=cfg.seed)
    cols = ["pair_id", "user_profile", "item_description", "explanation_a", "explanation_b"]
    results, usage = {}, {"generator": usage_totals([gen], cfg.price_table, gen_spec["model"])}
    usage_apart = {}  # what bills no tokens: its usage beside the LLMs' (usage_disc)
    run = JudgeRun(cfg, profile, root, "detect", progress)
    for name in in_order(cfg.evaluators):
        ev = evaluator(name)
        judged = ev.judge(layout[cols], run)
        results[name] = layout[["pair_id", "condition", "original_position"]].merge(
            judged.verdicts[["pair_id", "verdict"]], on="pair_id", how="left")
        if ev.bills_tokens:
            usage[name] = judged.usage
        else:
            usage_apart[f"usage{ev.tag}"] = judged.usage
    tables = {name: detection_accuracy(v) for name, v in results.items()}
    for name, v in results.items():
        write_parquet_atomic(root / DETECT_OUTPUTS.verdicts.format(evaluator=name), pa.Table.from_pandas(v, preserve_index=False))
    write_parquet_atomic(root / DETECT_OUTPUTS.pairs, pa.Table.from_pandas(pairs, preserve_index=False))
    write_parquet_atomic(root / DETECT_OUTPUTS.errors, gen_errors)
    md = detect_markdown(tables)
    (root / DETECT_OUTPUTS.table).write_text(md)
    report = {"job": "judge detect", "interactions": len(contexts), "pairs": len(pairs),
              "generation_errors": gen_errors.num_rows,
              "accuracy": {k: t.to_dict("records") for k, t in tables.items()}, "usage": usage,
              "elapsed_s": round(time.time() - t0, 2)}
    report.update(usage_apart)
    write_report(root, report)
    report["table_md"] = md
    return report


def detect_markdown(tables: dict[str, pd.DataFrame]) -> str:
    lines = []
    for name, t in tables.items():
        lines += [f"Inferior-explanation detection, evaluator `{name}` (accuracy; random = 0.5):", "",
                  "| condition | n | accuracy | ties | unreadable |", "|---|---|---|---|---|"]
        for r in t.to_dict("records"):
            acc = "–" if pd.isna(r["accuracy"]) else f"{r['accuracy']:.3f}"
            lines.append(f"| {r['condition']} | {r.get('n', '')} | {acc} | {r.get('ties', '')} | "
                         f"{r.get('unreadable', '')} |")
        lines.append("")
    return "\n".join(lines)
