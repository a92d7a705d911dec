"""The checkpoint gate with the real rollout side: a checkpoint taken while a batch is in flight
waits for the live owners' tries (never retires them), and commits once they are sealed and ACKed.
"""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import soon, until

pytestmark = [pytest.mark.ray, pytest.mark.slow]


async def test_a_checkpoint_during_a_batch_waits_for_live_tries_and_commits(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    with GymServerThread(token="test-token", allow_faults=True) as server:
        rows = [
            {"_ng_rollout_id": "live-slow-0", "sleep_s": 1.0, "reward": 0.1},
            {"_ng_rollout_id": "live-slow-1", "sleep_s": 1.0, "reward": 0.2},
            {"_ng_rollout_id": "live-lost", "sleep_s": 0.5, "reward": 0.3, "drop_reply": True},
            {"_ng_rollout_id": "live-fast", "reward": 0.4},
        ]
        policy = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)
        async with (
            GymClient(server.endpoint) as client,
            Orchestrator(
                [server.endpoint],
                policy=policy,
                pool_size=2,
                rollouts_per_actor=2,
                progress=False,
                start=False,
            ) as orch,
        ):
            batch = asyncio.ensure_future(orch.arun_batch(rows))

            async def both_running() -> bool:
                status = await client.status("probe-live", deadline_ts=soon(5))
                return status.running >= 2

            await until(both_running, timeout_s=15.0, what="the batch to start")

            report = await orch.acheckpoint("ckpt-live", str(tmp_path), deadline_s=30.0)
            outcomes = await asyncio.wait_for(batch, 30.0)

            # live owners' tries are never retired, nor counted as orphans: they are waited
            # for, then sealed and ACKed by their owners (adopted when the gate asked first)
            assert report.retired == 0 and report.orphans_acked == 0
            assert report.endpoints[0].commit.records == 4
            assert [o.status for o in outcomes] == ["sealed"] * 4
            assert [o.reward for o in outcomes] == [0.1, 0.2, 0.3, 0.4]
            for o in outcomes:  # the agent ran every row once
                assert o.receipt.execution_generation == 1 and o.attempt_index == 0
            status = await client.status("probe-live-after", deadline_ts=soon(5))
            assert status.state == "accepting"
            assert status.running == 0 and status.completed_unacknowledged == 0

            # the actors' last reports travel in their next batch: wait for them, with a deadline
            async def all_acked():
                snap = await orch.asnapshot()
                ledger = snap.ledger.endpoints[server.endpoint.url]
                assert ledger.invariant_ok and ledger.dispatched == 4
                return snap if ledger.acked == 4 else None

            snap = await until(all_acked, timeout_s=10.0, what="the ledger to see 4 ACKs")
            assert snap.ledger.checkpoints_committed == 1
