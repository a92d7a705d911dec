"""A checkpoint id that holds a Gym server (its driver died between prepare and resume) is named
by the conflict it causes, and ``Orchestrator.abort_checkpoint`` frees the server."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.errors import CheckpointConflict, CheckpointFailed
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import scaled, until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=3.0)


def soon(seconds: float = 10.0) -> float:
    return time.time() + scaled(seconds)  # stretched by the machine's load


async def hold_server(client: GymClient, checkpoint_id: str) -> asyncio.Future:
    """Leave the server preparing under ``checkpoint_id`` (a run keeps it from getting ready),
    as a driver killed between prepare and resume does."""
    run = asyncio.ensure_future(
        client.run(
            {"sleep_s": 30.0}, rollout_id="gone-run-0", attempt_index=0, deadline_ts=soon(60)
        )
    )

    async def started() -> bool:
        return (await client.status("probe", deadline_ts=soon())).running >= 1

    await until(started, what="the run to start")
    status = await client.prepare(checkpoint_id, deadline_ts=soon(1.0))
    assert not status.ready_to_commit
    return run


async def test_the_id_in_the_way_is_named_and_abort_frees_the_server(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    with GymServerThread(token="test-token") as server:
        endpoint = GymEndpoint(url=server.url, token=server.token, name="g")
        async with (
            GymClient(endpoint) as client,
            Orchestrator(
                [endpoint], policy=POLICY, pool_size=1, run_id="me", progress=False, start=False
            ) as orch,
        ):
            run = await hold_server(client, "dead-driver-ckpt")

            with pytest.raises(CheckpointConflict) as conflict:
                await client.prepare("someone-else", deadline_ts=soon(2))
            assert conflict.value.active_checkpoint_id == "dead-driver-ckpt"

            await orch.astart()  # its actors' start is no part of the checkpoint's deadline
            start = time.monotonic()
            with pytest.raises(CheckpointFailed) as failed:
                await orch.acheckpoint("mine-0", str(tmp_path / "0"), deadline_s=1.5)
            # its deadline, plus a slack stretched by the load (3.8 s at load 35, unscaled)
            assert time.monotonic() - start < 1.5 + scaled(0.5)
            assert failed.value.blockers["g"]["active_checkpoint_id"] == "dead-driver-ckpt"

            report = await orch.aabort_checkpoint("dead-driver-ckpt")
            assert report.aborted and report.endpoints[0].resumed
            assert (await client.status("probe-2", deadline_ts=soon())).state == "accepting"
            again = await orch.aabort_checkpoint("dead-driver-ckpt")  # repeatable
            assert again.aborted

            # the dead driver's run is another run's: only a sweep retires it
            with pytest.raises(CheckpointFailed) as blocked:
                await orch.acheckpoint("mine-1", str(tmp_path / "1"), deadline_s=1.0)
            attempts = blocked.value.blockers["g"]["attempts"]
            assert attempts == [
                {
                    "rollout_id": "gone-run-0",
                    "attempt_index": 0,
                    "state": "running",
                    "foreign": True,
                }
            ]
            outcomes = await orch.arun_batch([{"reward": 0.5}, {"reward": 0.25}])
            assert [o.status for o in outcomes] == ["sealed", "sealed"]
            assert all(o.rollout_id.startswith("me-") for o in outcomes)
            committed = await orch.acheckpoint(
                "mine-2", str(tmp_path / "2"), deadline_s=10.0, sweep_foreign=True
            )
            assert committed.retired == 1
            run.cancel()


async def test_abort_reports_an_endpoint_it_cannot_reach(ray_session):
    from rl_gym_actors.orchestrator import Orchestrator

    with GymServerThread(token="test-token") as server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with Orchestrator(
            [endpoint], policy=POLICY, pool_size=1, progress=False, start=False
        ) as orch:
            await orch.astart()
            server.kill()
            report = await orch.aabort_checkpoint("never-held", deadline_s=1.0)
            assert not report.aborted
            [entry] = report.endpoints
            # refused (LOST), or, on a loaded machine, the 1 s deadline ran out first while the
            # idempotent resume was retried (DEADLINE): either way typed, never a hang
            assert entry.failure in {FailureKind.LOST, FailureKind.DEADLINE}, entry
            assert entry.error
