"""Rank and score a split of a STAR benchmark, many interactions per step.

Per batch of interactions the ranker returns dense scores over every statement
([B, S], one GEMM or one sparse-row gather); each level masks them to its candidates
(global: none, item: S_i, user: S_u), one batched top-k ranks them (ties: lower
statement index first), and the metrics of `metrics.ranking` are computed for the whole
batch. Nothing loops over interactions in Python. The batch size keeps B * S near
`max_elements` (32M floats, 128 MB), so memory stays flat however many interactions
are evaluated.

Outputs per level: per-interaction metric values (for the significance tests of the
report) and their macro-averages; interactions without positives (possible when the
builder's input was filtered) are counted and left out of the averages.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from rexeval.metrics.ranking import pad_positives, ranking_metrics, relevance, summarise, top_k
from rexeval.storage import Location, location
from rexeval.pipelines.star.config import KS
from rexeval.pipelines.star.data import LEVELS, StarData
from rexeval.pipelines.star.outputs import METHOD_SUMMARY, PER_INTERACTION, RESULTS

MAX_ELEMENTS = 1 << 25


@dataclass
class LevelResult:
    """One level's metrics: per interaction (aligned with `rows`) and averaged."""

    level: str
    rows: np.ndarray
    per_row: dict[str, np.ndarray]
    summary: dict = field(default_factory=dict)


def batch_rows(n_statements: int, max_elements: int = MAX_ELEMENTS, cap: int = 4096) -> int:
    return max(1, min(cap, max_elements // max(1, n_statements)))


def mask_to_candidates(scores: torch.Tensor, keys: torch.Tensor,
                       cand: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Scores with every non-candidate set to -inf (a new tensor; the input is kept)."""
    lists = pad_positives(cand[0], cand[1], keys)  # the same CSR gather as the ground truth
    row = torch.arange(len(keys), device=scores.device).unsqueeze(1).expand_as(lists)
    ok = lists >= 0
    row, col = row[ok], lists[ok]
    out = torch.full_like(scores, float("-inf"))
    out[row, col] = scores[row, col]
    return out


def evaluate(ranker, data: StarData, split: str = "test", levels: Sequence[str] = ("global", "item"),
             ks: Sequence[int] = KS, device: str | torch.device = "cpu", ndcg_norm: str = "ideal",
             rows: np.ndarray | None = None, batch_size: int | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, LevelResult]:
    """Metrics@ks of `ranker` on `split` (or on explicit interaction `rows`) per level."""
    for level in levels:
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; choose from {', '.join(LEVELS)}")
    device = torch.device(device)
    rows = data.rows(split) if rows is None else np.asarray(rows, dtype=np.int64)
    kmax = max(ks)
    cands = {}
    for level in levels:
        c = data.candidates(level)
        cands[level] = None if c is None else tuple(torch.from_numpy(a).to(device) for a in c)
    pos_off = torch.from_numpy(data.pos_offsets).to(device)
    pos_val = torch.from_numpy(data.pos_values).to(device)
    users_all = torch.from_numpy(data.inter_user).to(device)
    items_all = torch.from_numpy(data.inter_item).to(device)
    step = batch_size or batch_rows(data.n_statements)
    parts: dict[str, list[dict[str, torch.Tensor]]] = {lv: [] for lv in levels}
    t0, last = time.time(), time.time()
    # no_grad, not inference_mode: a model may cache tensors (ExpGCN's adjacency) during
    # evaluation that training later uses with autograd.
    with torch.no_grad():
        for start in range(0, len(rows), step):
            r = torch.from_numpy(rows[start:start + step]).to(device)
            users, items = users_all[r], items_all[r]
            scores = ranker.score_all(users, items, r).to(device=device, dtype=torch.float32)
            positives = pad_positives(pos_off, pos_val, r)
            n_pos = (positives >= 0).sum(1)
            for level in levels:
                s = scores
                if cands[level] is not None:
                    s = mask_to_candidates(scores, users if level == "user" else items, cands[level])
                idx = top_k(s, kmax)
                # A masked (-inf) slot is "no candidate", never a hit.
                rel = relevance(idx, positives, valid=torch.isfinite(s.gather(1, idx)))
                parts[level].append(ranking_metrics(rel, n_pos, ks=ks, ndcg_norm=ndcg_norm))
            if progress and time.time() - last > 10:
                last = time.time()
                done = min(start + step, len(rows))
                progress(f"  {done:,}/{len(rows):,} interactions ranked ({done / (last - t0):,.0f}/s)")
    out = {}
    for level in levels:
        names = list(parts[level][0]) if parts[level] else []
        per_row = {n: torch.cat([p[n] for p in parts[level]]).cpu().numpy() for n in names}
        res = LevelResult(level, rows, per_row)
        res.summary = summarise(per_row) if per_row else {"n_rows": 0, "n_scored": 0,
                                                          "n_without_positives": 0}
        out[level] = res
    return out


def per_interaction_table(results: dict[str, LevelResult], data: StarData, method: str) -> pa.Table:
    """Long-by-level, wide-by-metric table of per-interaction values."""
    parts = []
    for level, res in results.items():
        cols = {"method": pa.array([method] * len(res.rows)),
                "level": pa.array([level] * len(res.rows)),
                "interaction": pa.array(res.rows, pa.int64()),
                "review_id": pa.array(data.inter_ids[res.rows].tolist(), pa.string())}
        for name, values in res.per_row.items():
            cols[name] = pa.array(values, pa.float64())
        parts.append(pa.table(cols))
    return pa.concat_tables(parts, promote_options="default") if parts else pa.table({})


def write_results(results: dict[str, LevelResult], data: StarData, method: str, out: str | Path | Location,
                  extra: dict | None = None) -> Location:
    """results/<method>/{per_interaction.parquet, summary.json} under `out`."""
    from rexeval.pipelines.core.io import write_json_atomic, write_parquet_atomic

    folder = location(out) / RESULTS / method
    folder.mkdir()
    write_parquet_atomic(folder / PER_INTERACTION.name, per_interaction_table(results, data, method))
    write_json_atomic(folder / METHOD_SUMMARY.name, {"method": method, **(extra or {}),
                                                "levels": {lv: r.summary for lv, r in results.items()}})
    return folder


def mean_summary(summaries: list[dict]) -> dict:
    """Level -> key -> mean over runs of per-run summaries (each `{level: summary}`);
    a count the runs share (n_rows, ...) stays that int."""
    out = {}
    for level in summaries[0]:
        per_key: dict[str, list] = {}
        for s in summaries:
            for key, v in s[level].items():
                per_key.setdefault(key, []).append(v)
        out[level] = {key: vs[0] if all(isinstance(v, int) and v == vs[0] for v in vs)
                      else float(np.mean(vs)) for key, vs in per_key.items()}
    return out


def write_run_results(runs: dict[int, dict[str, LevelResult]], data: StarData, method: str,
                      out: str | Path | Location, extra: dict | None = None,
                      run_extra: dict[int, dict] | None = None) -> Location:
    """Several runs (seeds) of one method in results/<method>/: every run's rows in one
    per_interaction.parquet with a `run` column (the seed), and a summary.json whose
    `levels` are the means over runs, with each run's own under `runs`."""
    from rexeval.pipelines.core.io import write_json_atomic, write_parquet_atomic

    folder = location(out) / RESULTS / method
    folder.mkdir()
    tables = []
    for seed, results in runs.items():
        t = per_interaction_table(results, data, method)
        tables.append(t.append_column("run", pa.array([seed] * t.num_rows, pa.int64())))
    write_parquet_atomic(folder / PER_INTERACTION.name, pa.concat_tables(tables))
    per_run = [{"run": seed, **(run_extra or {}).get(seed, {}),
                "levels": {lv: r.summary for lv, r in results.items()}} for seed, results in runs.items()]
    write_json_atomic(folder / METHOD_SUMMARY.name, {"method": method, **(extra or {}), "seeds": list(runs),
                                                "levels": mean_summary([r["levels"] for r in per_run]),
                                                "runs": per_run})
    return folder
