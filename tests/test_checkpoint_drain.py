"""The drain wait on the agent-checkpoint protocol is visible (issue 27, item 3): Gym commits only
with nothing running, so a checkpoint with runs in flight keeps admission closed until they end.
The report says how long per endpoint (``drain_s``; the ledger also logs it at INFO while it
waits and records ``rlga_checkpoint_drain_seconds``). Two rows that end only when the test says
run when ``acheckpoint`` starts; the test lets them end 1 s after Gym's admission closed."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import until

pytestmark = [pytest.mark.ray]

POLICY = TryPolicy(rollout_s=30.0, receipt_s=5.0, max_tries=2, control_s=5.0)
HELD_S = 1.0


async def test_a_checkpoint_says_how_long_it_waited_for_runs_in_flight(ray_session, tmp_path):
    agent = CountingAgent()
    with GymServerThread(agent=agent, token="test-token") as server:
        async with Orchestrator(
            [server.endpoint],
            policy=POLICY,
            pool_size=1,
            rollouts_per_actor=2,  # both rows run at once
            run_id="drain",
            progress=False,
        ) as orch:
            rows = [{"_ng_rollout_id": f"drain-{i}", "hold": True} for i in range(2)]
            batch = asyncio.ensure_future(orch.arun_batch(rows))
            await until(lambda: sum(agent.starts.values()) == 2, what="both rows to start")
            ckpt = asyncio.ensure_future(orch.acheckpoint("d-1", str(tmp_path / "d-1")))
            await until(
                lambda: server.participant.snapshot()["phase"] != "idle", what="the prepare"
            )
            closed_at = time.monotonic()
            while time.monotonic() - closed_at < HELD_S:  # the runs go on for HELD_S
                await asyncio.sleep(0.05)
            for row in rows:
                agent.release(row["_ng_rollout_id"])
            report = await ckpt
            assert [o.status for o in await batch] == ["sealed", "sealed"]
            (entry,) = report.endpoints
            assert HELD_S * 0.9 <= entry.drain_s <= report.elapsed_s  # waited for the two
            quiet = await orch.acheckpoint("d-2", str(tmp_path / "d-2"))
            assert quiet.endpoints[0].drain_s == 0.0  # nothing ran: no drain
