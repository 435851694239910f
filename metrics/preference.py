"""Pairwise preferences (seed 004): combining verdicts, win rates, position bias.

Verdicts are "A" (the first explanation of the pair is better), "B" (the second) or "C"
(a tie); None means no readable verdict. A judge that sees the pair in swapped order
answers in its own labels, so its answer is mapped back with `swap` before the two
orders are combined. Pure functions over lists and DataFrames: no model, no Ray.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from rexeval.metrics.aggregate import bootstrap_ci

VERDICTS = ("A", "B", "C")
DISAGREEMENT_RULES = ("tie", "first")


def swap(label: str | None) -> str | None:
    """The same verdict seen from the other presentation order."""
    return {"A": "B", "B": "A"}.get(label, label)


def majority_vote(labels: Iterable[str | None]) -> str | None:
    """Plurality over A/B/C (unreadable votes are left out); a tie for the top count
    is a tie ("C"), since no side won more criteria. None when no vote was readable.

    Seed 004 aggregates the per-criterion preferences "by majority voting" without
    saying how ties between criteria are broken; calling them a tie is the reading that
    never invents a winner.
    """
    counts = Counter(v for v in labels if v is not None)
    if not counts:
        return None
    for v in counts:
        if v not in VERDICTS:
            raise ValueError(f"unknown verdict {v!r}; expected one of {VERDICTS}")
    top = max(counts.values())
    winners = [v for v in VERDICTS if counts.get(v) == top]
    return winners[0] if len(winners) == 1 else "C"


def combine_orders(first: str | None, second_swapped_back: str | None, rule: str = "tie") -> str | None:
    """One verdict from the two presentation orders (the second already mapped back
    with `swap`). When they agree, that verdict. When they disagree, rule "tie" calls it
    a tie (the judge's preference depended on the order, so it is not a preference) and
    rule "first" keeps the first order's verdict. When only one order was readable, its
    verdict; None when neither was."""
    if rule not in DISAGREEMENT_RULES:
        raise ValueError(f"unknown disagreement rule {rule!r}; expected one of {DISAGREEMENT_RULES}")
    if first is None or second_swapped_back is None:
        return first if second_swapped_back is None else second_swapped_back
    if first == second_swapped_back:
        return first
    return "C" if rule == "tie" else first


def position_bias(first: Sequence[str | None], second_swapped_back: Sequence[str | None]) -> dict:
    """How much the verdicts depend on the order (pairs with both orders readable):
    `flip_rate` is the share whose verdict changed with the order; `first_slot_rate` the
    share of all readable non-tie verdicts that chose whichever explanation was shown
    first (0.5 for a judge without position bias)."""
    if len(first) != len(second_swapped_back):
        raise ValueError("both orders need one verdict per pair")
    both = [(a, b) for a, b in zip(first, second_swapped_back) if a is not None and b is not None]
    flips = sum(a != b for a, b in both)
    # In the first order the first slot is "A"; in the second order the explanation shown
    # first is the pair's B, i.e. a mapped-back verdict of "B" chose the first slot.
    slot_votes = [a == "A" for a in first if a in ("A", "B")]
    slot_votes += [b == "B" for b in second_swapped_back if b in ("A", "B")]
    return {"pairs_both_orders": len(both), "flips": flips,
            "flip_rate": flips / len(both) if both else float("nan"),
            "consistent_rate": 1 - flips / len(both) if both else float("nan"),
            "first_slot_rate": sum(slot_votes) / len(slot_votes) if slot_votes else float("nan"),
            "decisive_verdicts": len(slot_votes)}


def win_rates(verdicts: pd.DataFrame, system_col: str = "system", verdict_col: str = "verdict") -> pd.DataFrame:
    """Per system, the shares of its pairs against the baseline it won, lost and tied
    (seed 004, section 3.2.3), with the system's explanation in slot A of the verdict.
    Unreadable verdicts are counted apart and left out of the shares; `win_rate` is the
    share won, and `win_rate_half_ties` counts a tie as half a win."""
    rows = []
    for system, part in verdicts.groupby(system_col, sort=True):
        v = part[verdict_col]
        readable = v.dropna()
        n = len(readable)
        wins, losses, ties = (int((readable == x).sum()) for x in ("A", "B", "C"))
        rows.append({system_col: system, "n": n, "unreadable": int(v.isna().sum()),
                     "wins": wins, "losses": losses, "ties": ties,
                     "win_rate": wins / n if n else float("nan"),
                     "loss_rate": losses / n if n else float("nan"),
                     "tie_rate": ties / n if n else float("nan"),
                     "win_rate_half_ties": (wins + ties / 2) / n if n else float("nan")})
    return pd.DataFrame(rows, columns=[system_col, "n", "unreadable", "wins", "losses", "ties", "win_rate",
                                       "loss_rate", "tie_rate", "win_rate_half_ties"])


WTL_COLUMNS = ("n", "unreadable", "wins", "ties", "losses", "win_rate", "tie_rate", "loss_rate",
               "win_low", "win_high", "tie_low", "tie_high", "loss_low", "loss_high")


def win_tie_loss(verdicts: pd.DataFrame, by: Sequence[str] = ("judge", "system"), verdict_col: str = "verdict",
                 confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Wins, ties and losses per group, each share with a bootstrap interval.

    One row per group of `by` (sorted), with the system's explanation in slot A: "A" is
    a win, "B" a loss, "C" a tie (so a win of the system is a loss of the baseline).
    Unreadable verdicts (None/NaN) are counted in `unreadable` and left out of `n` and of
    the three shares. Each share gets a percentile bootstrap interval over the group's
    readable pairs (`metrics.aggregate.bootstrap_ci` on the 0/1 indicator of the
    outcome): `win_low`/`win_high`, `tie_low`/`tie_high`, `loss_low`/`loss_high`. The
    three use the same seed, hence the same resampled pairs, and are reproducible for
    a seed. An outcome that every pair (or none) had gets the point interval [p, p];
    with fewer than two readable pairs, or `n_resamples` 0, the intervals are NaN.
    """
    by = list(by)
    missing = [c for c in (*by, verdict_col) if c not in verdicts.columns]
    if missing:
        raise ValueError(f"verdicts lack column(s) {missing} (they have {list(verdicts.columns)})")
    known = set(VERDICTS)
    rows = []
    for key, part in verdicts.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        values = [None if pd.isna(v) else v for v in part[verdict_col]]
        bad = sorted({str(v) for v in values if v is not None and v not in known})
        if bad:
            raise ValueError(f"unknown verdict(s) {bad} in {verdict_col!r}; expected {VERDICTS} or None")
        readable = np.array([v for v in values if v is not None], dtype=object)
        n = len(readable)
        row = dict(zip(by, key))
        row.update(n=n, unreadable=len(values) - n)
        for name, label, count in (("win", "A", "wins"), ("tie", "C", "ties"), ("loss", "B", "losses")):
            hits = (readable == label).astype(np.float64)
            row[count] = int(hits.sum())
            row[f"{name}_rate"] = float(hits.mean()) if n else float("nan")
            low, high = bootstrap_ci(hits, confidence, n_resamples, seed) if n else (float("nan"),) * 2
            row[f"{name}_low"], row[f"{name}_high"] = low, high
        rows.append(row)
    return pd.DataFrame(rows, columns=[*by, *WTL_COLUMNS])
