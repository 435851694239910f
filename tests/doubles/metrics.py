"""Catching rexeval's metrics where they would go to Ray (`serve.telemetry.emit`), so a
test reads what a job or a replica recorded without a metrics agent to scrape."""
from __future__ import annotations

from collections import defaultdict


class Caught:
    """What would have gone to Ray: counter and histogram values summed per tag set,
    every gauge value in order, and which Ray metric objects were made."""

    def __init__(self):
        self.sums: dict[tuple, float] = defaultdict(float)
        self.gauges: dict[tuple, list[float]] = defaultdict(list)
        self.made: list[str] = []

    def emit(self, spec, metric, value, tags):
        key = (spec.name, tuple(sorted(tags.items())))
        if spec.kind == "gauge":
            self.gauges[key].append(value)
        else:
            self.sums[key] += value

    def total(self, name: str, **tags) -> float:
        """The sum over the series of `name` whose tags include `tags`."""
        return sum(v for (n, t), v in self.sums.items() if n == name and tags.items() <= dict(t).items())

    def gauge(self, name: str, **tags) -> list[float]:
        """The values set on the series of `name` whose tags include `tags`, in order."""
        return [v for (n, t), vs in self.gauges.items() if n == name and tags.items() <= dict(t).items()
                for v in vs]


def catch_metrics(monkeypatch) -> Caught:
    """Record as inside a Ray process, with the values caught instead of exported."""
    from rexeval.pipelines.core import job_metrics
    from rexeval.serve import telemetry

    caught = Caught()
    monkeypatch.setattr(telemetry, "_ray_ready", lambda: True)
    monkeypatch.setattr(telemetry, "_make", lambda spec: caught.made.append(spec.name) or object())
    monkeypatch.setattr(telemetry, "emit", caught.emit)
    for metrics in (job_metrics.JOBS, telemetry.SERVE):
        monkeypatch.setattr(metrics, "_made", {})
    return caught
