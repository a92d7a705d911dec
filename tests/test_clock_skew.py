"""Server time (issue 16): a Gym host clock 12 s ahead or 60 s behind changes nothing.

The client estimates each server's clock offset from its answers (``x-gym-time``, else ``Date``)
and sends every deadline in the server's time; the gate bounds prepare by time, not by a round
count. The skewed servers are ours with the test-only clock offset (fault injection only)."""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.clock import SERVER_TIME_HEADER, ServerClock, fault_clock
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.gym_process import GymServerProcess, GymServerThread
from rl_gym_actors.testing.polling import scaled, until

SKEWS = [12.0, -60.0]


def soon(seconds: float = 5.0) -> float:
    return time.time() + scaled(seconds)


def test_the_offset_is_the_median_of_recent_samples():
    clock = ServerClock()
    now = 1_800_000_000.0
    for i in range(5):
        clock.sample({SERVER_TIME_HEADER: f"{now + 12.0 + 0.01 * i}"}, now - 0.01, now + 0.01)
    clock.sample({SERVER_TIME_HEADER: f"{now + 500.0}"}, now, now)  # one wild answer
    assert clock.offset == pytest.approx(12.02, abs=0.02)
    assert clock.to_server(now) == pytest.approx(now + 12.02, abs=0.02)
    # Date alone: 1 s resolution; a skew under it counts as none, a larger one is taken
    dated = ServerClock()
    dated.sample({"Date": formatdate(now + 0.4, usegmt=True)}, now, now)
    assert dated.offset == 0.0
    dated = ServerClock()
    for _ in range(3):
        dated.sample({"Date": formatdate(now - 60.2, usegmt=True)}, now, now)
    assert dated.offset == pytest.approx(-60.0, abs=1.0)
    unread = ServerClock()
    unread.sample({SERVER_TIME_HEADER: "nan", "Date": "garbage"}, now, now)
    assert unread.samples == 0 and unread.offset == 0.0


def test_the_offset_is_a_fault_only_with_faults_allowed():
    env = {"RL_GYM_FAULT_CLOCK_OFFSET_S": "12"}
    assert fault_clock(False, env) is time.time
    assert fault_clock(True, env)() == pytest.approx(time.time() + 12.0, abs=0.5)
    with pytest.raises(ValueError):
        fault_clock(True, {"RL_GYM_FAULT_CLOCK_OFFSET_S": "soon"})


@pytest.mark.parametrize("skew", SKEWS)
async def test_prepare_waits_its_deadline_on_a_skewed_server(skew):
    """A prepare that cannot get ready is held until our deadline, in the server's time: not
    answered at once (ahead), nor held a minute past it (behind)."""
    with GymServerThread(token="t", clock_offset_s=skew) as server:
        async with GymClient(server.endpoint) as client:
            await client.status("probe", deadline_ts=soon())
            assert client.server_clock.offset == pytest.approx(skew, abs=0.5)
            run = asyncio.ensure_future(
                client.run(
                    {"sleep_s": 30.0}, rollout_id="slow", attempt_index=0, deadline_ts=soon(60)
                )
            )

            async def running() -> bool:
                return (await client.status("probe", deadline_ts=soon())).running == 1

            await until(running, what="the slow run to start")
            started = time.monotonic()
            status = await client.prepare("c1", deadline_ts=time.time() + 1.0)
            held = time.monotonic() - started
            assert not status.ready_to_commit
            assert 0.5 <= held < 1.0 + scaled(0.5), held
            await client.retire("slow", 0, checkpoint_id="c1", deadline_ts=soon())
            await client.resume("c1", deadline_ts=soon())
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("skew", [0.0, *SKEWS])
async def test_checkpoints_commit_as_with_no_skew(ray_session, tmp_path, skew):
    from rl_gym_actors.orchestrator import Orchestrator

    policy = TryPolicy(rollout_s=30.0, receipt_s=2.0, max_tries=2, control_s=3.0)
    server = GymServerProcess(token="t", clock_offset_s=skew).start()
    try:
        async with Orchestrator(
            [server.endpoint], policy=policy, pool_size=1, run_id="skew", progress=False
        ) as orch:
            outcomes = await orch.arun_batch([{"reward": 1.0} for _ in range(4)])
            assert [o.status for o in outcomes] == ["sealed"] * 4
            # a row still running when the checkpoint starts: prepare waits for it
            slow = asyncio.ensure_future(orch.arun_batch([{"reward": 1.0, "sleep_s": 4.0}]))
            async with GymClient(server.endpoint) as client:

                async def running() -> bool:
                    return (await client.status("probe", deadline_ts=soon())).running == 1

                await until(running, what="the slow row to run")
            started = time.monotonic()
            report = await orch.acheckpoint("skew-1", str(tmp_path / "1"), deadline_s=30)
            took = time.monotonic() - started
            assert report.endpoints[0].commit is not None
            assert report.endpoints[0].prepare_rounds <= 4, report
            assert took < scaled(4.0 + 6.0), took
            assert [o.status for o in await slow] == ["sealed"]
            await orch.acheckpoint("skew-2", str(tmp_path / "2"), deadline_s=30)
    finally:
        server.kill()


@pytest.mark.ray
@pytest.mark.slow
async def test_a_killed_drivers_checkpoint_frees_gym_behind_by_a_minute(tmp_path):
    """Gym's clock 60 s behind, a lease of 3 s: the dead driver's checkpoint lapses within
    lease + deadline + 5 s of its start, not a minute later."""
    lease_s, deadline_s = 3.0, 4.0
    server = GymServerProcess(
        token="t", clock_offset_s=-60.0, args=["--checkpoint-lease-s", str(lease_s)]
    ).start()
    try:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with GymClient(endpoint) as client:
            driver = DriverProcess(
                [
                    *("--url", server.url, "--token", "t", "--run-id", "late", "--rows", "2"),
                    *("--slow-row-s", "60", "--checkpoint-id", "late-1", "--pool", "1"),
                    *("--checkpoint-dir", str(tmp_path / "d"), "--deadline-s", str(deadline_s)),
                ]
            )
            try:
                driver.wait_for("checkpointing", 180)
                checkpointing = time.monotonic()

                async def preparing() -> bool:
                    status = await client.status("probe", deadline_ts=soon())
                    return status.state == "preparing"

                await until(preparing, timeout_s=30, what="the driver to prepare")
            finally:
                pids = driver.kill()
            for pid in pids:
                await until(lambda pid=pid: not alive(pid), interval_s=0.05, what=f"{pid} dead")

            async def accepting() -> bool:
                status = await client.status("probe", deadline_ts=soon())
                return status.state == "accepting"

            await until(accepting, timeout_s=90, interval_s=0.1, what="the lease to lapse")
            freed = time.monotonic() - checkpointing
            assert freed < lease_s + deadline_s + scaled(5.0), freed
    finally:
        server.kill()
