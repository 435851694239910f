"""The pairwise evaluators by name: who gives the verdict on a pair of explanations.

`rexeval judge pairwise` (each system against a baseline) and `judge detect` (a good
explanation against a worse one) hand every evaluator of `--evaluator` the same pairs
(`pairwise.PAIR_COLUMNS`: pair_id, user_profile, item_description, explanation_a,
explanation_b) and get back one verdict row per pair (`Judged`): pair_id, verdict (A, B,
C for a tie, or None when unreadable), then per-criterion verdict_<criterion> columns and
whatever else the evaluator records. The jobs do the rest the same way for each: the
verdicts file (`verdicts<suffix>.parquet`), the win rates and their table, the report's
fields, the win-rate study's judge label.

Built in: `gen`, the LLM judge (ALERT-Gen, `evaluators/gen.py`), and `disc`, a reward
model (ALERT-Disc, `evaluators/disc.py`). A new evaluator is one module of this folder
with an `Evaluator` class under `@register_evaluator("name")`: `--help`, the settings'
check, the jobs and `judge winrate` find it by itself.
"""
from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from rexeval.registry import Registry, declared_attributes

_HERE = "rexeval.pipelines.judge.evaluators"
_MARKER = "@register_evaluator"
BUILT_IN = ("gen", "disc")  # listed first, in this order (then the others by name)
EVALUATORS: Registry[type] = Registry("judge evaluator", lazy={"gen": f"{_HERE}.gen", "disc": f"{_HERE}.disc"},
                                      scan=(_HERE, _MARKER))
"""Pairwise evaluators by name; any module of this folder with a `@register_evaluator`
class is found when names are listed or a name is not known yet."""
register_evaluator = EVALUATORS.register


@dataclass
class JudgeRun:
    """What a judge job hands its evaluators: the job's settings and profile, its output
    folder, which job asks ("pairwise" or "detect") and where progress goes."""

    cfg: Any
    profile: Any
    root: Any  # storage.Location
    job: str
    progress: Callable[[str], None] = print


@dataclass
class Judged:
    """An evaluator's answer over the pairs: `verdicts` (pair_id, verdict, then
    verdict_<criterion> and the rest), what it cost (`usage`, the report's record), and
    any per-call rows (`detail`, written beside the verdicts by `judge pairwise`)."""

    verdicts: pd.DataFrame
    usage: dict | None = None
    detail: pd.DataFrame | None = None
    extra: dict = field(default_factory=dict)  # what its own hooks keep (e.g. the position bias, measured once)


class Evaluator(abc.ABC):
    """A pairwise evaluator. A subclass's docstring opens with what it is; `description`
    is its line in `--evaluator`'s help. `judge` is the one method it must write."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # verdicts<suffix>.parquet, and win_rates<suffix>, usage<suffix>, ... in report.json:
    # "_<name>" unless a subclass says otherwise (gen: "", as its files were first named).
    suffix: ClassVar[str | None] = None
    serves: ClassVar[str | None] = None  # the profile's LLM role it starts, which a study serves once for all
    bills_tokens: ClassVar[bool] = False  # True: its usage is an LLM's, by the token (detect's usage[<name>])

    def __init__(self, name: str):
        self.name = name

    @property
    def tag(self) -> str:
        return f"_{self.name}" if self.suffix is None else self.suffix

    @property
    def verdicts_file(self) -> str:
        return f"verdicts{self.tag}.parquet"

    @property
    def calls_file(self) -> str:
        return f"calls{self.tag}.parquet"

    def check(self, cfg) -> None:
        """Refuse settings this evaluator cannot run with (a ValueError saying what to give)."""

    @abc.abstractmethod
    def judge(self, pairs: pd.DataFrame, run: JudgeRun) -> Judged:
        """One verdict row per pair of `pairs`."""

    def who(self, cfg, judged: Judged) -> str:
        """How pairwise.md names it ("LLM judge `model`")."""
        return f"evaluator `{self.name}`"

    def label(self, report: dict) -> str:
        """The judge's name in the win-rate study, from a pairwise folder's report.json."""
        return self.name

    def report_fields(self, cfg, judged: Judged) -> dict:
        """Its own fields in a pairwise report.json, before its win rates and usage."""
        return {}

    def position_bias(self, cfg, judged: Judged) -> dict:
        """Its position-bias statistics per criterion ({} when it does not measure them)."""
        return {}

    def notes(self, report: dict) -> list[str]:
        """More of pairwise.md after its win-rate table, from the finished report."""
        return []


def evaluator(name: str) -> Evaluator:
    return EVALUATORS.lookup(name)(name)


def in_order(names) -> list[str]:
    """`names` without repeats, the built-ins first in their order, then the others by name:
    the order the jobs ask evaluators in and the win-rate study reads their files."""
    names = list(dict.fromkeys(names))
    return [n for n in BUILT_IN if n in names] + sorted(n for n in names if n not in BUILT_IN)


def evaluator_names() -> list[str]:
    """Every evaluator's name (the built-ins first), importing their modules."""
    return in_order(EVALUATORS.names())


def declared_evaluators() -> dict[str, str]:
    """name -> description of every evaluator of this folder, read from the source (no
    import): what `--help` lists."""
    found = declared_attributes(_HERE, _MARKER, ("description",))
    return {n: found[n]["description"] for n in in_order(found)}


def judge_service(cfg, spec: dict, progress, work: Callable[[str], object]):
    """Run `work(address)` with the judge service up; the spec's model becomes the
    served model's id (what prices and provenance name)."""
    from rexeval.pipelines.core.llm.chunks import JudgeService

    service = JudgeService(cfg, spec, progress)
    try:
        address = service.address()
        spec["model"] = service.model_id  # what the answers' rows name as their judge
        return work(address)
    finally:
        service.stop()


def pairwise_markdown(wins: pd.DataFrame, bias: dict, baseline: str, judge: str | None = None) -> str:
    """One evaluator's win rates against the baseline (and its position bias, if any)."""
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
