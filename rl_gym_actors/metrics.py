"""Metrics: a tiny Prometheus text registry for the Gym server, and Ray metrics for the actors.

Two halves, no new dependency:

- :class:`Registry` holds counters, gauges and histograms and renders them in the Prometheus
  text exposition format (version 0.0.4). :class:`GymServerMetrics` is the set the Gym server
  serves on ``GET /metrics``: runs started, completed and replayed, attempts retired and ACKed,
  the running and un-ACKed gauges, and the request latency histogram.
  :class:`MetricsMiddleware` is a plain ASGI wrapper (no web-framework import) that answers
  ``GET /metrics`` itself and observes every other answer, so a server needs one line for it.
- :class:`RayMetric` wraps ``ray.util.metrics`` for the rollout and ledger actors (tries, seals,
  adoptions, orphans ACKed, checkpoint prepare time). Outside a Ray worker or driver it records
  only a local tally and never imports Ray; a failure to record is logged and swallowed, so a
  metric can never break the code it measures.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rl_gym_actors.protocol import CAPABILITIES_PATH, CONTROL_PREFIX, REPLAYED_HEADER

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_PATH = "/metrics"

# Seconds; fits HTTP control calls (milliseconds) and agent runs (seconds to minutes).
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

LabelValues = tuple[str, ...]


# ---------------------------------------------------------------- text exposition helpers

def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _labels(names: Sequence[str], values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
    pairs = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values)]
    if extra is not None:
        pairs.append(f'{extra[0]}="{_escape_label(extra[1])}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _valid_name(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] in "_:") and all(
        c.isalnum() or c in "_:" for c in name)


# ---------------------------------------------------------------- metric kinds

class _Metric(ABC):
    kind = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _valid_name(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _valid_name(label) or label.startswith("__") or label == "le":
                raise ValueError(f"invalid label name {label!r}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Mapping[str, str] | None) -> LabelValues:
        labels = labels or {}
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}",
                *self._samples()]

    @abstractmethod
    def _samples(self) -> list[str]:
        """The sample lines, without HELP and TYPE."""


class _ValueMetric(_Metric):
    """A counter or gauge: one value per label set, or one read from a function at scrape time."""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[LabelValues, float] = {}
        self._fn: Callable[[], float] | None = None
        if not self.labelnames:
            self._values[()] = 0.0

    def set_function(self, fn: Callable[[], float]) -> None:
        """Read the (unlabelled) value from ``fn`` at every scrape (a counter's must not go down)."""
        if self.labelnames:
            raise ValueError(f"set_function needs a {self.kind} without labels")
        self._fn = fn

    def _add(self, amount: float, labels: Mapping[str, str] | None) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        if self._fn is not None:
            return float(self._fn())
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def _samples(self) -> list[str]:
        if self._fn is not None:
            try:
                return [f"{self.name} {_format_value(float(self._fn()))}"]
            except Exception:  # a broken callback must not break the scrape
                logger.debug("metric %s callback failed", self.name, exc_info=True)
                return []
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labelnames, k)} {_format_value(v)}" for k, v in items]


class Counter(_ValueMetric):
    """A monotonically increasing count. Names end in ``_total`` by convention."""

    kind = "counter"

    def inc(self, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self._add(amount, labels)


class Gauge(_ValueMetric):
    """A value that goes up and down; or, with :meth:`set_function`, one read at scrape time."""

    kind = "gauge"

    def set(self, value: float, labels: Mapping[str, str] | None = None) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        self._add(-amount, labels)


class Histogram(_Metric):
    """Counts of observations in cumulative ``le`` buckets, plus their sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (),
                 buckets: Iterable[float] = LATENCY_BUCKETS) -> None:
        super().__init__(name, help, labelnames)
        bounds = sorted(float(b) for b in buckets if not math.isinf(float(b)))
        if not bounds:
            raise ValueError("a histogram needs at least one finite bucket")
        self.buckets: tuple[float, ...] = (*bounds, math.inf)
        # per label set: [count per bucket (not cumulative)..., sum]
        self._data: dict[LabelValues, list[float]] = {}

    def observe(self, value: float, labels: Mapping[str, str] | None = None) -> None:
        key = self._key(labels)
        index = next(i for i, b in enumerate(self.buckets) if value <= b)
        with self._lock:
            row = self._data.setdefault(key, [0.0] * (len(self.buckets) + 1))
            row[index] += 1
            row[-1] += value

    def count(self, labels: Mapping[str, str] | None = None) -> int:
        with self._lock:
            row = self._data.get(self._key(labels))
            return int(sum(row[:-1])) if row else 0

    def _samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._data.items())
        lines = []
        for key, row in items:
            cumulative = 0.0
            for bound, n in zip(self.buckets, row[:-1]):
                cumulative += n
                le = "+Inf" if math.isinf(bound) else _format_value(bound)
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, ('le', le))} "
                             f"{_format_value(cumulative)}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_format_value(row[-1])}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} "
                         f"{_format_value(cumulative)}")
        return lines


class Registry:
    """A set of metrics rendered together. Names are unique within a registry."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def _add(self, metric: _Metric) -> Any:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name!r} is already registered")
            self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help, labelnames))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help, labelnames))

    def histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                  buckets: Iterable[float] = LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(name, help, labelnames, buckets))

    def render(self) -> str:
        """The whole registry in the Prometheus text exposition format."""
        with self._lock:
            metrics = list(self._metrics.values())
        lines: list[str] = []
        for metric in metrics:
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


def parse_exposition(text: str) -> dict[str, float]:
    """Samples of a text exposition as ``{'name{labels}': value}`` (comments skipped).

    Small and strict enough for tests and the CLI; not a full Prometheus parser.
    """
    samples: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        samples[series] = float(value)
    return samples


# ---------------------------------------------------------------- the Gym server's set

KNOWN_ROUTES = frozenset({"/run", CAPABILITIES_PATH, METRICS_PATH, *(
    f"{CONTROL_PREFIX}/{name}" for name in ("acknowledge", "acknowledge-completed", "retire",
                                            "status", "prepare", "commit", "resume",
                                            "receipt"))})
RETIRE_ROUTE = f"{CONTROL_PREFIX}/retire"


class GymServerMetrics:
    """What the Gym server exposes on ``/metrics``.

    Counts that the participant keeps are read from ``snapshot_fn`` at scrape time, so they are
    exact whoever caused them (a run whose caller went away still counts): ``agent_starts``
    (runs started), ``completed_unacknowledged`` + ``acknowledged`` (runs completed),
    ``acknowledged`` (attempts ACKed), ``running`` and ``completed_unacknowledged`` (gauges).
    What only the HTTP answers show is counted by :class:`MetricsMiddleware`: ``/run`` answers
    replayed from the store, retires that tombstoned an attempt, and request latency.
    A snapshot key that is missing reads as 0.
    """

    def __init__(self, snapshot_fn: Callable[[], Mapping[str, Any]] | None = None, *,
                 registry: Registry | None = None, prefix: str = "gym") -> None:
        self.registry = registry or Registry()
        r, p = self.registry, prefix
        snap = snapshot_fn or (lambda: {})
        runs_started = r.counter(f"{p}_runs_started_total", "Agent runs started.")
        runs_completed = r.counter(f"{p}_runs_completed_total",
                                   "Agent runs that finished with a stored reply.")
        self.runs_replayed = r.counter(f"{p}_runs_replayed_total",
                                       "/run answers served from the store (the agent did not run).")
        self.retired = r.counter(f"{p}_attempts_retired_total",
                                 "retire calls that tombstoned an attempt (cancelled or unknown).")
        acked = r.counter(f"{p}_attempts_acked_total", "Completed attempts released by an ACK.")
        running = r.gauge(f"{p}_running", "Agent runs in progress.")
        unacked = r.gauge(f"{p}_completed_unacknowledged", "Completed attempts not yet ACKed.")
        runs_started.set_function(lambda: _field(snap(), "agent_starts"))
        runs_completed.set_function(lambda: _field(snap(), "completed_unacknowledged")
                                    + _field(snap(), "acknowledged"))
        acked.set_function(lambda: _field(snap(), "acknowledged"))
        running.set_function(lambda: _field(snap(), "running"))
        unacked.set_function(lambda: _field(snap(), "completed_unacknowledged"))
        self.latency = r.histogram(f"{p}_request_duration_seconds",
                                   "HTTP request latency by route, method and status.",
                                   ("route", "method", "status"))

    def observe(self, route: str, method: str, status: int, seconds: float, *,
                replayed: bool = False, body: bytes | None = None) -> None:
        """One HTTP answer: its latency, and what it says (replayed run, tombstoning retire)."""
        self.latency.observe(seconds, {"route": route, "method": method, "status": str(status)})
        if status != 200:
            return
        if route == "/run" and replayed:
            self.runs_replayed.inc()
        elif route == RETIRE_ROUTE and body:
            try:
                answer = json.loads(body)
            except ValueError:
                return
            if isinstance(answer, dict) and answer.get("tombstoned") is True:
                self.retired.inc()

    def render(self) -> str:
        return self.registry.render()


def _field(obj: Any, name: str) -> float:
    value = obj.get(name, 0) if isinstance(obj, Mapping) else getattr(obj, name, 0)
    return float(value or 0)


def route_label(path: str) -> str:
    """The route label of a request path: one of ours, else ``other`` (bounded cardinality)."""
    return path if path in KNOWN_ROUTES else "other"


class MetricsMiddleware:
    """ASGI wrapper: serves ``GET /metrics`` and reports every other HTTP answer to ``metrics``.

    Add it with ``app.add_middleware(MetricsMiddleware, metrics=GymServerMetrics(...))``. The
    exposition is unauthenticated, as scrapers expect; it carries counts only.
    """

    def __init__(self, app: Any, metrics: GymServerMetrics, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.app = app
        self.metrics = metrics
        self._clock = clock

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        method = scope.get("method", "")
        if path == METRICS_PATH and method in ("GET", "HEAD"):
            body = self.metrics.render().encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", CONTENT_TYPE.encode()),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body if method == "GET" else b""})
            return
        route = route_label(path)
        keep_body = route == RETIRE_ROUTE
        started = self._clock()
        status = 500
        replayed = False
        chunks: list[bytes] = []

        async def observed_send(message: dict) -> None:
            nonlocal status, replayed
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 500))
                replayed = any(k.lower() == REPLAYED_HEADER.encode() and v.strip() == b"1"
                               for k, v in message.get("headers") or [])
            elif keep_body and message.get("type") == "http.response.body":
                chunks.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            self.metrics.observe(route, method, status, self._clock() - started,
                                 replayed=replayed, body=b"".join(chunks) if keep_body else None)


# ---------------------------------------------------------------- Ray metrics for the actors

def _ray_running() -> Any:
    """The ``ray`` module when this process is a connected Ray worker or driver, else None.

    Never imports Ray itself: a process that has not imported it is not in Ray.
    """
    ray = sys.modules.get("ray")
    try:
        return ray if ray is not None and ray.is_initialized() else None
    except Exception:
        return None


class RayMetric:
    """A ``ray.util.metrics`` counter, gauge or histogram, created on first use.

    Outside Ray it only keeps a local tally (``local_total``), so actor code can record
    unconditionally and tests can read what was recorded in this process.
    """

    def __init__(self, kind: str, name: str, description: str, tag_keys: Sequence[str] = (),
                 boundaries: Sequence[float] | None = None) -> None:
        if kind not in ("counter", "gauge", "histogram"):
            raise ValueError(f"unknown metric kind {kind!r}")
        if not _valid_name(name):
            raise ValueError(f"invalid metric name {name!r}")
        self.kind = kind
        self.name = name
        self.description = description
        self.tag_keys = tuple(tag_keys)
        self.boundaries = list(boundaries or LATENCY_BUCKETS)
        self.local_total = 0.0
        self._metric: Any = None
        self._failed = False
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """True once a real Ray metric backs this wrapper in this process."""
        return self._resolve() is not None

    def _resolve(self) -> Any:
        if self._metric is not None or self._failed:
            return self._metric
        if _ray_running() is None:
            return None
        with self._lock:
            if self._metric is None and not self._failed:
                try:
                    from ray.util import metrics as ray_metrics

                    if self.kind == "counter":
                        self._metric = ray_metrics.Counter(self.name, self.description,
                                                           tag_keys=self.tag_keys)
                    elif self.kind == "gauge":
                        self._metric = ray_metrics.Gauge(self.name, self.description,
                                                         tag_keys=self.tag_keys)
                    else:
                        self._metric = ray_metrics.Histogram(self.name, self.description,
                                                             boundaries=self.boundaries,
                                                             tag_keys=self.tag_keys)
                except Exception:
                    self._failed = True
                    logger.debug("cannot create Ray metric %s", self.name, exc_info=True)
        return self._metric

    def _tags(self, tags: Mapping[str, str] | None) -> dict[str, str] | None:
        if not self.tag_keys:
            return None
        tags = tags or {}
        return {k: str(tags.get(k, "")) for k in self.tag_keys}

    def record(self, value: float = 1.0, tags: Mapping[str, str] | None = None) -> None:
        """inc for a counter (a count of 0 records nothing), set for a gauge, observe for a
        histogram."""
        if self.kind == "counter" and value <= 0:
            return
        if self.kind == "gauge":
            self.local_total = float(value)
        else:
            self.local_total += float(value)
        metric = self._resolve()
        if metric is None:
            return
        try:
            if self.kind == "counter":
                metric.inc(value, tags=self._tags(tags))
            elif self.kind == "gauge":
                metric.set(value, tags=self._tags(tags))
            else:
                metric.observe(value, tags=self._tags(tags))
        except Exception:
            logger.debug("recording Ray metric %s failed", self.name, exc_info=True)

    inc = record
    set = record
    observe = record


TRIES = RayMetric("counter", "rlga_tries_total", "Tries started by rollout actors.", ("endpoint",))
SEALS = RayMetric("counter", "rlga_seals_total", "Replies sealed by rollout actors.", ("endpoint",))
ADOPTIONS = RayMetric("counter", "rlga_adoptions_total",
                      "Finished tries adopted (replayed, sealed, ACKed) instead of rerun.",
                      ("endpoint",))
ORPHANS_ACKED = RayMetric("counter", "rlga_orphans_acked_total",
                          "Completed attempts with no owner that the ledger ACKed.", ("endpoint",))
CHECKPOINT_PREPARE_SECONDS = RayMetric(
    "histogram", "rlga_checkpoint_prepare_seconds",
    "Time from a checkpoint's start to every endpoint being ready to commit.",
    boundaries=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0))
