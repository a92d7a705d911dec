"""A driver SIGKILLed (with its own local Ray) between prepare and resume leaves Gym preparing.

A new driver of the same run gets it back: at once with ``abort_checkpoint``, or with no step at
all once the server's checkpoint lease lapses."""

from __future__ import annotations

import time

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.chaos import server_has_leases
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import scaled, until
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=3.0)
LEASE_S = 3.0


def soon(seconds: float = 5.0) -> float:
    return time.time() + scaled(seconds)  # stretched by the machine's load


async def kill_mid_checkpoint(
    server, client: GymClient, tmp_path, deadline_s: float, *, v2: bool = False
):
    """Start a driver of run ``grpo-7``, let it reach prepare while its slow row runs, SIGKILL
    it and its Ray. Returns when the kill is done (and checked), with the time it checkpointed."""
    driver = DriverProcess(
        [
            "--url",
            server.url,
            "--token",
            server.token,
            "--run-id",
            "grpo-7",
            "--rows",
            "3",
            "--slow-row-s",
            "60",
            "--checkpoint-id",
            "step-1",
            # one rollout actor (2 slots: the slow row and the rows after it)
            "--pool",
            "1",
            "--checkpoint-dir",
            str(tmp_path / "old"),
            "--deadline-s",
            str(deadline_s),
        ]
    )
    try:
        driver.wait_for("checkpointing", 180)
        checkpointing = time.monotonic()

        async def preparing() -> bool:
            if v2:
                return (await V2Client(client).status(deadline_ts=soon())).phase == "preparing"
            return (await client.status("probe", deadline_ts=soon())).state == "preparing"

        await until(preparing, timeout_s=30, what="the driver to prepare")
    finally:
        pids = driver.kill()
    for pid in pids:  # the driver and its whole local Ray
        await until(lambda pid=pid: not alive(pid), interval_s=0.05, what=f"pid {pid} to die")
    if v2:
        v2_status = await V2Client(client).status(deadline_ts=soon())
        assert v2_status.phase == "preparing" and v2_status.report.blocker_count == 1
        return checkpointing
    status = await client.status("probe", deadline_ts=soon())
    assert status.state == "preparing" and status.running == 1  # Gym is held: the bug's state
    return checkpointing


async def test_a_new_driver_aborts_the_dead_checkpoint_and_commits_its_own(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    with GymServerThread(token="test-token") as server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with GymClient(endpoint) as client:
            await kill_mid_checkpoint(server, client, tmp_path, deadline_s=120.0)
            killed = time.monotonic()
            async with Orchestrator(
                [endpoint], policy=POLICY, pool_size=2, run_id="grpo-7", progress=False, start=False
            ) as orch:
                assert (await orch.aabort_checkpoint("step-1")).aborted
                outcomes = await orch.arun_batch([{"reward": 0.5} for _ in range(4)])
                assert [o.status for o in outcomes] == ["sealed"] * 4
                report = await orch.acheckpoint("step-2", str(tmp_path / "new"), deadline_s=20)
                # the dead driver's slow row is this run's: the new driver retires it
                assert report.retired == 1
            assert time.monotonic() - killed < 60
            status = await client.status("probe-end", deadline_ts=soon())
            assert status.state == "accepting" and status.running == 0
            assert status.completed_unacknowledged == 0


@pytest.mark.skipif(not server_has_leases(), reason="the Gym server has no checkpoint leases yet")
async def test_with_a_lease_a_new_driver_commits_with_no_manual_step(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    dead_deadline_s = 4.0
    with GymServerThread(token="test-token", args=["--checkpoint-lease-s", str(LEASE_S)]) as server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with GymClient(endpoint) as client:
            checkpointing = await kill_mid_checkpoint(
                server, client, tmp_path, deadline_s=dead_deadline_s
            )
            # the dead checkpoint lapses at its deadline + the lease (on the server's clock)
            lapse = checkpointing + dead_deadline_s + LEASE_S
            async with Orchestrator(
                [endpoint], policy=POLICY, pool_size=2, run_id="grpo-7", progress=False, start=False
            ) as orch:
                await orch.astart()
                ready = time.monotonic()  # starting actors is no part of recovering
                outcomes = await orch.arun_batch([{"reward": 0.5} for _ in range(4)])
                assert [o.status for o in outcomes] == ["sealed"] * 4
                await orch.acheckpoint("step-2", str(tmp_path / "new"), deadline_s=30)
                committed = time.monotonic()
            # no manual step: batch and checkpoint done within 5 s of the lapse (or of start-up)
            assert committed - max(lapse, ready) < 5.0, (committed - lapse, committed - ready)
            assert (await client.status("probe-end", deadline_ts=soon())).running == 0


async def test_v2_a_new_driver_aborts_the_dead_checkpoint_and_commits_its_own(
    ray_session, tmp_path
):
    """The same on ``gym serve --protocol v2``: the dead driver left Gym preparing (admission
    closed); the new driver resumes it, its batch seals, and its checkpoint retires the dead
    driver's slow row (a blocker of this run that no live owner holds) and commits."""
    from rl_gym_actors.orchestrator import Orchestrator

    with V2ServerThread() as server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with GymClient(endpoint) as client:
            await kill_mid_checkpoint(server, client, tmp_path, deadline_s=120.0, v2=True)
            killed = time.monotonic()
            async with Orchestrator(
                [endpoint], policy=POLICY, pool_size=2, run_id="grpo-7", progress=False, start=False
            ) as orch:
                assert (await orch.aabort_checkpoint("step-1")).aborted
                outcomes = await orch.arun_batch([{"reward": 0.5} for _ in range(4)])
                assert [o.status for o in outcomes] == ["sealed"] * 4
                report = await orch.acheckpoint("step-2", str(tmp_path / "new"), deadline_s=20)
                assert report.endpoints[0].protocol == "v2"
                assert report.endpoints[0].commit is not None
            assert time.monotonic() - killed < 60
            status = await V2Client(client).status(deadline_ts=soon())
            assert status.phase == "idle" and status.report.counts["episodes"] == 0
