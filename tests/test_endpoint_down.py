"""Dead and frozen Gym servers fail fast: a dead endpoint is marked down and its rows fail at once
with the real cause; a checkpoint ends within its deadline + 0.5 s, dead (killed) or frozen
(SIGSTOP) server alike; the endpoint comes back once a probe reaches it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.errors import CheckpointFailed, ConnectionLost, EndpointDown
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerProcess, GymServerThread
from rl_gym_actors.testing.polling import scaled, until

POLICY = TryPolicy(rollout_s=2.0, receipt_s=1.0, max_tries=3, control_s=3.0)


def soon(seconds: float = 5.0) -> float:
    return time.time() + scaled(seconds)  # stretched by the machine's load


async def test_a_client_marks_a_dead_endpoint_down_and_a_probe_brings_it_back():
    server = GymServerThread(token="test-token").start()
    try:
        async with GymClient(server.endpoint, down_span_s=0.3, probe_every_s=0.05) as client:
            assert (await client.status("c", deadline_ts=soon())).state == "accepting"
            server.kill()
            with pytest.raises((ConnectionLost, EndpointDown)):  # refused, retried, down
                await client.status("c", deadline_ts=soon(1.0))
            assert client.health.down  # the retries went on past the span
            start = time.monotonic()
            with pytest.raises(EndpointDown) as down:
                await client.retire("r", 0, checkpoint_id="c", deadline_ts=soon())
            assert time.monotonic() - start < 0.1  # not sent at all
            assert down.value.cause_type == "ConnectionLost"
            assert "Cannot connect" in down.value.cause
            server.restart()
            await until(lambda: not client.health.down, what="the probe to see the server again")
            assert (await client.status("c2", deadline_ts=soon())).state == "accepting"
    finally:
        server.stop()


async def test_until_up_waits_for_a_down_endpoint_until_it_answers_or_the_time_is_up():
    server = GymServerThread(token="test-token").start()
    try:
        async with GymClient(server.endpoint, down_span_s=0.3, probe_every_s=0.05) as client:
            assert await client.until_up(time.time()) and client.failing_since is None  # up
            server.kill()
            with pytest.raises((ConnectionLost, EndpointDown)):
                await client.status("c", deadline_ts=soon(1.0))
            assert client.health.down and client.failing_since is not None
            start = time.monotonic()
            assert not await client.until_up(time.time() + 0.3)  # still dead: at its time
            assert 0.25 <= time.monotonic() - start < 0.3 + scaled(1.0)
            server.restart()
            assert await client.until_up(soon())  # the probe got an answer
            assert not client.health.down and client.failing_since is None
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.slow
async def test_with_gym_dead_a_batch_and_a_checkpoint_end_in_bounds_naming_the_cause(
    ray_session, tmp_path
):
    from rl_gym_actors.orchestrator import Orchestrator

    server = GymServerThread(token="test-token").start()
    endpoint = GymEndpoint(url=server.url, token=server.token, name="dead")
    try:
        async with Orchestrator(
            [endpoint],
            policy=POLICY,
            pool_size=2,
            rollouts_per_actor=2,
            progress=False,
            start=False,
        ) as orch:
            await orch.astart()
            server.kill()
            start = time.monotonic()
            outcomes = await orch.arun_batch([{"reward": 1.0} for _ in range(60)])
            took = time.monotonic() - start
            # the policy's own bound, plus the Ray and HTTP overhead a loaded machine stretches
            bound = POLICY.rollout_s * POLICY.max_tries + POLICY.control_s + scaled(1.0)
            assert took < bound, (took, bound)
            assert all(o.status == "failed" for o in outcomes)
            assert {o.failure for o in outcomes} <= {FailureKind.ENDPOINT_DOWN, FailureKind.LOST}
            assert any(o.failure is FailureKind.ENDPOINT_DOWN for o in outcomes)
            assert all("Cannot connect" in (o.reason or "") for o in outcomes), {
                o.reason for o in outcomes
            }

            start = time.monotonic()
            with pytest.raises(CheckpointFailed) as failed:
                await orch.acheckpoint("dead-0", str(tmp_path), deadline_s=2.0)
            assert time.monotonic() - start < 2.0 + scaled(0.5)  # the slack stretched by load
            assert "Cannot connect" in str(failed.value)
    finally:
        server.stop()


@pytest.mark.ray
@pytest.mark.slow
async def test_a_checkpoint_against_a_frozen_gym_fails_within_its_deadline(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    server = GymServerProcess(token="test-token").start()
    endpoint = GymEndpoint(url=server.url, token=server.token)
    try:
        async with Orchestrator(
            [endpoint], policy=POLICY, pool_size=1, progress=False, start=False
        ) as orch:
            assert [o.status for o in await orch.arun_batch([{}])] == ["sealed"]
            os.kill(server.pid, signal.SIGSTOP)
            for deadline_s in (2.0, 3.0):
                start = time.monotonic()
                with pytest.raises(CheckpointFailed):
                    await orch.acheckpoint(
                        f"frozen-{deadline_s}", str(tmp_path), deadline_s=deadline_s
                    )
                # the slack stretched by load
                assert time.monotonic() - start < deadline_s + scaled(0.5)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()


def test_a_down_endpoint_lets_one_trial_call_through_per_interval():
    from rl_gym_actors.gym.health import EndpointHealth

    now = [100.0]
    health = EndpointHealth("g", threshold=2, span_s=1.0, trial_every_s=1.0, clock=lambda: now[0])
    for t in (100.0, 101.0):
        now[0] = t
        health.failed(ConnectionLost("refused"))
    assert health.down
    with pytest.raises(EndpointDown):
        health.check("run", "u")  # a failure just now: fail at once
    now[0] = 102.0
    health.check("run", "u")  # a second on: one trial goes through
    with pytest.raises(EndpointDown):
        health.check("run", "u")  # ... and only one
    assert health.succeeded() and not health.down  # its answer brings the endpoint back
    health.check("run", "u")
