"""Faults heal without a person (issue 16), over a real network fault: a partition (a TCP proxy
that swallows all traffic, testing/partition.py) during a checkpoint leaves Gym closed only until
it heals. Gym is our server in a subprocess, with its default lease and with none (as a real
Gym). tests/test_heal.py has the same with Gym frozen (SIGSTOP)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.partition import PartitionProxy
from rl_gym_actors.testing.polling import scaled, until

pytestmark = [pytest.mark.ray]

POLICY = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=3, control_s=3.0)
HEALED_WITHIN_S = 15.0


def soon(seconds: float = 5.0) -> float:
    return time.time() + scaled(seconds)


async def _state(client: GymClient) -> str:
    return (await client.status("probe", deadline_ts=soon())).state


@pytest.mark.slow
@pytest.mark.parametrize("lease", ["default lease", "no lease"])
async def test_a_partition_during_a_checkpoint_heals_on_its_own(ray_session, tmp_path, lease):
    from rl_gym_actors.orchestrator import Orchestrator

    args = ["--checkpoint-lease-s", "0"] if lease == "no lease" else []
    server = GymServerProcess(token="t", args=args).start()
    try:
        with PartitionProxy(server.url) as proxy:
            async with (
                GymClient(server.endpoint) as direct,  # beside the partition: what Gym says
                Orchestrator(
                    [proxy.endpoint("t")],
                    policy=POLICY,
                    pool_size=1,
                    run_id="heal",
                    progress=False,
                ) as orch,
            ):
                outcomes = await orch.arun_batch([{"reward": 1.0} for _ in range(4)])
                assert [o.status for o in outcomes] == ["sealed"] * 4
                slow = asyncio.ensure_future(orch.arun_batch([{"reward": 1.0, "sleep_s": 2.0}]))
                await until(
                    lambda: _running(direct), what="the slow row to run", timeout_s=scaled(20)
                )
                first = asyncio.ensure_future(
                    orch.acheckpoint("heal-1", str(tmp_path / "1"), deadline_s=3.0)
                )
                await until(
                    lambda: _preparing(direct), interval_s=0.02, what="the checkpoint to prepare"
                )
                proxy.partition()  # the checkpoint's later calls, its resume too, are swallowed
                with pytest.raises(CheckpointFailed):
                    await first
                assert await _state(direct) == "preparing"  # Gym is closed: the fault's mark
                proxy.heal()
                healed = time.monotonic()

                async def accepting() -> bool:
                    return await _state(direct) == "accepting"

                # no person, no call of ours: the ledger's background resume reopens Gym
                await until(accepting, timeout_s=HEALED_WITHIN_S, what="Gym to accept again")
                reopened = time.monotonic() - healed
                report = await orch.acheckpoint("heal-2", str(tmp_path / "2"), deadline_s=10.0)
                committed = time.monotonic() - healed
                assert report.endpoints[0].commit is not None
                assert committed < HEALED_WITHIN_S, (reopened, committed)
                row = (await slow)[0]
                assert row.status == "sealed" or row.reason, row
                status = await direct.status("probe-end", deadline_ts=soon())
                assert status.state == "accepting"
    finally:
        server.kill()


async def _running(client: GymClient) -> bool:
    return (await client.status("probe", deadline_ts=soon())).running >= 1


async def _preparing(client: GymClient) -> bool:
    return await _state(client) == "preparing"
