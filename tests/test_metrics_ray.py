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


def _export_url(ray) -> str:
    node = next(n for n in ray.nodes() if n["Alive"])
    return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"


def _exported(url: str, prefix: str) -> list[str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return []
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.slow  # Ray exports on its own interval (2 s in the suite: conftest)
def test_the_ledger_counts_checkpoints_committed_and_failed(ray_session, tmp_path):
    """What the alert rule RlgaCheckpointFailing reads (deploy/grafana/)."""
    import asyncio

    from rl_gym_actors.actors.ledger_actor import LedgerActor, ledger_name
    from rl_gym_actors.actors.runtime import RAY_NAMESPACE
    from rl_gym_actors.config import LedgerConfig, TryPolicy
    from rl_gym_actors.errors import CheckpointFailed
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.testing.gym_process import GymServerThread
    from rl_gym_actors.testing.polling import soon

    with GymServerThread(token="test-token") as server:
        ledger = LedgerActor.options(
            name=ledger_name("metrics-ck"), namespace=RAY_NAMESPACE
        ).remote([server.endpoint], TryPolicy(control_s=5.0), LedgerConfig())
        ray_session.get(ledger.checkpoint.remote("m-ok", str(tmp_path / "ok"), 30.0))

        async def hold(call: str) -> None:
            async with GymClient(server.endpoint) as client:
                await getattr(client, call)("someone-else", deadline_ts=soon())

        asyncio.run(hold("prepare"))  # another checkpoint holds the server
        with pytest.raises(CheckpointFailed):
            ray_session.get(ledger.checkpoint.remote("m-fail", str(tmp_path / "fail"), 1.0))
        asyncio.run(hold("resume"))
        ray_session.kill(ledger)

    url = _export_url(ray_session)

    def both() -> dict[str, float]:
        lines = _exported(url, "ray_rlga_checkpoints_total{")
        found = {
            r: float(line.rsplit(" ", 1)[1])
            for line in lines
            for r in ("committed", "failed")
            if f'result="{r}"' in line
        }
        return found if len(found) == 2 else {}

    found = wait_for(both, timeout_s=60, interval_s=0.5, what="ray_rlga_checkpoints_total")
    assert found["committed"] >= 1 and found["failed"] >= 1
