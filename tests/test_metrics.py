"""The Gym server's metrics (its snapshot collector and the ASGI middleware, in-process) and the
Ray metric wrappers outside Ray."""

from __future__ import annotations

import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rl_gym_actors.metrics import GymServerMetrics, MetricsMiddleware, RayMetric

RUN = {"route": "/run", "method": "POST"}


class _Route:
    """What Starlette's router records in ``scope["route"]`` for a matched route."""

    def __init__(self, path: str) -> None:
        self.path = path


def value(metrics: GymServerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_gym_metrics_read_the_participant_snapshot_at_scrape_time():
    snap = {
        "running": 2,
        "completed_unacknowledged": 5,
        "acknowledged": 3,  # what the store holds, from any process: not a counter
        "agent_starts": 10,
        "completions": 8,
        "acknowledgements": 3,
    }
    m = GymServerMetrics(lambda: snap)
    assert value(m, "gym_running") == 2 and value(m, "gym_runs_completed_total") == 8
    assert value(m, "gym_runs_started_total") == 10 and value(m, "gym_attempts_acked_total") == 3
    snap.update(running=0, acknowledged=9, acknowledgements=8, completed_unacknowledged=0)
    assert value(m, "gym_running") == 0 and value(m, "gym_completed_unacknowledged") == 0
    assert value(m, "gym_attempts_acked_total") == 8


def test_every_gym_counter_has_a_created_sample():
    m = GymServerMetrics(lambda: {"agent_starts": 1})
    m.observe("/run", "POST", 200, 0.01, replayed=True)
    counters = [f.name for f in m.registry.collect() if f.type == "counter"]
    assert set(counters) >= {"gym_runs_started", "gym_runs_completed", "gym_runs_replayed"}
    for name in counters:
        assert value(m, f"{name}_created") is not None, name


def test_gym_metrics_without_a_snapshot_read_zero_and_a_broken_one_is_skipped():
    assert value(GymServerMetrics(), "gym_runs_started_total") == 0

    def broken():
        raise RuntimeError("gone")

    m = GymServerMetrics(broken)
    assert value(m, "gym_running") is None and value(m, "gym_runs_replayed_total") == 0


async def _call(app, path, method="GET", route: str | None = None):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method, "headers": [], "query_string": b""}
    if route is not None:
        scope["route"] = _Route(route)  # as if the app's router matched it
    await app(scope, receive, send)
    return sent


def _answering(status, body=b"{}", headers=()):
    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})
        await send({"type": "http.response.body", "body": body})

    return inner


async def test_middleware_serves_metrics_and_labels_answers_by_the_matched_route():
    metrics = GymServerMetrics()
    ticks = iter([10.0, 10.25, 11.0, 11.5])
    app = MetricsMiddleware(_answering(409), metrics, clock=lambda: next(ticks))
    sent = await _call(app, "/run", "POST", route="/run")
    assert sent[0]["status"] == 409
    assert value(metrics, "gym_request_duration_seconds_count", **RUN, status="409") == 1
    await _call(app, "/wp-admin/../etc", "GET")  # no route matched
    assert (
        value(
            metrics, "gym_request_duration_seconds_count", route="other", method="GET", status="409"
        )
        == 1
    )
    sent = await _call(app, "/metrics")
    assert sent[0]["status"] == 200
    families = {f.name: f for f in text_string_to_metric_families(sent[1]["body"].decode())}
    sums = [
        s.value
        for s in families["gym_request_duration_seconds"].samples
        if s.name.endswith("_sum") and s.labels["route"] == "/run"
    ]
    assert sums == [0.25]


async def test_middleware_counts_replayed_runs_and_tombstoning_retires():
    metrics = GymServerMetrics()
    retire = "/ng-control/v1/agent-checkpoint/retire"
    await _call(
        MetricsMiddleware(_answering(200, headers=[(b"x-gym-replayed", b"1")]), metrics),
        "/run",
        "POST",
        route="/run",
    )
    await _call(MetricsMiddleware(_answering(200), metrics), "/run", "POST", route="/run")
    for body in (
        b'{"retired": true, "tombstoned": true}',
        b'{"retired": false, "tombstoned": false}',
        b"not json",
    ):
        await _call(MetricsMiddleware(_answering(200, body), metrics), retire, "POST", route=retire)
    assert value(metrics, "gym_runs_replayed_total") == 1
    assert value(metrics, "gym_attempts_retired_total") == 1


async def test_middleware_records_500_when_the_app_raises():
    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    metrics = GymServerMetrics()
    app = MetricsMiddleware(broken, metrics)
    with pytest.raises(RuntimeError):
        await _call(app, "/run", "POST", route="/run")
    assert value(metrics, "gym_request_duration_seconds_count", **RUN, status="500") == 1


def test_ray_metric_outside_ray_keeps_a_local_tally_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    m = RayMetric("counter", "rlga_test_local_total", "test", ("endpoint",))
    m.inc(tags={"endpoint": "http://x"})
    m.inc(2)
    m.inc(0)  # nothing to count: no call into Ray at all
    assert m.local_total == 3
    assert not m.enabled
    assert "ray" not in sys.modules
    with pytest.raises(ValueError):
        RayMetric("summary", "x", "")


def test_a_coalescing_counter_sends_one_sum_per_tag_set_per_interval():
    """coalesce_s: the first increment after a quiet spell goes out at once, the next ones are
    summed per tag set and go out with the first increment past the interval or with a flush;
    the local tally counts every increment as it comes."""
    from rl_gym_actors.metrics import RayMetric

    class Recorder:
        def __init__(self) -> None:
            self.sent: list[tuple[float, dict]] = []

        def inc(self, value: float, tags: dict) -> None:
            self.sent.append((value, tags))

    now = [100.0]
    backing = Recorder()

    class Coalescing(RayMetric):
        def _resolve(self):  # a Ray metric stand-in: what this wrapper sends it is the point
            return backing

    m = Coalescing(
        "counter",
        "rlga_test_coalesced_total",
        "t",
        ("endpoint",),
        coalesce_s=1.0,
        clock=lambda: now[0],
    )
    m.inc(tags={"endpoint": "a"})
    assert backing.sent == [(1.0, {"endpoint": "a"})]
    m.inc(tags={"endpoint": "a"})
    m.inc(2, tags={"endpoint": "b"})
    m.inc(tags={"endpoint": "a"})
    assert len(backing.sent) == 1 and m.local_total == 5
    now[0] += 1.5
    m.inc(tags={"endpoint": "b"})
    assert sorted(backing.sent[1:], key=lambda s: s[1]["endpoint"]) == [
        (2.0, {"endpoint": "a"}),
        (3.0, {"endpoint": "b"}),
    ]
    m.inc(tags={"endpoint": "a"})
    m.flush()
    assert backing.sent[-1] == (1.0, {"endpoint": "a"}) and len(backing.sent) == 4
    m.flush()
    assert len(backing.sent) == 4  # nothing held: nothing sent
