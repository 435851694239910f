"""A small name -> metadata registry for metrics.

Reporting code (tables, significance stars, "best" markers) needs to know, for a
metric name, whether higher is better and what it consumes, without importing the
function that computes it. Metric modules decorate their functions with
`register_metric`; everything else asks `get_metric` / `list_metrics`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

KINDS = ("per_example", "corpus")

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class MetricInfo:
    """What a report needs to know about a metric.

    kind is "per_example" (one value per interaction, averaged later and usable in
    paired tests) or "corpus" (one value for a whole run).
    """

    name: str
    higher_is_better: bool
    kind: str
    inputs: tuple[str, ...]
    description: str


METRICS: dict[str, MetricInfo] = {}
_FUNCTIONS: dict[str, Callable] = {}


def _same_function(f: Callable, g: Callable) -> bool:
    """Identity, or the same definition seen again (e.g. after a module reload)."""
    if f is g:
        return True
    name_f = (getattr(f, "__module__", None), getattr(f, "__qualname__", None))
    name_g = (getattr(g, "__module__", None), getattr(g, "__qualname__", None))
    return name_f == name_g and name_f[1] is not None and "<lambda>" not in name_f[1]


def register_metric(
    name: str,
    *,
    higher_is_better: bool = True,
    kind: str = "per_example",
    inputs: tuple[str, ...] = (),
    description: str = "",
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
        known = _FUNCTIONS.get(name)
        if known is not None and not _same_function(known, fn):
            raise ValueError(
                f"metric {name!r} is already registered by "
                f"{getattr(known, '__module__', '?')}.{getattr(known, '__qualname__', '?')}"
            )
        info = MetricInfo(
            name=name,
            higher_is_better=bool(higher_is_better),
            kind=kind,
            inputs=tuple(inputs),
            description=description,
        )
        METRICS[name] = info
        _FUNCTIONS[name] = fn
        fn.metric_info = info
        return fn

    return wrap


def get_metric(name: str) -> MetricInfo:
    """The info for `name`; the KeyError lists what is known to ease typos."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; known: {sorted(METRICS)}") from None


def list_metrics(kind: str | None = None) -> list[str]:
    """Sorted registered names, optionally only those of one kind."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown metric kind {kind!r}; expected one of {KINDS}")
    return sorted(n for n, info in METRICS.items() if kind is None or info.kind == kind)
