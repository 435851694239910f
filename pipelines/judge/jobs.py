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

Inputs and `out` may be local paths or URIs (`pipelines/core/storage.py`): the driver
reads the inputs and writes the chunks' rows to `out`, the chunk actors read them from
there and commit their shards there (each with its marker last), and the driver reads
back the finished shards, never a worker's local disk.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.inputs import resolved_text
from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.storage import is_uri, location
from rexeval.pipelines.judge.config import (DETECT_OUTPUTS, LIKERT_OUTPUTS, PAIRWISE_OUTPUTS, DetectJobConfig,
                                            LikertJobConfig, PairwiseJobConfig)
from rexeval.pipelines.core.llm.chunks import JudgeService, llm_spec, run_chunks, usage_totals, write_report
from rexeval.pipelines.judge.cost import cost_markdown
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


def _judged(cfg, spec: dict, progress, work: Callable[[str], object]):
    """Run `work(address)` with the judge service up; the spec's model becomes the
    served model's id (what prices and provenance name)."""
    service = JudgeService(cfg, spec, progress)
    try:
        address = service.address()
        spec["model"] = service.model_id  # what the answers' rows name as their judge
        return work(address)
    finally:
        service.stop()


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
        out = _judged(cfg, spec, progress, lambda addr, j=j, s=settings, sp=spec: run_chunks(
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


def _pairwise_settings(cfg) -> dict:
    from rexeval.pipelines.judge.pairwise import PairwiseConfig

    return {"pairwise": PairwiseConfig(
        criteria=_rubric_ref(cfg.criteria), only=getattr(cfg, "only", None), divide=cfg.divide,
        both_orders=cfg.both_orders, disagreement=cfg.disagreement, max_retries=cfg.max_retries,
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=cfg.seed,
        constrained=cfg.constrained).model_dump()}


def _rubric_ref(ref: str) -> str:
    if is_uri(ref):
        return ref
    p = Path(ref).expanduser()
    return str(p.resolve()) if p.suffix in (".yaml", ".yml") else ref


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
    from rexeval.pipelines.judge.pairwise import order_bias

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
    if "gen" in evaluators:
        spec = llm_spec(cfg, profile)
        settings = _pairwise_settings(cfg)
        out = _judged(cfg, spec, progress, lambda addr: run_chunks(
            "pairwise", TASKS.lookup("pairwise"), pairs[cols], root / PAIRWISE_OUTPUTS.chunks, ["verdicts", "detail"], settings, spec, addr, cfg, progress))
        verdicts = pairs[PAIR_KEYS].merge(_frame(out, "verdicts"), on="pair_id", how="left")
        detail = _frame(out, "detail")
        write_parquet_atomic(root / PAIRWISE_OUTPUTS.verdicts, pa.Table.from_pandas(verdicts, preserve_index=False))
        write_parquet_atomic(root / PAIRWISE_OUTPUTS.calls, pa.Table.from_pandas(detail, preserve_index=False))
        wins = win_rates(verdicts)
        bias = order_bias(detail) if cfg.both_orders else {}
        usage = usage_totals([out], cfg.price_table, spec["model"])
        report.update(win_rates=wins.to_dict("records"), win_rates_per_criterion=_per_criterion(verdicts),
                      position_bias=bias, usage=usage)
        md_parts.append(pairwise_markdown(wins, bias, cfg.baseline, judge=f"LLM judge `{usage['model']}`"))
    if "disc" in evaluators:
        disc_verdicts, disc_usage = _disc_verdicts(cfg, pairs[cols], progress)
        disc = pairs[PAIR_KEYS].merge(disc_verdicts, on="pair_id", how="left")
        verdict_cols = ["verdict"] + [c for c in disc.columns if c.startswith("verdict_")]
        disc = disc[PAIR_KEYS + verdict_cols + [c for c in disc.columns if c not in PAIR_KEYS + verdict_cols]]
        write_parquet_atomic(root / PAIRWISE_OUTPUTS.verdicts_disc, pa.Table.from_pandas(disc, preserve_index=False))
        wins = win_rates(disc)
        report.update(reward_model=cfg.reward_model, win_rates_disc=wins.to_dict("records"),
                      win_rates_per_criterion_disc=_per_criterion(disc), usage_disc=disc_usage)
        md_parts.append(pairwise_markdown(wins, {}, cfg.baseline, judge=f"reward model `{cfg.reward_model}`"))
        md_parts.append(cost_markdown(report))
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


def pairwise_markdown(wins: pd.DataFrame, bias: dict, baseline: str, judge: str | None = None) -> str:
    by = f" by the {judge}" if judge else ""
    lines = [f"Win rates against the baseline `{baseline}`{by} (ties and losses beside):", "",
             "| system | n | win | tie | loss | win (ties ½) | unreadable |", "|---|---|---|---|---|---|---|"]
    for r in wins.itertuples(index=False):
        lines.append(f"| {r.system} | {r.n} | {r.win_rate:.1%} | {r.tie_rate:.1%} | {r.loss_rate:.1%} | "
                     f"{r.win_rate_half_ties:.1%} | {r.unreadable} |")
    if bias:
        lines += ["", "Position bias (pairs asked in both orders):", "",
                  "| criterion | pairs | verdict flipped with the order | first shown chosen |", "|---|---|---|---|"]
        for unit, b in bias.items():
            lines.append(f"| {unit} | {b['pairs_both_orders']} | {b['flip_rate']:.1%} | {b['first_slot_rate']:.1%} |")
    return "\n".join(lines) + "\n"


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
    gen = _judged(cfg, gen_spec, progress, lambda addr: run_chunks(
        "detect_generate", TASKS.lookup("detect_generate"), plan, root / DETECT_OUTPUTS.generate, ["pairs", "errors"],
        {"generate": suite.model_dump()}, gen_spec, addr, cfg, progress))
    pairs = _frame(gen, "pairs")
    gen_errors = gen.read("errors")
    layout = judge_layout(pairs, seed=cfg.seed)
    cols = ["pair_id", "user_profile", "item_description", "explanation_a", "explanation_b"]
    results, usage = {}, {"generator": usage_totals([gen], cfg.price_table, gen_spec["model"])}
    if "gen" in cfg.evaluators:
        spec = llm_spec(cfg, profile)
        out = _judged(cfg, spec, progress, lambda addr: run_chunks(
            "pairwise", TASKS.lookup("pairwise"), layout[cols], root / DETECT_OUTPUTS.judge_gen, ["verdicts", "detail"], _pairwise_settings(cfg), spec,
            addr, cfg, progress))
        results["gen"] = layout[["pair_id", "condition", "original_position"]].merge(
            _frame(out, "verdicts")[["pair_id", "verdict"]], on="pair_id", how="left")
        usage["gen"] = usage_totals([out], cfg.price_table, spec["model"])
    disc_usage = None
    if "disc" in cfg.evaluators:
        disc_verdicts, disc_usage = _disc_verdicts(cfg, layout[cols], progress)
        results["disc"] = layout[["pair_id", "condition", "original_position"]].merge(
            disc_verdicts[["pair_id", "verdict"]], on="pair_id", how="left")
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
    if disc_usage is not None:
        report["usage_disc"] = disc_usage
    write_report(root, report)
    report["table_md"] = md
    return report


def _disc_verdicts(cfg: PairwiseJobConfig | DetectJobConfig, pairs: pd.DataFrame,
                   progress) -> tuple[pd.DataFrame, dict]:
    """The reward-model judge (ALERT-Disc) on `pairs` (pair_id, user_profile,
    item_description, explanation_a, explanation_b), scored on Ray actors
    (`disc.run_disc_on_ray`), with the job's rubric, criteria
    subset (`only`, where the job has one) and divide setting: `judge_disc`'s verdicts,
    one row per pair (pair_id, verdict, score_a, score_b, then verdict_<unit>,
    score_a_<unit>, score_b_<unit> per criterion), and the scoring's usage record
    (seconds, devices, GPU-hours, cost at the model's gpu_hour price: `cost.reward_usage`)."""
    from rexeval.models.encoders.reward import build_reward_scorer
    from rexeval.models.llm.pricing import PriceTable
    from rexeval.pipelines.core.stage import worker_resources
    from rexeval.pipelines.judge.cost import reward_line, reward_usage
    from rexeval.pipelines.judge.disc import DiscConfig, DiscStage, run_disc_on_ray

    # The price table is read before the scoring, so a bad one fails before the work.
    prices = PriceTable.load(cfg.price_table) if cfg.price_table else None
    progress(f"  disc: scoring {len(pairs)} pair(s) with {cfg.reward_model}")
    dcfg = DiscConfig(criteria=_rubric_ref(cfg.criteria), only=getattr(cfg, "only", None), divide=cfg.divide)
    # The model loads on Ray actors sized by the job's worker settings, never in this driver.
    stage = DiscStage(cfg.reward_model, dcfg, worker_resources(cfg, free=True), build=build_reward_scorer)
    run = run_disc_on_ray(stage, pairs, cfg.workers, cfg.min_workers)
    usage = reward_usage(run, cfg.reward_model, prices, cfg.price_table)
    progress(f"  disc: {reward_line(usage)}")
    return run.verdicts, usage


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
