"""The actors' Ray metrics: recorded through ray.util.metrics inside a Ray worker, and exported by
Ray's metrics agent (``ray[default]``) on the node's metrics export port as ``ray_rlga_*``."""

from __future__ import annotations

import urllib.request

import pytest

from rl_gym_actors.testing.polling import wait_for

pytestmark = pytest.mark.ray

ENDPOINT = "http://127.0.0.1:1"


def test_wrappers_are_backed_by_ray_metrics_inside_a_worker(ray_session):
    @ray_session.remote(num_cpus=0)
    def record() -> tuple[bool, float, str, float]:
        from rl_gym_actors import metrics

        metrics.TRIES.inc(tags={"endpoint": ENDPOINT})
        metrics.TRIES.inc(2, tags={"endpoint": ENDPOINT})
        metrics.CHECKPOINT_PREPARE_SECONDS.observe(0.25)
        return (
            metrics.TRIES.enabled,
            metrics.TRIES.local_total,
            type(metrics.TRIES._metric).__name__,
            metrics.CHECKPOINT_PREPARE_SECONDS.local_total,
        )

    enabled, total, kind, prepare_s = ray_session.get(record.remote())
    assert enabled and kind == "Counter"
    assert total == 3 and prepare_s == 0.25


@pytest.mark.slow  # Ray exports on its own interval (2 s in the suite: conftest)
def test_an_rlga_metric_reaches_rays_metrics_endpoint(ray_session):
    @ray_session.remote(num_cpus=0)
    def record() -> None:
        from rl_gym_actors import metrics

        metrics.SEALS.inc(5, tags={"endpoint": ENDPOINT})

    ray_session.get(record.remote())
    node = next(n for n in ray_session.nodes() if n["Alive"])
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"

    def exported() -> list[str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            return []
        return [
            line
            for line in text.splitlines()
            if line.startswith("ray_rlga_seals_total{") and f'endpoint="{ENDPOINT}"' in line
        ]

    lines = wait_for(exported, timeout_s=60, interval_s=0.5, what="ray_rlga_seals_total")
    assert float(lines[0].rsplit(" ", 1)[1]) >= 5
