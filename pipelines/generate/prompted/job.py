"""`rexeval generate llm`: seed 004's prompted generators, from an ingest or split folder
to an explanations table that `rexeval evaluate` and `rexeval judge` read as is.

1. `load_inputs`: the interactions to explain and the known reviews (their own reviews
   left out); `core.context.build_contexts`: each interaction's purchase history and item
   description from the known reviews.
2. BiasedMF on the known ratings, a Tune trial of the one trainer (`prompted/mf.py`),
   when user_based or item_based is asked for; its best epoch is selected on ratings it
   did not train on (a split folder's validation reviews, which leave its training rows;
   from an ingest folder a seeded tenth of the known ratings). The experiment lives in
   `<out>/mf` and a re-run restores it.
3. Each method plans its prompts in the driver (`<method>/plan.parquet`: the prompt, or
   the explanation for review extraction, and what it drew on).
4. The prompts run as resumable chunks on a Ray Data actor pool through the LLM service
   (`pipelines.core.llm.chunks`: the judge Serve deployment or an in-process backend,
   behind the LLM-call cache), `<method>/calls/`. A re-run skips finished chunks, so it
   makes no LLM call at all.
5. `explanations.parquet` (EXPLANATIONS: example id = review id, system = the method,
   reference = the review text, which no generator saw), `errors.parquet` (one row per
   interaction a method could not explain, with the reason), `report.json` (counts,
   usage, provenance) and `generate.md`. Every interaction of every method ends in one of
   the two tables; the job checks it.

The input and `out` may be local folders or URIs (`rexeval/storage.py`): every
file goes through storage, and the chunk actors read their prompts from `<method>/calls/`
and write their answers there, so no node needs another's disk.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import pyarrow as pa

from rexeval.pipelines.core.io import config_hash, write_json_atomic, write_parquet_atomic
from rexeval.pipelines.core.schema import ERRORS, EXPLANATIONS
from rexeval.storage import location
from rexeval.pipelines.generate.prompted.config import PROMPTED_OUTPUTS, PromptedJob

STAGE = "generate_llm"


def _contexts(inputs, settings) -> pd.DataFrame:
    from rexeval.pipelines.core.context import build_contexts

    return build_contexts(inputs.known, inputs.targets[["user_id", "item_id", "timestamp"]],
                          max_history=settings.max_history, max_item_summaries=settings.max_item_summaries)


def _train_mf(cfg: PromptedJob, inputs, progress):
    from rexeval.pipelines.generate.prompted.mf import train_biased_mf

    cols = ["user_id", "item_id", "rating"]
    valid = None if inputs.valid is None else inputs.valid[cols]
    settings = {"seed": cfg.seed, **cfg.settings.mf}  # --seed, unless the MF settings name their own
    return train_biased_mf(inputs.known[cols], valid, location(cfg.out) / PROMPTED_OUTPUTS.mf, settings,
                           cpus=cfg.mf_cpus, gpus=cfg.mf_gpus, progress=progress)


def _ask(cfg: PromptedJob, plans: dict[str, pd.DataFrame], methods: dict, progress) -> tuple[dict, dict]:
    """Run every LLM method's live prompts; (answers per method, usage)."""
    from rexeval.models.profiles import load_profile
    from rexeval.pipelines.core.llm.chunks import JudgeService, chunk_engines, llm_spec, run_chunks, usage_totals
    from rexeval.pipelines.generate.prompted.tasks import explain_task

    live = {n: p[p["skip"].isna() & p["messages"].notna()] for n, p in plans.items() if methods[n].uses_llm}
    live = {n: p for n, p in live.items() if len(p)}
    if not live:
        return {}, {}
    spec = llm_spec(cfg, load_profile(cfg.profile, cfg.models), role="llm")
    service = JudgeService(cfg, spec, progress)
    answers, outputs = {}, []
    try:
        address = service.address()
        spec["model"] = service.model_id
        # One model load for every method (each keeps its own resumable chunks).
        with chunk_engines(spec, address, cfg, progress, label="explain") as engines:
            for name, rows in live.items():
                progress(f"  {name}: {len(rows)} prompt(s) ({rows['messages'].nunique()} distinct)")
                settings = explain_settings(cfg, methods[name])
                calls = location(cfg.out) / PROMPTED_OUTPUTS.calls.format(method=name)
                out = run_chunks(f"explain_{name}", explain_task,
                                 rows[["example_id", "messages"]].reset_index(drop=True),
                                 calls, ["answers"], settings, spec, address, cfg, progress, shared=engines)
                answers[name] = out.read("answers").to_pandas()
                outputs.append(out)
    finally:
        service.stop()
    return answers, usage_totals(outputs, cfg.price_table, spec["model"])


def explain_settings(cfg: PromptedJob, method) -> dict:
    """What the chunks of `method` read: the caps and sampling of its LLM calls."""
    s = cfg.settings
    return {"explain": {"min_words": s.min_words, "max_words": s.max_words, "max_tokens": s.max_tokens,
                        "temperature": s.temperature, "max_retries": s.max_retries, "seed": cfg.seed,
                        "asked_words": method.asked_words}}


def assemble(inputs, plans: dict[str, pd.DataFrame], answers: dict[str, pd.DataFrame]
             ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(explanations, errors, counts per method) from the plans and the LLM answers."""
    ref = inputs.targets.set_index("example_id")["reference"]
    expl, errs, counts = [], [], {}
    for name, plan in plans.items():
        p = plan.copy()
        if name in answers:
            a = answers[name].drop_duplicates("example_id").set_index("example_id")
            got = p["example_id"].map(a["explanation"])
            asked = p["skip"].isna() & p["messages"].notna()
            p.loc[asked, "explanation"] = got[asked]
            missing = asked & got.isna()
            p.loc[missing, "skip"] = p.loc[missing, "example_id"].map(a["error_type"]).fillna("no_answer")
            p.loc[missing, "skip_message"] = p.loc[missing, "example_id"].map(a["message"]).fillna(
                "the LLM call left no answer for this prompt")
            p["raw"] = p["example_id"].map(a["raw"])
        else:
            p["raw"] = None
        ok = p["skip"].isna() & p["explanation"].notna()
        e = p[ok]
        expl.append(pd.DataFrame({"example_id": e["example_id"], "system": name, "user_id": e["user_id"],
                                  "item_id": e["item_id"], "explanation": e["explanation"],
                                  "reference": e["example_id"].map(ref)}))
        bad = p[~ok]
        errs.append(pd.DataFrame({
            "stage": STAGE, "source": inputs.source, "line": None,
            "row_id": name + "|" + bad["example_id"].astype(str), "field": "explanation",
            "error_type": bad["skip"].fillna("no_explanation"),
            "message": [f"{name}, example {x}: {m}" for x, m in zip(bad["example_id"], bad["skip_message"].fillna(
                "no explanation was produced"))],
            "raw": bad["raw"]}))
        counts[name] = {"interactions": len(p), "explanations": int(ok.sum()), "errors": int((~ok).sum()),
                        "error_types": {k: int(v) for k, v in bad["skip"].fillna("no_explanation")
                                        .value_counts().sort_index().items()}}
        if counts[name]["explanations"] + counts[name]["errors"] != len(inputs.targets):
            raise AssertionError(f"{name}: {len(inputs.targets)} interactions but {counts[name]['explanations']} "
                                 f"explanations + {counts[name]['errors']} errors")
    explanations = pd.concat(expl, ignore_index=True) if expl else pd.DataFrame(columns=EXPLANATIONS.names)
    errors = pd.concat(errs, ignore_index=True) if errs else pd.DataFrame(columns=ERRORS.names)
    return explanations, errors, counts


def _table(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    df = df.astype(object).where(df.notna(), None)
    return pa.Table.from_pylist(df.to_dict("records"), schema=schema)


def run_prompted(cfg: PromptedJob, progress: Callable[[str], None] = print) -> dict:
    """Run the job (see the module docstring); returns the report."""
    from rexeval.pipelines.generate.prompted.inputs import load_inputs
    from rexeval.pipelines.generate.prompted.methods import method

    t0 = time.time()
    root = location(cfg.out)
    cfg = cfg.with_resolved_cache(cfg.out)  # a URI output keeps its LLM calls beside it
    methods = {n: method(n) for n in cfg.methods}
    inputs = load_inputs(cfg.input, cfg.split, cfg.min_reviews, cfg.limit, cfg.columns)
    read = f"{inputs.kind} folder" if location(cfg.input).is_dir() else "reviews table"
    progress(f"generate llm: {len(inputs.targets)} interaction(s) to explain from {read} "
             f"{inputs.source}; {len(inputs.known)} known review(s); method(s) {', '.join(methods)}")
    contexts = _contexts(inputs, cfg.settings)
    mf, mf_report = None, None
    if any(m.needs_mf for m in methods.values()):
        mf = _train_mf(cfg, inputs, progress)
        mf_report = {"users": len(mf.user_ids), "items": len(mf.item_ids), "val_rmse": mf.val_rmse,
                     "global_mean_rmse": mf.baseline_rmse, "best_epoch": mf.best_epoch,
                     "train_ratings": mf.train_ratings, "selection_ratings": mf.selection_ratings}
    plans = {}
    for name, m in methods.items():
        plan = m.plan(inputs, cfg.settings, contexts, mf)
        (root / name).mkdir()
        write_parquet_atomic(root / PROMPTED_OUTPUTS.plans.format(method=name), pa.Table.from_pandas(plan, preserve_index=False))
        plans[name] = plan
        progress(f"  {name}: {int(plan['skip'].isna().sum())} planned, {int(plan['skip'].notna().sum())} "
                 "interaction(s) it cannot serve (error rows)")
    answers, usage = _ask(cfg, plans, methods, progress)
    explanations, errors, counts = assemble(inputs, plans, answers)
    write_parquet_atomic(root / PROMPTED_OUTPUTS.explanations, _table(explanations, EXPLANATIONS))
    write_parquet_atomic(root / PROMPTED_OUTPUTS.errors, _table(errors, ERRORS))
    settings = cfg.settings.model_dump()
    report = {"job": "generate llm", "input": inputs.source, "kind": inputs.kind, "split": cfg.split,
              "interactions": len(inputs.targets), "known_reviews": len(inputs.known),
              "explanations": len(explanations), "errors": len(errors), "methods": counts, "biased_mf": mf_report,
              "usage": usage,
              "provenance": {"model": usage.get("model"), "backend": cfg.backend, "profile": cfg.profile,
                             "prompt_versions": {n: str(p["prompt_version"].iloc[0]) if len(p) else None
                                                 for n, p in plans.items()},
                             "sampling": {"temperature": cfg.settings.temperature,
                                          "max_tokens": cfg.settings.max_tokens, "seed": cfg.seed},
                             "settings": settings, "settings_hash": config_hash(settings)},
              "elapsed_s": round(time.time() - t0, 2)}
    write_json_atomic(root / PROMPTED_OUTPUTS.report, report)
    md = markdown(counts, usage)
    (root / PROMPTED_OUTPUTS.table).write_text(md)
    report["table_md"] = md
    return report


def markdown(counts: dict, usage: dict) -> str:
    lines = ["| system | interactions | explanations | errors | error types |", "|---|---|---|---|---|"]
    for name, c in counts.items():
        kinds = ", ".join(f"{k} {v}" for k, v in c["error_types"].items()) or "–"
        lines.append(f"| {name} | {c['interactions']} | {c['explanations']} | {c['errors']} | {kinds} |")
    if usage:
        lines += ["", f"LLM `{usage.get('model')}`: {usage.get('calls', 0)} call(s) "
                      f"({usage.get('cached_calls', 0)} cached), {usage.get('prompt_tokens', 0)} prompt + "
                      f"{usage.get('completion_tokens', 0)} completion tokens"]
    return "\n".join(lines) + "\n"
