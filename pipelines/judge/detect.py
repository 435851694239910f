"""The inferior-explanation detection test of seed 004 (§4.2, Table 1).

A judge is trustworthy only if it prefers a good explanation to a worse one written for
the same user and item. We make the worse one on purpose. For every interaction the
generator, PreferenceLogic (`pipelines/generate/prompted/preference_logic.py`, the same
generator `rexeval generate llm --method preference_logic` runs: the prompt
`explain_recommendation` with the `explanation_style` rules), writes the ORIGINAL
explanation from the true context, and, per condition, an INFERIOR one:

- data interruptions (good style, wrong context): `item_replace` is written for another
  item's description, `user_replace` with another user's purchase history, `empty_user`
  with no history at all;
- prompt interruptions (true context, one flawed style rule instead of the good ones,
  from the `inferior_styles` rubric): `jargon`, `minor_benefits`, `misinformation`,
  `bad_experience` (a rubric item added by the user becomes a condition too).

Replacements are drawn uniformly with numpy Generators seeded from `seed` (one stream
for items, one for users), among the other items (users) of the contexts table whose
description (history) is non-empty and differs from the true one as text, so the
inferior prompt always differs from the original's. `empty_user` for a user whose true
history is already empty would repeat the original prompt: that pair is recorded as an
error ("not_applicable"), as is a data interruption with nothing to draw from
("no_replacement"). Every interaction x condition ends in `pairs` or in `errors`.

Generation is greedy by default (temperature 0): re-runs hit the LLM-call cache, and
`core.llm.calls.ask` sends each distinct conversation once (the original prompt is shared
by every condition of an interaction).
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rexeval.pipelines.core.context import CONTEXT_COLUMNS
from rexeval.pipelines.generate.prompted.parse import parse_explanation

DATA_CONDITIONS = ("item_replace", "user_replace", "empty_user")
PROMPT_CONDITIONS = ("jargon", "minor_benefits", "misinformation", "bad_experience")
ALL_CONDITIONS = DATA_CONDITIONS + PROMPT_CONDITIONS
STAGE = "detect_generate"
PAIR_COLUMNS = ("pair_id", "user_id", "item_id", "condition", "kind", "user_profile",
                "item_description", "original", "inferior", "replacement_id", "generator",
                "original_prompt_version", "inferior_prompt_version")
ERROR_COLUMNS = ("stage", "source", "line", "row_id", "field", "error_type", "message", "raw")
RANDOM_ACCURACY = 0.5
"""What a coin-flip judge scores: the original sits at A or B at random (`judge_layout`),
so a judge that picks a side at random, and never ties, is right half the time whatever
the condition."""


class DetectSuiteConfig(BaseModel):
    """How the original and inferior explanations are generated."""

    model_config = ConfigDict(extra="forbid")

    conditions: list[str] = Field(default_factory=lambda: list(ALL_CONDITIONS))
    seed: int = 0
    prompt: str = "explain_recommendation"
    style: str = Field("explanation_style", description="rubric of the good style rules")
    inferior: str = Field("inferior_styles", description="rubric of the flawed rules, one per "
                          "prompt-interruption condition")
    prompts_dir: str | None = None
    max_retries: int = Field(2, ge=0, le=10)
    max_tokens: int = Field(128, ge=16)
    temperature: float = Field(0.0, ge=0.0, description="0: greedy, reproducible, cacheable")
    min_words: int = Field(5, ge=1, description="shorter answers are sent back")
    max_words: int | None = Field(60, ge=5, description="the longest answer kept (the prompt asks 20-30); "
                                  "a longer one keeps its leading whole sentences; None keeps it whole")

    @field_validator("conditions")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"conditions must be a non-empty list without repeats, got {v}")
        return v


# --- planning: which prompt each inferior explanation is written from --------------------

def pair_ids(users: Sequence[str], items: Sequence[str], conditions: Sequence[str]) -> list[str]:
    """Stable pair id: a 64-bit BLAKE2b hash of (user, item, condition), in hex."""
    return [hashlib.blake2b(f"{u}\x1f{i}\x1f{c}".encode(), digest_size=8).hexdigest()
            for u, i, c in zip(users, items, conditions)]


def pick_others(rng: np.random.Generator, true_keys: np.ndarray, true_texts: np.ndarray,
                pool_keys: np.ndarray, pool_texts: np.ndarray, rounds: int = 32) -> np.ndarray:
    """For each row, the index of a uniformly drawn pool entry whose key and text both
    differ from the row's, or -1 when the pool has none. Vectorised rejection sampling,
    then an exact draw for the few rows still without one: deterministic for a seed."""
    out = np.full(len(true_keys), -1, dtype=np.int64)
    if not len(pool_keys):
        return out
    todo = np.arange(len(true_keys))
    for _ in range(rounds):
        if not todo.size:
            break
        draw = rng.integers(0, len(pool_keys), size=todo.size)
        ok = (pool_keys[draw] != true_keys[todo]) & (pool_texts[draw] != true_texts[todo])
        out[todo[ok]] = draw[ok]
        todo = todo[~ok]
    for i in todo:
        allowed = np.flatnonzero((pool_keys != true_keys[i]) & (pool_texts != true_texts[i]))
        if allowed.size:
            out[i] = allowed[rng.integers(0, allowed.size)]
    return out


def _pool(ctx: pd.DataFrame, key: str, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (key, text) pairs with a non-empty text, in first-seen order."""
    p = ctx.loc[ctx[text].str.strip() != "", [key, text]].drop_duplicates()
    return p[key].to_numpy(dtype=object), p[text].to_numpy(dtype=object)


def plan_conditions(contexts: pd.DataFrame, conditions: Sequence[str], seed: int = 0) -> pd.DataFrame:
    """One row per interaction x condition (interaction-major): what the inferior
    explanation is generated from. Columns: pair_id, the context columns (the TRUE
    context), condition, kind ("data" | "prompt"), gen_profile, gen_description,
    replacement_id (the other item or user; missing otherwise), skip (None, or the
    error_type that keeps the pair from being generated) and skip_message."""
    ctx = check_contexts(contexts)
    n = len(ctx)
    users, items = ctx["user_id"].to_numpy(dtype=object), ctx["item_id"].to_numpy(dtype=object)
    profiles = ctx["user_profile"].to_numpy(dtype=object)
    descs = ctx["item_description"].to_numpy(dtype=object)
    item_keys, item_texts = _pool(ctx, "item_id", "item_description")
    user_keys, user_texts = _pool(ctx, "user_id", "user_profile")
    item_rng, user_rng = (np.random.default_rng([seed, k]) for k in (1, 2))
    item_pick = pick_others(item_rng, items, descs, item_keys, item_texts)
    user_pick = pick_others(user_rng, users, profiles, user_keys, user_texts)
    parts = []
    for cond in conditions:
        part = ctx.copy()
        part["condition"] = cond
        part["kind"] = "data" if cond in DATA_CONDITIONS else "prompt"
        part["gen_profile"], part["gen_description"] = profiles, descs
        part["replacement_id"], part["skip"], part["skip_message"] = None, None, None
        if cond == "item_replace":
            ok = item_pick >= 0
            part.loc[ok, "gen_description"] = item_texts[item_pick[ok]]
            part.loc[ok, "replacement_id"] = item_keys[item_pick[ok]]
            _skip(part, ~ok, "no_replacement",
                  "no other item with a different, non-empty description to draw")
        elif cond == "user_replace":
            ok = user_pick >= 0
            part.loc[ok, "gen_profile"] = user_texts[user_pick[ok]]
            part.loc[ok, "replacement_id"] = user_keys[user_pick[ok]]
            _skip(part, ~ok, "no_replacement",
                  "no other user with a different, non-empty history to draw")
        elif cond == "empty_user":
            part["gen_profile"] = ""
            empty = np.array([not str(p).strip() for p in profiles], dtype=bool)
            _skip(part, empty, "not_applicable", "the user's history is already empty, so the "
                  "inferior prompt would equal the original's")
        part["order"] = np.arange(n)
        parts.append(part)
    plan = pd.concat(parts, ignore_index=True) if parts else ctx.iloc[:0]
    plan = plan.sort_values("order", kind="stable").drop(columns="order").reset_index(drop=True)
    plan.insert(0, "pair_id", pair_ids(plan["user_id"], plan["item_id"], plan["condition"]))
    return plan


def _skip(part: pd.DataFrame, mask: np.ndarray, error_type: str, message: str) -> None:
    part.loc[mask, "skip"] = error_type
    part.loc[mask, "skip_message"] = message


def check_contexts(contexts: pd.DataFrame) -> pd.DataFrame:
    """The context columns as strings (None -> ""); one row per (user_id, item_id)."""
    missing = [c for c in CONTEXT_COLUMNS if c not in contexts.columns]
    if missing:
        raise ValueError(f"contexts lack column(s) {missing}")
    ctx = contexts[list(CONTEXT_COLUMNS)].copy().reset_index(drop=True)
    for c in CONTEXT_COLUMNS:
        ctx[c] = ctx[c].fillna("").astype(str)
    dup = ctx.duplicated(["user_id", "item_id"])
    if dup.any():
        first = ctx.loc[dup.idxmax(), ["user_id", "item_id"]].tolist()
        raise ValueError(f"contexts repeat (user_id, item_id) {first}: one row per interaction")
    return ctx


# --- generating ---------------------------------------------------------------------------

def build_detection_pairs(contexts: pd.DataFrame, llm, cfg: DetectSuiteConfig | None = None):
    """Original and inferior explanations for every interaction x condition.

    Returns (pairs, errors, stats): `pairs` has PAIR_COLUMNS (user_profile and
    item_description are the TRUE context, the one a judge sees), `errors` the ERRORS
    columns (stage "detect_generate", row_id = pair_id, field = the side(s) that failed:
    "original", "inferior" or "original,inferior"; error_type "llm_error", "unparseable",
    "no_replacement" or "not_applicable") for pairs that could not be made, and `stats`
    the CallStats of the generation calls.
    """
    cfg = cfg or DetectSuiteConfig()
    check_conditions(cfg)
    return generate_planned(plan_conditions(contexts, cfg.conditions, cfg.seed), llm, cfg)


def check_conditions(cfg: DetectSuiteConfig) -> None:
    from rexeval.prompts.rubrics import load_rubric

    inferior = load_rubric(cfg.inferior, cfg.prompts_dir)
    unknown = [c for c in cfg.conditions if c not in DATA_CONDITIONS and c not in inferior.names]
    if unknown:
        raise ValueError(f"unknown condition(s) {unknown}: data conditions are {list(DATA_CONDITIONS)}, "
                         f"prompt conditions are the items of rubric {inferior.name!r} {inferior.names}")


def generate_planned(plan: pd.DataFrame, llm, cfg: DetectSuiteConfig | None = None):
    """`build_detection_pairs` on rows of a plan made beforehand (`plan_conditions` over
    every interaction, so replacements are drawn from the whole set): a job plans once in
    the driver and generates chunk by chunk."""
    from rexeval.models.llm.base import SamplingParams
    from rexeval.pipelines.core.llm.calls import ask
    from rexeval.pipelines.generate.prompted.preference_logic import conversation, preference_prompt
    from rexeval.prompts.rubrics import load_rubric

    cfg = cfg or DetectSuiteConfig()
    prompt, style = preference_prompt(cfg.prompt, cfg.style, cfg.prompts_dir)
    inferior = load_rubric(cfg.inferior, cfg.prompts_dir)
    good = list(style.items)

    def conv(profile: str, description: str, rules: list) -> list[dict[str, str]]:
        return conversation(prompt, profile, description, rules)

    live = plan[plan["skip"].isna()]
    rendered: dict[tuple[str, str], list[dict[str, str]]] = {}

    def original(r) -> list[dict[str, str]]:  # rendered once per interaction
        key = (r.user_id, r.item_id)
        if key not in rendered:
            rendered[key] = conv(r.user_profile, r.item_description, good)
        return rendered[key]

    originals = [original(r) for r in live.itertuples(index=False)]
    inferiors = [conv(r.gen_profile, r.gen_description,
                      good if r.kind == "data" else [inferior.item(r.condition)])
                 for r in live.itertuples(index=False)]
    parse = functools.partial(parse_explanation, min_words=cfg.min_words, max_words=cfg.max_words)
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed)
    answers, stats = ask(llm, originals + inferiors, parse, sampling=sampling,
                         max_retries=cfg.max_retries,
                         expected="the explanation alone, 20 to 30 words, with no label or quotes")
    versions = {"data": f"{prompt.version}+{style.version}", "prompt": f"{prompt.version}+{inferior.version}"}
    model_id = getattr(llm, "model_id", type(llm).__name__)
    return _assemble(plan, live, answers[:len(live)], answers[len(live):], model_id, versions) + (stats,)


def _assemble(plan, live, orig, infer, model_id: str, versions: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the plan into finished pairs and error rows (skips and failed generations)."""
    pairs, errors = [], []
    for r in plan[plan["skip"].notna()].itertuples(index=False):
        errors.append(_error(r.pair_id, "inferior", r.skip, r.skip_message, None))
    for r, o, i in zip(live.itertuples(index=False), orig, infer):
        bad = [(side, a) for side, a in (("original", o), ("inferior", i)) if not a.ok]
        if bad:
            side, a = bad[0]
            kind = "llm_error" if a.error is not None else "unparseable"
            why = a.error if a.error is not None else a.problem
            msg = f"the {side} explanation failed after {a.attempts} attempt(s): {why}"
            errors.append(_error(r.pair_id, ",".join(s for s, _ in bad), kind, msg, a.raw))
            continue
        pairs.append({"pair_id": r.pair_id, "user_id": r.user_id, "item_id": r.item_id,
                      "condition": r.condition, "kind": r.kind, "user_profile": r.user_profile,
                      "item_description": r.item_description, "original": o.value,
                      "inferior": i.value, "replacement_id": r.replacement_id,
                      "generator": model_id, "original_prompt_version": versions["data"],
                      "inferior_prompt_version": versions[r.kind]})
    order = {pid: k for k, pid in enumerate(plan["pair_id"])}
    pairs_df = pd.DataFrame(pairs, columns=list(PAIR_COLUMNS))
    errors_df = pd.DataFrame(errors, columns=list(ERROR_COLUMNS))
    errors_df = errors_df.sort_values("row_id", key=lambda s: s.map(order), kind="stable")
    return pairs_df.reset_index(drop=True), errors_df.reset_index(drop=True)


def _error(pair_id: str, field: str, error_type: str, message: str, raw: str | None) -> dict:
    return {"stage": STAGE, "source": None, "line": None, "row_id": pair_id, "field": field,
            "error_type": error_type, "message": message, "raw": raw}


# --- judging layout and scoring -------------------------------------------------------------

def judge_layout(pairs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """The pairs as a judge takes them (pair_id, user_profile, item_description,
    explanation_a, explanation_b), with the original at A or B by a seeded coin flip
    (`original_position`), plus condition. Random placement keeps a judge's position bias
    from passing for detection skill."""
    flips = np.random.default_rng([seed, 3]).integers(0, 2, size=len(pairs)).astype(bool)
    orig, inf = pairs["original"].to_numpy(dtype=object), pairs["inferior"].to_numpy(dtype=object)
    return pd.DataFrame({
        "pair_id": pairs["pair_id"].to_numpy(), "condition": pairs["condition"].to_numpy(),
        "user_profile": pairs["user_profile"].to_numpy(),
        "item_description": pairs["item_description"].to_numpy(),
        "explanation_a": np.where(flips, inf, orig), "explanation_b": np.where(flips, orig, inf),
        "original_position": np.where(flips, "B", "A")})


def detection_accuracy(verdicts: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Table 1: per condition, the share of pairs where the judge preferred the original.

    `verdicts` has condition, verdict ("A" | "B" | "C", or None/NaN when the judge's
    answer was unreadable) and original_position ("A" | "B"), e.g. `judge_layout(...)`
    merged with a judge's verdicts on pair_id. A tie or an unreadable verdict counts as
    not detected; both are also counted apart (`ties`, `unreadable`), with `missed` the
    pairs where the inferior explanation won. The last row of each group, condition
    "AVG", is the unweighted mean of the condition accuracies (as Table 1 averages
    conditions, not pairs) with the counts summed. `by` adds grouping columns (e.g. a
    judge name). A judge that flips a coin scores RANDOM_ACCURACY (0.5).
    """
    need = ["condition", "verdict", "original_position", *by]
    missing = [c for c in need if c not in verdicts.columns]
    if missing:
        raise ValueError(f"verdicts lack column(s) {missing}")
    v = verdicts[need].copy()
    verdict = v["verdict"].where(v["verdict"].notna(), None)
    bad = sorted({str(x) for x in verdict.dropna() if x not in ("A", "B", "C")})
    if bad or not v["original_position"].isin(["A", "B"]).all():
        raise ValueError(f"verdicts must be A, B, C or missing (got {bad}) and original_position A or B")
    v["detected"] = (verdict == v["original_position"]).astype(int)
    v["ties"] = (verdict == "C").astype(int)
    v["unreadable"] = verdict.isna().astype(int)
    v["missed"] = 1 - v["detected"] - v["ties"] - v["unreadable"]
    rows = []
    groups = v.groupby(list(by), sort=True, dropna=False) if by else [((), v)]
    for key, part in groups:
        key = key if isinstance(key, tuple) else (key,)
        head = dict(zip(by, key))
        per = []
        for cond in _condition_order(part["condition"]):
            c = part[part["condition"] == cond]
            counts = {k: int(c[k].sum()) for k in ("detected", "missed", "ties", "unreadable")}
            per.append({**head, "condition": cond, "n": len(c), **counts,
                        "accuracy": counts["detected"] / len(c)})
        rows.extend(per)
        total = {k: sum(r[k] for r in per) for k in ("n", "detected", "missed", "ties", "unreadable")}
        rows.append({**head, "condition": "AVG", **total,
                     "accuracy": float(np.mean([r["accuracy"] for r in per])) if per else float("nan")})
    return pd.DataFrame(rows, columns=[*by, "condition", "n", "detected", "missed", "ties",
                                       "unreadable", "accuracy"])


def _condition_order(conditions: pd.Series) -> list[str]:
    """Table 1's order for the known conditions, then any others sorted."""
    present = set(conditions)
    return [c for c in ALL_CONDITIONS if c in present] + sorted(present - set(ALL_CONDITIONS))
