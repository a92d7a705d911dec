"""The Ray metric wrappers record real ray.util.metrics inside a Ray worker."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_wrappers_are_backed_by_ray_metrics_inside_a_worker(ray_session):
    @ray_session.remote(num_cpus=0)
    def record() -> tuple[bool, float, str, float]:
        from rl_gym_actors import metrics

        metrics.TRIES.inc(tags={"endpoint": "http://127.0.0.1:1"})
        metrics.TRIES.inc(2, tags={"endpoint": "http://127.0.0.1:1"})
        metrics.CHECKPOINT_PREPARE_SECONDS.observe(0.25)
        return (metrics.TRIES.enabled, metrics.TRIES.local_total,
                type(metrics.TRIES._metric).__name__,
                metrics.CHECKPOINT_PREPARE_SECONDS.local_total)

    enabled, total, kind, prepare_s = ray_session.get(record.remote())
    assert enabled and kind == "Counter"
    assert total == 3 and prepare_s == 0.25
