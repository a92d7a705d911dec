"""A restarted ledger rebuilds its book (issue 16): the ledger is killed mid-run (Ray restarts
it) while 600 rows run with ``ack="at_checkpoint"``; once the batch is in, the book has no
phantom running attempt, and the next checkpoint ACKs every sealed result as sealed, none as an
orphan (before: 95 of 600 counted as orphans, one attempt left running)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=3.0)
ROWS = 600


async def test_a_restarted_ledger_counts_no_sealed_result_as_an_orphan(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    with GymServerThread(token="test-token") as server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with (
            GymClient(endpoint) as client,
            Orchestrator(
                [endpoint],
                policy=POLICY,
                pool_size=2,
                rollouts_per_actor=32,
                progress=False,
                start=False,
            ) as orch,
        ):
            rows = [{"sleep_s": 0.05, "reward": 0.5} for _ in range(ROWS)]
            batch = asyncio.ensure_future(orch.arun_batch(rows))

            async def sealed_on_gym() -> bool:
                st = await client.status("probe", deadline_ts=time.time() + 5)
                return st.completed_unacknowledged >= ROWS // 6

            await until(sealed_on_gym, timeout_s=60, what="a sixth of the batch sealed")
            ray_session.kill(orch.ledger, no_restart=False)
            outcomes = await asyncio.wait_for(batch, 120)
            assert [o.status for o in outcomes] == ["sealed"] * ROWS
            assert await orch.ledger.restarted.remote()

            async def nothing_running():
                snap = await orch.asnapshot()
                return snap if snap.ledger.endpoints[server.url].running == 0 else None

            # no phantom: every attempt the book has as running ends (reports come in batches)
            await until(nothing_running, timeout_s=20, what="the book to show nothing running")
            report = await orch.acheckpoint("rebuilt", str(tmp_path / "ck"), deadline_s=60.0)
            assert report.orphans_acked == 0
            assert report.sealed_acked == ROWS
            snap = await orch.asnapshot()
            assert snap.ledger.orphans_acked == 0
            assert snap.ledger.endpoints[server.url].running == 0
            assert server.participant.snapshot()["agent_starts"] == ROWS  # nothing ran twice
