"""The orchestrator against ``gym serve --protocol both`` (a CLI subprocess on loopback): the
server has both route sets and is spoken to with the agent-checkpoint ones (they keep every reply
until it is ACKed), so rows seal with receipts and ACKs, a lost reply is replayed with its
receipt, a deadline retires with the agent-checkpoint retire (never ``/run?replay_only=1``, which
that ``/run`` does not honour), a checkpoint mid-batch commits, and nothing stays un-ACKed.
"""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.polling import soon, until

pytestmark = [pytest.mark.ray, pytest.mark.slow]


async def test_orchestrator_on_a_both_server_speaks_agent_checkpoint(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    rows = [{"_ng_rollout_id": f"both-{i}", "sleep_s": 1.0, "reward": 0.1 * i} for i in range(3)]
    rows.append({"_ng_rollout_id": "both-lost", "sleep_s": 0.5, "reward": 0.5, "drop_reply": True})
    rows.append({"_ng_rollout_id": "both-slow", "sleep_s": 60.0, "reward": 0.9})
    policy = TryPolicy(rollout_s=4.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    with GymServerProcess(args=["--protocol", "both"], allow_faults=True) as server:
        async with (
            GymClient(server.endpoint) as client,
            Orchestrator(
                [server.endpoint],
                policy=policy,
                pool_size=1,
                rollouts_per_actor=8,
                progress=False,
                start=False,
            ) as orch,
        ):
            batch = asyncio.ensure_future(orch.arun_batch(rows))

            async def running() -> bool:
                return (await client.status("probe-both", deadline_ts=soon(5))).running >= 3

            await until(running, timeout_s=20.0, what="the batch to start")
            report = await orch.acheckpoint("both-mid", str(tmp_path / "c1"), deadline_s=30.0)
            assert report.endpoints[0].protocol == "agent"
            assert report.endpoints[0].commit is not None
            outcomes = await asyncio.wait_for(batch, 60.0)
            *fast, lost, slow = outcomes
            assert [o.status for o in fast] == ["sealed"] * 3
            assert [o.reward for o in fast] == pytest.approx([0.0, 0.1, 0.2])
            for o in (*fast, lost):  # the agent ran each once, and a receipt sealed it
                assert o.attempt_index == 0 and o.receipt is not None
                assert o.receipt.execution_generation == 1
            assert lost.status == "sealed" and lost.reward == 0.5  # replayed, not rerun
            assert slow.status == "failed" and slow.tries == 2 and slow.reason

            last = await orch.acheckpoint("both-end", str(tmp_path / "c2"), deadline_s=30.0)
            assert last.endpoints[0].commit is not None
            status = await client.status("probe-both-after", deadline_ts=soon(5))
            assert status.running == 0 and status.completed_unacknowledged == 0
            # the v2 routes were never used to retire: no v2 retired marks
            v2 = await V2Client(client).status(deadline_ts=soon(5))
            assert v2.retired_rollouts == 0 and v2.phase == "idle"
