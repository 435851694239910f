"""What the judges cost, side by side: the LLM judges by the token, the reward-model judge
(ALERT-Disc) by the GPU-hour. Seed 004 (Table 3) compares its judges this way; a reward
model bills no tokens, only the time it holds GPUs.

`reward_usage` is the reward model's record in a job's report.json (`usage_disc`): pairs,
distinct (prompt, response) scored, wall seconds of scoring, devices, GPUs, GPU-hours
and, with a price table, the cost at the model's `gpu_hour` price (None = no price,
never 0). `cost_rows` / `cost_markdown` turn a report's LLM `usage` and its `usage_disc`
into one table: judge, kind, calls or pairs, tokens, seconds, GPU-hours, cost.
"""
from __future__ import annotations

from rexeval.models.llm.pricing import PriceTable, format_cost, gpu_cost

COST_COLUMNS = ["judge", "kind", "calls or pairs", "tokens", "seconds", "GPU-hours", "cost"]
TABLE3 = "reproduces the cost comparison of seed 004, Table 3"
ROLES = {"": "LLM judge", "gen": "LLM judge", "generator": "generator (LLM)"}
"""Row labels of the LLM usage entries by their key in report["usage"]."""


def reward_usage(run, model_id: str, prices: PriceTable | None = None, source: str | None = None) -> dict:
    """The report record of one reward-model scoring (`disc.DiscRun`): GPU-hours =
    seconds x GPUs / 3600; with `prices` (read from `source`) also `gpu_hour_price` and
    `cost_usd` (None when the model has no gpu_hour price). On CPU the GPU-hours are 0
    and `cost_note` says the CPU seconds are not priced."""
    gpus = run.gpus
    rate = None if prices is None else prices.gpu_hour_price(model_id)
    hours, cost = gpu_cost(run.seconds, gpus, rate)
    out = {"kind": "GPU-hours", "model": model_id, "pairs": int(run.pairs), "scored": int(run.scored),
           "seconds": round(run.seconds, 3), "devices": run.devices, "gpus": gpus,
           "gpu_hours": None if hours is None else round(hours, 6)}
    notes = []
    if gpus == 0:
        notes.append(f"ran on CPU: 0 GPU-hours; the {run.seconds:.1f} s of CPU time are not priced")
    elif gpus is None:
        notes.append("the scorer did not say which device it ran on: GPU-hours unknown")
    if prices is not None:
        out["gpu_hour_price"] = rate
        out["cost_usd"] = None if cost is None else round(cost, 6)
        if rate is None:
            notes.append(f"no gpu_hour price for {model_id!r} in {source or 'the price table'}")
    if notes:
        out["cost_note"] = "; ".join(notes)
    return out


def _llm_entries(usage) -> list[tuple[str, dict]]:
    """(key, usage) of a report's LLM usage: one flat record, or {name: record}."""
    if not isinstance(usage, dict):
        return []
    entries = [("", usage)] if "calls" in usage else list(usage.items())
    return [(str(k), u) for k, u in entries if isinstance(u, dict) and "calls" in u]


def _cost_cell(u: dict) -> str:
    """The cost, "no price" (None), or "–" when no price table was given."""
    return format_cost(u["cost_usd"]) if "cost_usd" in u else "–"


def _number(value, digits: int = 4) -> str:
    return "–" if value is None else f"{float(value):.{digits}g}" if isinstance(value, float) else str(value)


def _gpu_hours_cell(u: dict) -> str:
    if u.get("gpus") is None:
        return "unknown"
    hours = f"{u['gpu_hours']:.4g}" if u.get("gpu_hours") else "0"
    return f"{hours} (CPU)" if u["gpus"] == 0 else hours


def cost_rows(report: dict, name=str) -> list[list[str]]:
    """One row per judge of a job report: its LLM usage entries (kind "tokens": calls,
    prompt + completion tokens the model answered, summed call seconds) and its reward
    model (`usage_disc`, kind "GPU-hours": pairs, wall seconds, GPU-hours). Cells are
    plain text; `name` formats the model names (e.g. as inline code)."""
    rows = []
    for key, u in _llm_entries(report.get("usage")):
        label = ROLES.get(key, key)
        tokens = int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)
        rows.append([f"{label} {name(u['model'])}" if u.get("model") else label, "tokens", f"{u.get('calls', 0)} calls",
                     str(tokens), _number(u.get("seconds"), 6), "–", _cost_cell(u)])
    disc = report.get("usage_disc")
    if isinstance(disc, dict):
        rows.append([f"reward model {name(disc['model'])}" if disc.get("model") else "reward model", "GPU-hours",
                     f"{disc.get('pairs', 0)} pairs", "–", _number(disc.get("seconds"), 6),
                     _gpu_hours_cell(disc), _cost_cell(disc)])
    return rows


def cost_note(report: dict) -> str:
    """What the cost table's numbers mean, and where they come from."""
    disc = report.get("usage_disc") if isinstance(report.get("usage_disc"), dict) else {}
    where = ""
    if disc.get("devices") is not None:
        where = f" (on {', '.join(disc['devices']) or 'no device'}: {disc.get('gpus')} GPU(s))"
    parts = [f"This {TABLE3}."]
    if _llm_entries(report.get("usage")):
        parts.append("Tokens: prompt + completion tokens the LLM answered (cached calls cost nothing); its "
                     "seconds: the summed time of its calls.")
    if disc:
        parts.append(f"The reward model's seconds: the wall time of its scoring{where}; GPU-hours = seconds x "
                     "GPUs / 3600, priced at the model's gpu_hour in --price-table.")
    parts.append('"no price": the model has no such price in the table; "–" for a cost: no --price-table.')
    if disc.get("cost_note"):
        parts.append(f"Reward model: {disc['cost_note']}.")
    return " ".join(parts)


def cost_markdown(report: dict) -> str:
    """The cost table of a job report, in Markdown, with its note."""
    rows = cost_rows(report, name=lambda m: f"`{m}`")
    if not rows:
        return ""
    lines = ["Cost of the judges: tokens for the LLM judge, GPU-hours for the reward model (seed 004, "
             "Table 3):", "", "| " + " | ".join(COST_COLUMNS) + " |", "|---|---|" + "---:|" * 5]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    return "\n".join(lines + ["", cost_note(report)]) + "\n"


def reward_line(u: dict) -> str:
    """One line on the reward model's scoring, for the command's summary."""
    gpus = u.get("gpus")
    on = ", ".join(u.get("devices") or []) or "an unknown device"
    hours = ("GPU-hours unknown" if gpus is None else
             "0 GPU-hours (CPU)" if gpus == 0 else f"{gpus} GPU(s) = {u.get('gpu_hours', 0):.4g} GPU-hours")
    cost = f", cost {_cost_cell(u)}" if "cost_usd" in u else ""
    return (f"reward model {u.get('model')}: {u.get('pairs', 0)} pair(s), {u.get('scored', 0)} distinct "
            f"text(s) scored in {u.get('seconds', 0):.1f}s on {on}, {hours}{cost}")
