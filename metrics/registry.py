"""The metric registry: every metric function, by name, with what a report needs to know.

Metric modules decorate their functions with `register_metric`; the function is stored
in `METRICS` (a `rexeval.registry.Registry`) and carries its `MetricInfo` as
`fn.metric_info`. Everything that dispatches on metric names reads this registry:
reports ask for a metric's direction (`get_metric`), and `rexeval evaluate` asks which
metrics a family computes (`group_metrics`, the `group` a metric was registered with:
the metrics that one pass of one model yields together, e.g. "bertscore" for
BERTScore P/R/F1) and which are corpus-level.

Every module of this folder that calls `register_metric` is found by the registry's scan
(`rexeval.registry.Registry`'s `scan`), so a new metric file needs no list edited; with
`table=` and `label=` it also appears in `rexeval evaluate`'s tables.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from rexeval.registry import Registry

KINDS = ("per_example", "corpus")

F = TypeVar("F", bound=Callable)

TEXTS_GROUP = "texts"
"""The group of metrics that need no model: a function of (explanations, references), both
lists of strings, returning one float per example. `rexeval evaluate`'s `texts` family
computes every metric registered with it, so such a metric is one file in this folder."""


@dataclass(frozen=True)
class MetricInfo:
    """What a report needs to know about a metric.

    kind is "per_example" (one value per interaction, averaged later and usable in
    paired tests) or "corpus" (one value for a whole run); group names the metrics
    computed together (see the module docstring), None for metrics no job groups.
    table and label place the metric in `rexeval evaluate`'s tables (a seed's table
    title, or a title of its own) under a display name; None: the seed's own tables
    (`pipelines/evaluate/report.py`) already list it, or no table does.
    """

    name: str
    higher_is_better: bool
    kind: str
    inputs: tuple[str, ...]
    description: str
    group: str | None = None
    table: str | None = None
    label: str | None = None


METRICS: Registry[Callable] = Registry("metric", scan=("rexeval.metrics", "register_metric"), name_attr=None)


def register_metric(
    name: str,
    *,
    higher_is_better: bool = True,
    kind: str = "per_example",
    inputs: tuple[str, ...] = (),
    description: str = "",
    group: str | None = None,
    table: str | None = None,
    label: str | None = None,
) -> Callable[[F], F]:
    """Decorator: record `name` in METRICS and attach the info as `fn.metric_info`.

    The function is returned unchanged. A second registration of `name` by a
    different function is a ValueError, so two modules cannot silently disagree on
    what a metric means.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown metric kind {kind!r}; expected one of {KINDS}")
    if not name:
        raise ValueError("metric name must be non-empty")

    def wrap(fn: F) -> F:
        METRICS.add(name, fn)
        fn.metric_info = MetricInfo(name=name, higher_is_better=bool(higher_is_better), kind=kind,
                                    inputs=tuple(inputs), description=description, group=group,
                                    table=table, label=label)
        return fn

    return wrap


def get_metric(name: str) -> MetricInfo:
    """The info for `name`; the KeyError lists what is known to ease typos."""
    try:
        return METRICS.lookup(name).metric_info
    except ValueError as exc:
        raise KeyError(str(exc)) from None


def higher_is_better(name: str) -> bool:
    """The registry's direction for `name`; True for a metric it does not know (a user's
    own column), as the results tables and the agreement tables both assume."""
    try:
        return get_metric(name).higher_is_better
    except KeyError:
        return True


def list_metrics(kind: str | None = None) -> list[str]:
    """Sorted registered names, optionally only those of one kind."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown metric kind {kind!r}; expected one of {KINDS}")
    return sorted(n for n, fn in METRICS.items() if kind is None or fn.metric_info.kind == kind)


def group_metrics(group: str, kind: str | None = None) -> tuple[str, ...]:
    """The metrics registered with `group` (and `kind`), in registration order."""
    return tuple(n for n, fn in METRICS.items() if fn.metric_info.group == group
                 and (kind is None or fn.metric_info.kind == kind))


def reads_references(name: str) -> bool:
    """Whether metric `name` compares an explanation with a reference: one of its declared
    `inputs` names references, or it declares none (so a metric that says nothing is
    never scored against a missing reference). A texts-group function is called with
    the references either way; one whose inputs are the explanations alone
    (`inputs=("explanation",)`) runs on a table that has none."""
    inputs = get_metric(name).inputs
    return not inputs or any("reference" in i for i in inputs)


def tabled_metrics() -> list[MetricInfo]:
    """The metrics registered with a `table`, in registration order."""
    return [fn.metric_info for fn in METRICS.values() if fn.metric_info.table]
