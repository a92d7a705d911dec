"""The Prometheus text registry, the ASGI middleware, the Ray wrappers outside Ray, the progress bar."""

from __future__ import annotations

import io
import math
import sys

import pytest

from rl_gym_actors.metrics import (
    CONTENT_TYPE,
    GymServerMetrics,
    MetricsMiddleware,
    RayMetric,
    Registry,
    parse_exposition,
)
from rl_gym_actors.progress import ProgressBar, progress_wanted


def test_render_counter_gauge_histogram_in_exposition_format():
    reg = Registry()
    c = reg.counter("x_total", "Things.\nSecond line", ("kind",))
    g = reg.gauge("y", "Level.")
    h = reg.histogram("lat_seconds", "Latency.", buckets=(0.1, 1.0))
    c.inc(labels={"kind": 'a"b'})
    c.inc(2, labels={"kind": 'a"b'})
    g.set(4)
    g.dec()
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    text = reg.render()
    assert "# HELP x_total Things.\\nSecond line" in text
    assert "# TYPE lat_seconds histogram" in text
    samples = parse_exposition(text)
    assert samples['x_total{kind="a\\"b"}'] == 3
    assert samples["y"] == 3
    assert samples['lat_seconds_bucket{le="0.1"}'] == 1
    assert samples['lat_seconds_bucket{le="1"}'] == 2
    assert samples['lat_seconds_bucket{le="+Inf"}'] == 3
    assert samples["lat_seconds_count"] == 3
    assert math.isclose(samples["lat_seconds_sum"], 5.55)


def test_bad_names_labels_and_negative_counts_are_refused():
    reg = Registry()
    with pytest.raises(ValueError):
        reg.counter("bad-name", "")
    with pytest.raises(ValueError):
        reg.counter("ok_total", "", ("le",))
    c = reg.counter("ok_total", "")
    with pytest.raises(ValueError):
        reg.counter("ok_total", "")
    with pytest.raises(ValueError):
        c.inc(-1)
    with pytest.raises(ValueError):
        c.inc(labels={"unexpected": "x"})


def test_gym_metrics_read_the_participant_snapshot_at_scrape_time():
    snap = {"running": 2, "completed_unacknowledged": 5, "acknowledged": 3, "agent_starts": 10}
    m = GymServerMetrics(lambda: snap)
    first = parse_exposition(m.render())
    assert first["gym_running"] == 2 and first["gym_runs_completed_total"] == 8
    assert first["gym_runs_started_total"] == 10 and first["gym_attempts_acked_total"] == 3
    snap.update(running=0, acknowledged=8, completed_unacknowledged=0)
    later = parse_exposition(m.render())
    assert later["gym_running"] == 0 and later["gym_completed_unacknowledged"] == 0
    assert later["gym_attempts_acked_total"] == 8


def test_gym_metrics_without_a_snapshot_read_zero_and_a_broken_one_is_skipped():
    assert parse_exposition(GymServerMetrics().render())["gym_runs_started_total"] == 0

    def broken():
        raise RuntimeError("gone")

    samples = parse_exposition(GymServerMetrics(broken).render())
    assert "gym_running" not in samples and "gym_runs_replayed_total" in samples


async def _call(app, path, method="GET"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": "http", "path": path, "method": method, "headers": []}, receive, send)
    return sent


def _answering(status, body=b"{}", headers=()):
    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})
        await send({"type": "http.response.body", "body": body})
    return inner


async def test_middleware_serves_metrics_and_times_other_routes():
    metrics = GymServerMetrics()
    ticks = iter([10.0, 10.25, 11.0, 11.5])
    app = MetricsMiddleware(_answering(409), metrics, clock=lambda: next(ticks))
    sent = await _call(app, "/run", "POST")
    assert sent[0]["status"] == 409
    assert metrics.latency.count({"route": "/run", "method": "POST", "status": "409"}) == 1
    await _call(app, "/wp-admin/../etc", "GET")
    assert metrics.latency.count({"route": "other", "method": "GET", "status": "409"}) == 1
    sent = await _call(app, "/metrics")
    assert sent[0]["status"] == 200
    assert (b"content-type", CONTENT_TYPE.encode()) in sent[0]["headers"]
    samples = parse_exposition(sent[1]["body"].decode())
    assert samples['gym_request_duration_seconds_sum{route="/run",method="POST",status="409"}'] == 0.25


async def test_middleware_counts_replayed_runs_and_tombstoning_retires():
    metrics = GymServerMetrics()
    retire = "/ng-control/v1/agent-checkpoint/retire"
    await _call(MetricsMiddleware(_answering(200, headers=[(b"x-gym-replayed", b"1")]), metrics),
                "/run", "POST")
    await _call(MetricsMiddleware(_answering(200), metrics), "/run", "POST")
    for body in (b'{"retired": true, "tombstoned": true}', b'{"retired": false, "tombstoned": false}',
                 b'not json'):
        await _call(MetricsMiddleware(_answering(200, body), metrics), retire, "POST")
    assert metrics.runs_replayed.value() == 1
    assert metrics.retired.value() == 1


async def test_middleware_records_500_when_the_app_raises():
    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    metrics = GymServerMetrics()
    app = MetricsMiddleware(broken, metrics)
    with pytest.raises(RuntimeError):
        await _call(app, "/run", "POST")
    assert metrics.latency.count({"route": "/run", "method": "POST", "status": "500"}) == 1


def test_ray_metric_outside_ray_keeps_a_local_tally_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    m = RayMetric("counter", "rlga_test_local_total", "test", ("endpoint",))
    m.inc(tags={"endpoint": "http://x"})
    m.inc(2)
    m.inc(0)                                      # nothing to count: no call into Ray at all
    assert m.local_total == 3
    assert not m.enabled
    assert "ray" not in sys.modules
    with pytest.raises(ValueError):
        RayMetric("summary", "x", "")


def test_progress_bar_draws_only_on_a_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock = iter(float(i) for i in range(100))
    tty = Tty()
    bar = ProgressBar(4, stream=tty, clock=lambda: next(clock), min_interval_s=0)
    for status in ("sealed", "sealed", "failed"):
        bar.update(status, adopted=status == "failed")
    bar.update("sealed")
    bar.close()
    out = tty.getvalue()
    assert out.endswith("\n")
    last = out.strip().split("\r")[-1]
    assert "4/4" in last and "failed 1" in last and "sealed 3" in last and "adopted 1" in last
    assert "#" * 24 in last

    plain = io.StringIO()
    quiet = ProgressBar(2, stream=plain)
    quiet.update()
    quiet.close()
    assert plain.getvalue() == "" and not quiet.enabled


def test_progress_can_be_turned_off_by_environment(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress_wanted(Tty())
    monkeypatch.setenv("RLGA_PROGRESS", "0")
    assert not progress_wanted(Tty())
    assert progress_wanted(io.StringIO(), enabled=True)
