"""Metrics: Prometheus metrics of the Gym server, and Ray metrics for the actors.

- :class:`GymServerMetrics` is what the Gym server serves on ``GET /metrics``, kept in a
  ``prometheus_client`` registry of its own: runs started, completed and replayed, attempts
  retired and ACKed, the running and un-ACKed gauges, and the request latency histogram.
  :class:`MetricsMiddleware` is a plain ASGI wrapper (no web-framework import) that answers
  ``GET /metrics`` with ``prometheus_client``'s exposition and observes every other answer, so a
  server needs one line for it. Route labels are the app's own routes (``other`` for a path that
  matched none), read from the app the request reached: no route list is kept here.
- :class:`RayMetric` wraps ``ray.util.metrics`` for the rollout and ledger actors (tries, seals,
  adoptions, orphans ACKed, checkpoints by result, checkpoint prepare time). Outside a Ray
  worker or driver it records only a local tally and never imports Ray; a failure to record is
  logged and swallowed, so a metric can never break the code it measures.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rl_gym_actors.protocol import CONTROL_PREFIX, REPLAYED_HEADER

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
OTHER_ROUTE = "other"
RETIRE_ROUTE = f"{CONTROL_PREFIX}/retire"
RETIRE_BATCH_ROUTE = f"{CONTROL_PREFIX}/retire-batch"  # (ext): one answer per key
_REPLAYED = REPLAYED_HEADER.lower().encode()

# Seconds; fits HTTP control calls (milliseconds) and agent runs (seconds to minutes).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


# ---------------------------------------------------------------- the Gym server's set


class _ParticipantCounts:
    """A collector that reads the participant's snapshot at scrape time (a custom collector in
    ``prometheus_client``'s sense). A snapshot key that is missing reads as 0; a snapshot that
    raises leaves these series out of that one scrape instead of failing it."""

    def __init__(self, prefix: str, snapshot_fn: Callable[[], Mapping[str, Any]]) -> None:
        self._prefix = prefix
        self._snapshot_fn = snapshot_fn
        self._created = time.time()

    def _families(self, snap: Mapping[str, Any] | None) -> list[Metric]:
        p = self._prefix
        value = (lambda name: _field(snap, name)) if snap is not None else None
        families: list[Metric] = []
        for kind, name, text, fields in (
            (CounterMetricFamily, "runs_started", "Agent runs started.", ("agent_starts",)),
            (
                CounterMetricFamily,
                "runs_completed",
                "Agent runs that finished with a stored reply.",
                ("completions",),
            ),
            (
                CounterMetricFamily,
                "attempts_acked",
                "Completed attempts released by an ACK.",
                ("acknowledgements",),
            ),
            (GaugeMetricFamily, "running", "Agent runs in progress.", ("running",)),
            (
                GaugeMetricFamily,
                "completed_unacknowledged",
                "Completed attempts not yet ACKed.",
                ("completed_unacknowledged",),
            ),
        ):
            # counters carry the server's start as their _created sample, as the
            # prometheus_client counters beside them do
            created: dict[str, Any] = (
                {"created": self._created} if kind is CounterMetricFamily else {}
            )
            if value is None:
                families.append(kind(f"{p}_{name}", text, **created))
            else:
                families.append(kind(f"{p}_{name}", text, value=sum(map(value, fields)), **created))
        return families

    def describe(self) -> list[Metric]:
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._snapshot_fn()
        except Exception:  # a broken snapshot must not break the scrape
            logger.debug("participant snapshot failed during a scrape", exc_info=True)
            return iter(())
        return iter(self._families(snap))


class GymServerMetrics:
    """What the Gym server exposes on ``/metrics``.

    Counts that the participant keeps are read from ``snapshot_fn`` at scrape time, so they are
    exact whoever caused them (a run whose caller went away still counts): ``agent_starts``
    (runs started), ``completions`` (runs completed), ``acknowledgements`` (attempts ACKed),
    each counted by this server process since it started (a restart on a durable state dir
    starts them at 0 together, so completed never exceeds started), and the gauges ``running``
    and ``completed_unacknowledged`` (what the store holds now).
    What only the HTTP answers show is counted by :class:`MetricsMiddleware`: ``/run`` answers
    replayed from the store, retires that tombstoned an attempt, and request latency.
    """

    def __init__(
        self,
        snapshot_fn: Callable[[], Mapping[str, Any]] | None = None,
        *,
        registry: CollectorRegistry | None = None,
        prefix: str = "gym",
    ) -> None:
        self.registry = registry or CollectorRegistry()
        p = prefix
        self.registry.register(_ParticipantCounts(p, snapshot_fn or (dict)))
        self.runs_replayed = Counter(
            f"{p}_runs_replayed",
            "/run answers served from the store (the agent did not run).",
            registry=self.registry,
        )
        self.retired = Counter(
            f"{p}_attempts_retired",
            "retire calls that tombstoned an attempt (cancelled or unknown).",
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{p}_request_duration_seconds",
            "HTTP request latency by route, method and status.",
            ("route", "method", "status"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._latency: dict[tuple[str, str, int], Any] = {}  # labels() per series, once

    def observe(
        self,
        route: str,
        method: str,
        status: int,
        seconds: float,
        *,
        replayed: bool = False,
        body: bytes | None = None,
    ) -> None:
        """One HTTP answer: its latency, and what it says (replayed run, tombstoning retire)."""
        series = self._latency.get((route, method, status))
        if series is None:
            series = self.latency.labels(route=route, method=method, status=str(status))
            self._latency[(route, method, status)] = series
        series.observe(seconds)
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
        elif route == RETIRE_BATCH_ROUTE and body:
            try:
                answers = json.loads(body).get("retired")
            except (ValueError, AttributeError):
                return
            if isinstance(answers, list):
                tombstoned = sum(1 for a in answers if isinstance(a, dict) and a.get("tombstoned"))
                self.retired.inc(tombstoned)


def _field(obj: Any, name: str) -> float:
    value = obj.get(name, 0) if isinstance(obj, Mapping) else getattr(obj, name, 0)
    return float(value or 0)


def route_label(scope: Mapping[str, Any]) -> str:
    """The route label of a request, once the app has routed it: the path of the app's route
    that matched (Starlette records it in ``scope["route"]``), else ``other`` (bounded
    cardinality whatever paths clients send)."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else OTHER_ROUTE


class MetricsMiddleware:
    """ASGI wrapper: serves ``GET /metrics`` and reports every other HTTP answer to ``metrics``.

    Add it with ``app.add_middleware(MetricsMiddleware, metrics=GymServerMetrics(...))``. The
    exposition is unauthenticated, as scrapers expect; it carries counts only.
    """

    def __init__(
        self, app: Any, metrics: GymServerMetrics, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.app = app
        self.metrics = metrics
        self._exposition = make_asgi_app(metrics.registry)
        self._clock = clock

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")
        if scope.get("path", "") == METRICS_PATH and method in ("GET", "HEAD"):
            await self._exposition(scope, receive, send)
            return
        # only a retire's answers are read (whether it tombstoned); every other body streams past
        path = scope.get("path", "")
        keep_body = path in (RETIRE_ROUTE, RETIRE_BATCH_ROUTE)
        is_run = path == "/run"  # only a /run answer says whether it was replayed
        started = self._clock()
        status = 500
        replayed = False
        chunks: list[bytes] = []

        async def observed_send(message: dict) -> None:
            nonlocal status, replayed
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 500))
                replayed = is_run and any(
                    k.lower() == _REPLAYED and v.strip() == b"1"
                    for k, v in message.get("headers") or []
                )
            elif keep_body and message.get("type") == "http.response.body":
                chunks.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            self.metrics.observe(
                route_label(scope),
                method,
                status,
                self._clock() - started,
                replayed=replayed,
                body=b"".join(chunks) if keep_body else None,
            )


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

    A counter with ``coalesce_s`` sends Ray one sum per tag set per ``coalesce_s`` instead of
    one record per increment (a rollout actor counts per rollout; Ray exports every few
    seconds anyway): an increment after a quiet spell goes out at once, the next ones within
    ``coalesce_s`` wait for the next that comes later, or for :func:`flush_coalesced`, which
    the rollout actor calls every half second.
    """

    def __init__(
        self,
        kind: str,
        name: str,
        description: str,
        tag_keys: Sequence[str] = (),
        boundaries: Sequence[float] | None = None,
        *,
        coalesce_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if kind not in ("counter", "gauge", "histogram"):
            raise ValueError(f"unknown metric kind {kind!r}")
        self.kind = kind
        self.name = name
        self.description = description
        self.tag_keys = tuple(tag_keys)
        self.boundaries = list(boundaries or LATENCY_BUCKETS)
        self.local_total = 0.0
        self._metric: Any = None
        self._failed = False
        self._lock = threading.Lock()
        self._coalesce_s = coalesce_s if kind == "counter" else 0.0
        self._clock = clock
        self._held: dict[tuple[tuple[str, str], ...], float] = {}  # tag set -> sum not sent
        self._sent_at = float("-inf")
        if self._coalesce_s > 0:
            _COALESCED.append(self)

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
                        self._metric = ray_metrics.Counter(
                            self.name, self.description, tag_keys=self.tag_keys
                        )
                    elif self.kind == "gauge":
                        self._metric = ray_metrics.Gauge(
                            self.name, self.description, tag_keys=self.tag_keys
                        )
                    else:
                        self._metric = ray_metrics.Histogram(
                            self.name,
                            self.description,
                            boundaries=self.boundaries,
                            tag_keys=self.tag_keys,
                        )
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
        if self._coalesce_s > 0:
            key = tuple(sorted((self._tags(tags) or {}).items()))
            with self._lock:
                self._held[key] = self._held.get(key, 0.0) + value
                if self._clock() - self._sent_at < self._coalesce_s:
                    return
            self.flush()
            return
        self._send(metric, value, tags)

    def flush(self) -> None:
        """Send the sums a coalescing counter holds."""
        metric = self._resolve()
        with self._lock:
            held, self._held = self._held, {}
            if held:
                self._sent_at = self._clock()
        if metric is not None:
            for key, value in held.items():
                self._send(metric, value, dict(key))

    def _send(self, metric: Any, value: float, tags: Mapping[str, str] | None) -> None:
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


_COALESCED: list[RayMetric] = []  # the counters with coalesce_s, for flush_coalesced
COALESCE_S = 1.0  # a rollout actor's per-rollout counters: one Ray record a second at most


def flush_coalesced() -> None:
    """Send what every coalescing counter of this process holds."""
    for metric in _COALESCED:
        metric.flush()


TRIES = RayMetric(
    "counter",
    "rlga_tries_total",
    "Tries started by rollout actors.",
    ("endpoint",),
    coalesce_s=COALESCE_S,
)
SEALS = RayMetric(
    "counter",
    "rlga_seals_total",
    "Replies sealed by rollout actors.",
    ("endpoint",),
    coalesce_s=COALESCE_S,
)
ADOPTIONS = RayMetric(
    "counter",
    "rlga_adoptions_total",
    "Finished tries adopted (replayed, sealed, ACKed) instead of rerun.",
    ("endpoint",),
    coalesce_s=COALESCE_S,
)
ORPHANS_ACKED = RayMetric(
    "counter",
    "rlga_orphans_acked_total",
    "Completed attempts with no owner that the ledger ACKed.",
    ("endpoint",),
)
GYM_STATE_LOST = RayMetric(
    "counter",
    "rlga_gym_state_lost_total",
    "Sealed results a Gym server no longer held at a checkpoint (it lost its state).",
    ("endpoint",),
)
CHECKPOINTS = RayMetric(
    "counter",
    "rlga_checkpoints_total",
    "Checkpoints through the ledger's gate, by result (committed or failed).",
    ("result",),
)
CHECKPOINT_DRAIN_SECONDS = RayMetric(
    "histogram",
    "rlga_checkpoint_drain_seconds",
    "Agent-checkpoint protocol: time a checkpoint kept an endpoint's admission closed waiting "
    "for the runs in flight to end (0: none ran).",
    boundaries=(0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
CHECKPOINT_PREPARE_SECONDS = RayMetric(
    "histogram",
    "rlga_checkpoint_prepare_seconds",
    "Time from a checkpoint's start to every endpoint being ready to commit.",
    boundaries=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
