"""A Gym server SIGKILLed mid-batch and restarted on its port and state dir (``gym serve
--state-dir``, a subprocess): the rows it cut ride the restart out on either checkpoint protocol.

A step that got no answer at all (refused, or not sent: the endpoint marked down) waits for
the endpoint to answer again and is sent again, within its deadline and within ``control_s``
of the first failure in a row (:meth:`GymCalls._ride_out`); a ``/run`` that meets the down
mark waits the same way instead of failing unsent. So a restart shorter than ``control_s``
costs the rows it cut one try, not the row: every row seals, each once, and the next
checkpoint commits. A Gym that stays away past ``control_s`` is taken for dead: every row
ends failed with a typed reason soon after, and the rows sent again once it is back seal.
Real parts: local Ray (the suite's session), the orchestrator's actors, the server process.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.polling import scaled, soon, until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = 8  # on 2 actors x 2 slots: 4 runs in flight when Gym is killed


def orchestrator(endpoint: GymEndpoint, policy: TryPolicy):
    from rl_gym_actors.orchestrator import Orchestrator

    return Orchestrator(
        [endpoint],
        policy=policy,
        pool_size=2,
        rollouts_per_actor=2,
        progress=False,
        start=False,
    )


def server_of(protocol: str, tmp_path) -> GymServerProcess:
    args = ["--protocol", "v2"] if protocol == "v2" else []
    return GymServerProcess(args=args, state_dir=tmp_path / "state")


async def counts(endpoint: GymEndpoint, protocol: str) -> tuple[int, int, int]:
    """(runs in flight, finished replies held, retired marks) on the server: on v2 its
    episodes, kept replies and retired marks; on the agent-checkpoint server its running and
    completed un-ACKed attempts (and no marks)."""
    async with GymClient(endpoint) as client:
        if protocol == "v2":
            status = await V2Client(client).status(deadline_ts=soon(5.0))
            kept = int((status.model_extra or {}).get("kept_replies", 0))
            return status.report.counts.get("episodes", 0), kept, status.retired_rollouts
        st = await client.status("restart-probe", deadline_ts=soon(5.0))
        return st.running, st.completed_unacknowledged, 0


def rows(prefix: str, sleep_s: float) -> list[dict]:
    return [
        {"_ng_rollout_id": f"{prefix}-{i}", "sleep_s": sleep_s, "reward": 0.25} for i in range(ROWS)
    ]


async def kill_with_runs_in_flight(server: GymServerProcess, protocol: str) -> None:
    async def four_running() -> bool:
        return (await counts(server.endpoint, protocol))[0] >= 4

    await until(four_running, timeout_s=30.0, what="4 runs in flight on Gym")
    server.kill()


@pytest.mark.parametrize("protocol", ["agent", "v2"])
async def test_a_restart_shorter_than_control_s_costs_the_cut_rows_a_try_not_the_row(
    ray_session, tmp_path, protocol
):
    # control_s bounds how long Gym may be away: a restart takes seconds on a loaded machine
    policy = TryPolicy(rollout_s=scaled(20.0), receipt_s=5.0, max_tries=3, control_s=scaled(20.0))
    server = server_of(protocol, tmp_path).start()
    url = server.endpoint.url
    try:
        async with orchestrator(server.endpoint, policy) as orch:
            batch = asyncio.ensure_future(orch.arun_batch(rows("cut", sleep_s=2.0)))
            await kill_with_runs_in_flight(server, protocol)
            server.start()
            assert server.endpoint.url == url  # restarted on its port: the same endpoint
            outcomes = await asyncio.wait_for(batch, scaled(90.0))
            assert (await orch.asnapshot()).in_flight == 0
            assert [o.status for o in outcomes] == ["sealed"] * ROWS, [
                (o.rollout_id, o.failure, o.reason) for o in outcomes if o.status != "sealed"
            ]
            assert sorted(o.rollout_id for o in outcomes) == [f"cut-{i}" for i in range(ROWS)]
            assert all(o.reward == 0.25 for o in outcomes)
            # the runs the kill cut were tried again (their first try died with the server)
            assert sum(o.attempt_index >= 1 for o in outcomes) >= 1, outcomes
            # whether a cut row waited out a down mark (snap.actors.outage_waits) or its retries
            # alone rode out the restart depends on how fast Gym came back: both are right
            report = await orch.acheckpoint("after", str(tmp_path / "ck"), deadline_s=scaled(30))
            assert report.endpoints[0].commit is not None
            assert await counts(server.endpoint, protocol) == (0, 0, 0)
    finally:
        server.kill()


async def test_v2_gym_away_past_control_s_fails_every_row_typed_then_they_seal(
    ray_session, tmp_path
):
    """Past the grace nothing waits: the batch ends while Gym is still down, each row failed
    with a typed reason (no answer in time, or the endpoint down); once Gym is back the checkpoint
    commits and the rows sent again seal, each once."""
    policy = TryPolicy(rollout_s=scaled(20.0), receipt_s=2.0, max_tries=3, control_s=1.0)
    server = server_of("v2", tmp_path).start()
    try:
        async with orchestrator(server.endpoint, policy) as orch:
            batch = asyncio.ensure_future(orch.arun_batch(rows("away", sleep_s=2.0)))
            await kill_with_runs_in_flight(server, "v2")
            killed = time.monotonic()
            outcomes = await asyncio.wait_for(batch, scaled(60.0))
            took = time.monotonic() - killed
            assert took < policy.control_s + scaled(5.0), took  # no row waited past the grace
            assert all(o.status == "failed" and o.reason for o in outcomes), outcomes
            # no answer: refused or cut (LOST), not sent (ENDPOINT_DOWN), or none by the step's
            # own deadline (DEADLINE: a receipt_s of 2 s runs out first on a loaded machine)
            no_answer = {FailureKind.LOST, FailureKind.ENDPOINT_DOWN, FailureKind.DEADLINE}
            assert {o.failure for o in outcomes} <= no_answer, outcomes
            server.start()
            report = await orch.acheckpoint("back", str(tmp_path / "ck"), deadline_s=scaled(30))
            assert report.endpoints[0].commit is not None
            left = rows("away", sleep_s=0.0)
            sealed: list[str] = []

            async def resent() -> bool:  # a row that meets a stale down mark fails at once
                again = await orch.arun_batch(left)
                for o in again:
                    assert o.status == "sealed" or (o.failure is not None and o.reason), o
                sealed.extend(o.rollout_id for o in again if o.status == "sealed")
                left[:] = [r for r in left if r["_ng_rollout_id"] not in sealed]
                return not left

            await until(resent, timeout_s=30.0, interval_s=0.5, what="the rows to seal")
            assert sorted(sealed) == sorted(f"away-{i}" for i in range(ROWS))  # each once
            await orch.acheckpoint("after", str(tmp_path / "ck2"), deadline_s=scaled(30))
            assert await counts(server.endpoint, "v2") == (0, 0, 0)
    finally:
        server.kill()
