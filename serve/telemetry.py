"""The counters rexeval exports through Ray's metrics, and the Serve apps' share of them.

Every metric is declared once, as a `MetricSpec` in a module-level list: SERVE_METRICS
here (recorded in the replicas of serve/nli.py and serve/judge.py), JOB_METRICS in
pipelines/core/job_metrics.py (recorded by the job driver and the stages). Ray exports
them on each node's metrics port (`ray start --metrics-export-port`) with its `ray_`
prefix, counters with a `_total` suffix; deploy/grafana/rexeval-dashboard.json graphs
them, and a test holds the dashboard to these lists.

Recording must never cost a request or a job anything that matters: outside a Ray
process (no `ray.init`) it does nothing, the Ray metric objects are made once per
process on first use, and any error is logged once and swallowed.

What Serve answers itself never reaches a replica (a 503 when every replica's queue is
full, a 404 for an unknown route): its own `ray_serve_num_http_requests_total` and
`ray_serve_num_http_error_requests_total` count those, and the dashboard shows them.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

Kind = Literal["counter", "gauge", "histogram"]
PROMETHEUS_PREFIX = "ray_"


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its Ray name (`rexeval_...`), kind, meaning and tag keys."""

    name: str
    kind: Kind
    description: str
    tags: tuple[str, ...]
    boundaries: tuple[float, ...] = ()  # histograms only

    @property
    def exported(self) -> str:
        """The name Prometheus sees (a histogram's series add _bucket, _sum, _count)."""
        return PROMETHEUS_PREFIX + self.name + ("_total" if self.kind == "counter" else "")


def _ray_ready() -> bool:
    """Whether this process is a Ray driver or worker (only those export metrics)."""
    try:
        import ray

        return ray.is_initialized()
    except Exception:  # noqa: BLE001
        return False


def _make(spec: MetricSpec):
    from ray.util import metrics

    if spec.kind == "counter":
        return metrics.Counter(spec.name, spec.description, spec.tags)
    if spec.kind == "gauge":
        return metrics.Gauge(spec.name, spec.description, spec.tags)
    return metrics.Histogram(spec.name, spec.description, list(spec.boundaries), spec.tags)


def emit(spec: MetricSpec, metric: Any, value: float, tags: dict[str, str]) -> None:
    """Hand one value to Ray (the one place that does; tests replace it)."""
    if spec.kind == "counter":
        metric.inc(value, tags)
    elif spec.kind == "gauge":
        metric.set(value, tags)
    else:
        metric.observe(value, tags)


class MetricSet:
    """Metrics declared by specs, recorded by name; see the module docstring for why
    recording is lazy and never raises."""

    def __init__(self, specs: Iterable[MetricSpec]):
        self.specs = {s.name: s for s in specs}
        self._made: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._warned = False

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self.specs.values())

    @staticmethod
    def enabled() -> bool:
        return _ray_ready()

    def record(self, name: str, value: float | int | None, **tags: Any) -> None:
        """Add `value` to a counter (zero and None are skipped), set a gauge, or observe
        a histogram; tag values become strings."""
        spec = self.specs[name]  # a wrong name is a bug in our code: let it show in tests
        if value is None or not _ray_ready():
            return
        try:
            value = float(value)
            if spec.kind == "counter" and value <= 0:
                return
            metric = self._made.get(name)
            if metric is None:
                with self._lock:
                    metric = self._made.get(name)
                    if metric is None:
                        metric = self._made[name] = _make(spec)
            emit(spec, metric, value, {k: str(tags.get(k, "")) for k in spec.tags})
        except Exception as exc:  # noqa: BLE001  (metrics never fail the work they count)
            if not self._warned:
                self._warned = True
                log.warning("rexeval metrics: recording %s failed (%s: %s); further failures are silent",
                            name, type(exc).__name__, exc)


# -- LLM calls, wherever a model is called ------------------------------------------------

def llm_metrics(prefix: str, scope: str, who: str) -> list[MetricSpec]:
    """The three LLM metrics, declared once for every caller of a model (the jobs'
    stages, the judge deployment): `<prefix>_llm_calls` by outcome, `_llm_cache_hits`,
    `_llm_tokens` by kind, tagged with the caller's `scope` tag and the model."""
    return [
        MetricSpec(f"{prefix}_llm_calls", "counter", f"LLM calls {who}, cached ones included, by outcome (ok, error)",
                   (scope, "model", "outcome")),
        MetricSpec(f"{prefix}_llm_cache_hits", "counter", f"LLM calls {who} from the call cache", (scope, "model")),
        MetricSpec(f"{prefix}_llm_tokens", "counter",
                   f"Tokens of the LLM calls {who} (cached answers not counted), by kind (prompt, completion)",
                   (scope, "model", "kind")),
    ]


def record_llm(metrics: MetricSet, prefix: str, tags: dict[str, str], ok: int, errors: int, cache_hits: int,
               prompt_tokens: int, completion_tokens: int) -> None:
    """Record one batch of calls on `llm_metrics(prefix, ...)`; `tags`: the scope tag and model."""
    metrics.record(f"{prefix}_llm_calls", ok, **tags, outcome="ok")
    metrics.record(f"{prefix}_llm_calls", errors, **tags, outcome="error")
    metrics.record(f"{prefix}_llm_cache_hits", cache_hits, **tags)
    metrics.record(f"{prefix}_llm_tokens", prompt_tokens, **tags, kind="prompt")
    metrics.record(f"{prefix}_llm_tokens", completion_tokens, **tags, kind="completion")


# -- the Serve apps' metrics ------------------------------------------------------------

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)

SERVE_METRICS = [
    MetricSpec("rexeval_serve_requests", "counter",
               "Requests a replica answered, by route and HTTP status (handle calls: route handle.<method>; "
               "health probes are not counted)", ("app", "route", "code", "code_class")),
    MetricSpec("rexeval_serve_request_seconds", "histogram", "Time a replica took to answer a request",
               ("app", "route"), SECONDS_BUCKETS),
    MetricSpec("rexeval_serve_queue_depth", "gauge",
               "Work waiting in a replica for its batch to finish (NLI: pairs, judge: chat requests)",
               ("app", "replica")),
    MetricSpec("rexeval_serve_batch_size", "histogram",
               "Items merged into one model call (NLI: pairs, judge: chat requests)", ("app",), SIZE_BUCKETS),
    *llm_metrics("rexeval_serve", "app", "the judge answered"),
]
SERVE = MetricSet(SERVE_METRICS)


def code_class(code: int) -> str:
    """200 -> "2xx", 413 -> "4xx"."""
    return f"{int(code) // 100}xx"


def route_label(path: str, method: str, routes: dict[tuple[str, str], str | None]) -> str | None:
    """The route tag of an HTTP request: the name `routes` gives its (path below the
    app's prefix, method), None for one not counted (the health probe), "other" for
    anything else (never the raw path: that would make a series per URL a client
    makes up)."""
    return routes.get((path, method), "other")


class ReplicaMetrics:
    """One replica's recorder: its app name and replica id tag what it records, and it
    keeps the count of work waiting in it (the queue depth gauge)."""

    def __init__(self, app: str):
        self.app, self.replica = app, "local"
        try:
            from ray import serve

            ctx = serve.get_replica_context()
            self.app, self.replica = ctx.app_name or app, ctx.replica_tag
        except Exception:  # noqa: BLE001  (built outside Serve, as unit tests do)
            pass
        self.waiting = 0
        self._lock = threading.Lock()

    def request(self, route: str | None, code: int, seconds: float) -> None:
        if route is None:
            return
        SERVE.record("rexeval_serve_requests", 1, app=self.app, route=route, code=int(code),
                     code_class=code_class(code))
        SERVE.record("rexeval_serve_request_seconds", seconds, app=self.app, route=route)

    async def http(self, route: str | None, respond: Awaitable[Any]) -> Any:
        """Await `respond` (the replica's answer to one HTTP request) and count it by
        its status; an exception counts as 500."""
        code, t0 = 500, time.perf_counter()
        try:
            response = await respond
            code = response.status_code
            return response
        finally:
            self.request(route, code, time.perf_counter() - t0)

    @contextmanager
    def timed(self, route: str) -> Iterator[None]:
        """Count one handle call as 200, or as the status of the RequestError it raises
        (500 for any other exception)."""
        code, t0 = 200, time.perf_counter()
        try:
            yield
        except Exception as exc:
            code = int(getattr(exc, "status", 500))
            raise
        finally:
            self.request(route, code, time.perf_counter() - t0)

    @contextmanager
    def queued(self, n: int) -> Iterator[None]:
        """`n` items wait in this replica for the length of the block."""
        self._move(n)
        try:
            yield
        finally:
            self._move(-n)

    def _move(self, n: int) -> None:
        with self._lock:
            self.waiting += n
            depth = self.waiting
        SERVE.record("rexeval_serve_queue_depth", depth, app=self.app, replica=self.replica)

    def batch(self, size: int) -> None:
        SERVE.record("rexeval_serve_batch_size", size, app=self.app)

    def llm_results(self, model: str, results: Iterable[Any]) -> None:
        """Calls, cache hits and tokens of one generate() (LLMResult-like objects)."""
        ok = err = hits = prompt = completion = 0
        for r in results:
            if r.error is None:
                ok += 1
            else:
                err += 1
            if r.cached:
                hits += 1
            else:
                prompt += r.prompt_tokens or 0
                completion += r.completion_tokens or 0
        record_llm(SERVE, "rexeval_serve", {"app": self.app, "model": model}, ok, err, hits, prompt, completion)
