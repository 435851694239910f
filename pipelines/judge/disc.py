"""The discriminative pairwise judge of seed 004 (ALERT-Disc): a reward model scores each
of two explanations for the same user and item, and the higher score wins.

The reward model reads the explanation-writing instruction (`alert_disc` prompt: the
user's history, the item description and the criteria) as the prompt and the
explanation as the response (`models.encoders.reward.RewardScorer`, or any object with
`score(pairs) -> array`). Two variants, as in Table 1:
- divide-and-aggregate (default): one prompt per criterion; per criterion the verdict
  is A when score_a - score_b > tie_margin, B when < -tie_margin, else C (a tie); the
  pair's verdict is the plurality over criteria (`metrics.preference.majority_vote`, a
  tie for the top count is C);
- "w/o DA" (`divide=False`): one prompt holding every criterion, one verdict.
Each distinct (prompt, response) is scored once: explanations repeated across pairs
(a baseline compared with many systems) cost nothing extra. The scores are
deterministic, so no presentation-order swap is needed: the verdict only depends on
which explanation is called A.

`run_disc_on_ray` does the same with the model on Ray actors (`DiscStage`), as the judge
jobs do, so it never loads in the job's driver: the pairs go in batches that keep each
context whole, so what repeats is still scored once.

`run_disc` also records what the scoring took (wall seconds, the devices the model sat
on), the reward model's side of seed 004's cost comparison (Table 3): a reward model
is paid by the GPU-hour, not by the token (`pipelines.judge.cost`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import perf_counter

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field

from rexeval.metrics.preference import majority_vote
from rexeval.pipelines.core.stage import Resources, Stage
from rexeval.pipelines.judge.pairwise import NO_HISTORY, PAIR_COLUMNS, CriteriaSettings, units


class DiscConfig(CriteriaSettings):
    """How the reward model is asked (one score per question)."""

    tie_margin: float = Field(0.0, ge=0.0, description="score differences up to this are ties")
    prompt: str = "alert_disc"
    prompts_dir: str | None = None
    batch_size: int | None = Field(None, ge=1, description="passed to the scorer")


def verdict_from_scores(score_a: float, score_b: float, tie_margin: float = 0.0) -> str | None:
    """A, B or C (|difference| <= tie_margin); None when either score is missing."""
    if score_a is None or score_b is None or math.isnan(score_a) or math.isnan(score_b):
        return None
    diff = float(score_a) - float(score_b)
    return "A" if diff > tie_margin else "B" if diff < -tie_margin else "C"


def reward_prompt(template, criteria: list, user_profile: str, item_description: str) -> str:
    """The one user turn the reward model reads: the prompt's turns joined."""
    messages = template.render(criteria=criteria, user_profile=user_profile or NO_HISTORY,
                               item_description=item_description or "")
    return "\n\n".join(m["content"] for m in messages)


def check_pairs(pairs: pd.DataFrame) -> None:
    """Refuse pairs without the columns the prompts need, or with a pair_id twice."""
    missing = [c for c in PAIR_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs lack column(s) {missing}")
    if pairs["pair_id"].duplicated().any():
        raise ValueError("pairs repeat a pair_id: one row per pair")


def score_tasks(pairs: pd.DataFrame, cfg: DiscConfig) -> pd.DataFrame:
    """One row per (pair, unit): pair_id, unit, prompt, explanation_a, explanation_b."""
    from rexeval.prompts import load_prompt
    from rexeval.prompts.rubrics import load_rubric

    check_pairs(pairs)
    template = load_prompt(cfg.prompt, cfg.prompts_dir)
    rubric = load_rubric(cfg.criteria, cfg.prompts_dir)
    plan = units(rubric, cfg)
    rows = []
    for r in pairs.itertuples(index=False):
        for unit, items in plan:
            rows.append({"pair_id": r.pair_id, "unit": unit,
                         "prompt": reward_prompt(template, items, r.user_profile, r.item_description),
                         "explanation_a": r.explanation_a or "", "explanation_b": r.explanation_b or ""})
    return pd.DataFrame(rows, columns=["pair_id", "unit", "prompt", "explanation_a", "explanation_b"])


def score_distinct(scorer, texts: list[tuple[str, str]], batch_size: int | None = None) -> np.ndarray:
    """The scorer's value for every (prompt, response), each distinct one asked once."""
    index: dict[tuple[str, str], int] = {}
    inverse = np.fromiter((index.setdefault(t, len(index)) for t in texts), dtype=np.int64,
                          count=len(texts))
    if not index:
        return np.zeros(0, dtype=np.float64)
    kwargs = {"batch_size": batch_size} if batch_size else {}
    values = np.asarray(scorer.score(list(index), **kwargs), dtype=np.float64).reshape(-1)
    if len(values) != len(index):
        raise ValueError(f"the scorer returned {len(values)} scores for {len(index)} pairs")
    return values[inverse]


def judge_disc(scorer, pairs: pd.DataFrame, cfg: DiscConfig | None = None):
    """Verdicts for every pair (A = explanation_a), from reward-model scores.

    Returns (verdicts, detail): `verdicts` has one row per pair: pair_id, verdict,
    score_a and score_b (mean over units), and per unit (a criterion name, or "all")
    verdict_<unit>, score_a_<unit>, score_b_<unit>; `detail` one row per (pair, unit):
    pair_id, unit, score_a, score_b, verdict.
    """
    run = run_disc(scorer, pairs, cfg)
    return run.verdicts, run.detail


GPU_DEVICE_TYPES = ("cuda", "xpu", "mps")
"""torch device types counted as GPUs (ROCm GPUs also show as "cuda")."""


@dataclass
class DiscRun:
    """`judge_disc`'s tables and what the scoring took: `seconds` of wall time in the
    scorer, `scored` distinct (prompt, response) pairs it was asked, on `devices`
    (None: the scorer did not say)."""

    verdicts: pd.DataFrame
    detail: pd.DataFrame
    pairs: int
    scored: int
    seconds: float
    devices: list[str] | None

    @property
    def gpus(self) -> int | None:
        """GPUs the model held: its distinct GPU devices (0 on CPU, None unknown)."""
        return gpu_count(self.devices)


def run_disc(scorer, pairs: pd.DataFrame, cfg: DiscConfig | None = None,
             clock: Callable[[], float] | None = None) -> DiscRun:
    """`judge_disc`, with the wall time of the scoring (`clock`, seconds; default
    `time.perf_counter`) and the scorer's devices recorded."""
    cfg = cfg or DiscConfig()
    clock = clock or perf_counter
    tasks = score_tasks(pairs, cfg)
    n = len(tasks)
    texts = (list(zip(tasks["prompt"], tasks["explanation_a"]))
             + list(zip(tasks["prompt"], tasks["explanation_b"])))
    start = clock()
    scores = score_distinct(scorer, texts, cfg.batch_size)
    seconds = clock() - start
    detail = pd.DataFrame({"pair_id": tasks["pair_id"], "unit": tasks["unit"],
                           "score_a": scores[:n], "score_b": scores[n:]})
    detail["verdict"] = [verdict_from_scores(a, b, cfg.tie_margin)
                         for a, b in zip(detail["score_a"], detail["score_b"])]
    return DiscRun(_combine(pairs, detail, cfg), detail, pairs=len(pairs), scored=len(set(texts)),
                   seconds=max(float(seconds), 0.0), devices=scorer_devices(scorer))


def scorer_devices(scorer) -> list[str] | None:
    """Where the scorer computes, sorted: its `devices` when it lists them, else the
    devices of its torch model's weights (several when the model is split over GPUs),
    else its `device`; None when it says nothing."""
    listed = getattr(scorer, "devices", None)
    if listed is not None:
        return sorted({str(d) for d in listed})
    parameters = getattr(getattr(scorer, "model", None), "parameters", None)
    if callable(parameters):
        found = sorted({str(p.device) for p in parameters()})
        if found:
            return found
    device = getattr(scorer, "device", None)
    return None if device is None else [str(device)]


def gpu_count(devices: list[str] | None) -> int | None:
    """Distinct GPU devices among torch device names ("cuda" alone is "cuda:0");
    0 for CPU only, None when the devices are not known."""
    if devices is None:
        return None
    gpus = set()
    for d in devices:
        kind, _, index = str(d).partition(":")
        if kind in GPU_DEVICE_TYPES:
            gpus.add((kind, index or "0"))
    return len(gpus)


def _combine(pairs: pd.DataFrame, detail: pd.DataFrame, cfg: DiscConfig) -> pd.DataFrame:
    names = list(dict.fromkeys(detail["unit"]))
    wide = {u: part.set_index("pair_id") for u, part in detail.groupby("unit", sort=False)}
    out = pd.DataFrame({"pair_id": pairs["pair_id"].to_numpy()})
    for u in names:
        part = wide[u].reindex(out["pair_id"])
        out[f"verdict_{u}"] = part["verdict"].to_numpy()
        out[f"score_a_{u}"] = part["score_a"].to_numpy()
        out[f"score_b_{u}"] = part["score_b"].to_numpy()
    per_unit = out[[f"verdict_{u}" for u in names]].to_numpy(dtype=object)
    if cfg.divide:
        out["verdict"] = [majority_vote(None if pd.isna(v) else v for v in row) for row in per_unit]
    else:
        out["verdict"] = [None if pd.isna(v) else v for v in per_unit[:, 0]] if names else None
    out["score_a"] = out[[f"score_a_{u}" for u in names]].mean(axis=1)
    out["score_b"] = out[[f"score_b_{u}" for u in names]].mean(axis=1)
    lead = ["pair_id", "verdict", "score_a", "score_b"]
    return out[lead + [c for c in out.columns if c not in lead]]


# -- the scoring on Ray actors ------------------------------------------------------------

PAIRS_PER_BATCH = 256
"""Pairs one call of the scoring stage gets, about (`context_batches` keeps contexts whole)."""
DETAIL = ["pair_id", "unit", "score_a", "score_b", "verdict"]


def context_batches(pairs: pd.DataFrame, size: int | None = None) -> list[pd.DataFrame]:
    """`pairs` in batches of about `size` that keep every pair of one context (the user's
    history and the item description, what a reward prompt is made of) together: a
    (prompt, response) that repeats across pairs (a baseline's explanation against each
    system) falls in one batch and is scored once, as on the whole table. `size`:
    PAIRS_PER_BATCH unless given."""
    size = size or PAIRS_PER_BATCH
    contexts = [f"{p or NO_HISTORY}\x1f{d or ''}" for p, d in zip(pairs["user_profile"], pairs["item_description"])]
    codes = pd.factorize(pd.Series(contexts, dtype=object))[0]
    batch_of, batch, filled = np.zeros(codes.max() + 1 if len(codes) else 0, np.int64), 0, 0
    for code, n in enumerate(np.bincount(codes)):
        if filled and filled + n > size:
            batch, filled = batch + 1, 0
        batch_of[code], filled = batch, filled + n
    rows = batch_of[codes]
    return [pairs[rows == b].reset_index(drop=True) for b in range(batch + 1)] if len(pairs) else []


class DiscStage(Stage):
    """The reward model on Ray actors (`runtime.map_stage`): `setup()` loads it once per
    actor with `build(reward_model)`; a batch of pairs (`context_batches`) -> its detail
    rows (DETAIL) and, on each, what the batch's scoring took (batch: its first pair_id,
    scored, seconds by `clock`, devices)."""

    name = "disc"
    batch_size = None  # a whole block, one `context_batches` batch, per call

    def __init__(self, reward_model: str, cfg: DiscConfig, resources: Resources, build: Callable,
                 clock: Callable[[], float] | None = None):
        self.reward_model, self.cfg, self.resources, self.build = reward_model, cfg, resources, build
        self.clock = clock or perf_counter
        self.scorer = None

    def setup(self) -> None:
        self.scorer = self.build(self.reward_model)

    def process(self, batch: pa.Table) -> pa.Table:
        pairs = batch.to_pandas()
        pairs = pairs.astype(object).where(pairs.notna(), None)  # a missing text as None, as the job's frame has it
        run = run_disc(self.scorer, pairs, self.cfg, clock=self.clock)
        detail = run.detail.assign(batch=str(pairs["pair_id"].iloc[0]), scored=run.scored, seconds=run.seconds,
                                   devices=[run.devices] * len(run.detail))
        return pa.Table.from_pandas(detail, preserve_index=False)


def run_disc_on_ray(stage: DiscStage, pairs: pd.DataFrame, workers: int | None = None,
                    min_workers: int = 1) -> DiscRun:
    """`run_disc` with the model on Ray actors of `stage` (a pool of up to `workers`), never
    in this process: the verdicts are `run_disc`'s, `scored` and `seconds` summed over
    the batches, `devices` those any actor used."""
    import ray

    from rexeval.pipelines.core.runtime import init_ray, map_stage, worker_failures
    from rexeval.pipelines.core.stage import pool_size

    check_pairs(pairs)
    batches = context_batches(pairs[list(PAIR_COLUMNS)])
    if not batches:
        return DiscRun(_combine(pairs, pd.DataFrame(columns=DETAIL), stage.cfg), pd.DataFrame(columns=DETAIL),
                       pairs=0, scored=0, seconds=0.0, devices=None)
    init_ray()
    ds = ray.data.from_arrow([_texts_as_strings(b) for b in batches])
    ds = map_stage(ds, stage, pool_size(workers, len(batches), min_workers))
    with worker_failures(stage):
        rows = ds.to_pandas()
    place = {pid: i for i, pid in enumerate(pairs["pair_id"])}
    rows = rows.iloc[np.argsort(rows["pair_id"].map(place).to_numpy(), kind="stable")].reset_index(drop=True)
    runs = rows.drop_duplicates("batch")
    detail = rows[DETAIL]
    return DiscRun(_combine(pairs, detail, stage.cfg), detail, pairs=len(pairs), scored=int(runs["scored"].sum()),
                   seconds=float(runs["seconds"].sum()), devices=_devices(runs["devices"]))


def _texts_as_strings(batch: pd.DataFrame) -> pa.Table:
    """A batch as Arrow with its text columns typed as strings (a column of only nulls
    would be typed null)."""
    table = pa.Table.from_pandas(batch, preserve_index=False)
    for name in PAIR_COLUMNS[1:]:
        table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(pa.string()))
    return table


def _devices(per_batch: Iterable) -> list[str] | None:
    """The devices of every batch's scorer, sorted; None when no scorer said."""
    said = [d for d in per_batch if d is not None]
    return sorted({str(x) for d in said for x in d}) if said else None
