"""GymClient against answers shaped like a real NeMo Gym server's, and across a server restart.

The real-Gym forms come from :class:`rl_gym_actors.testing.real_gym.RealGymStandIn`, a proxy in
front of our real server; the restart runs the server as a subprocess with a state dir and kills
it with SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import (
    ConnectionLost,
    InvalidRequest,
    StaleAttempt,
    Unauthorized,
)
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.agent_checkpoint.faults import with_faults
from rl_gym_actors.gym.retry import RetryPolicy
from rl_gym_actors.testing.gym_process import GymServerProcess, GymServerThread
from rl_gym_actors.testing.polling import scaled, until
from rl_gym_actors.testing.real_gym import REAL_FEATURES, RealGymStandIn

aio = pytest.mark.asyncio(loop_scope="session")  # the suite shares one event loop


def rid() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def soon(seconds: float = 10.0) -> float:
    return time.time() + scaled(seconds)  # stretched by the machine's load


@pytest.fixture
def real_gym():
    """A fresh server behind the stand-in (the prepare tests change its phase)."""
    with (
        GymServerThread(token="test-token", allow_faults=True) as srv,
        RealGymStandIn(srv.endpoint) as gym,
    ):
        yield gym


@pytest_asyncio.fixture(loop_scope="session")
async def client(real_gym):
    async with GymClient(real_gym.endpoint) as c:
        yield c


@aio
async def test_prepare_409_without_a_report_reads_the_lists_from_status(client):
    r = rid()
    with pytest.raises(ConnectionLost):
        await client.run(
            with_faults({"reward": 0.5}, drop_reply=True),
            rollout_id=r,
            attempt_index=0,
            deadline_ts=soon(),
        )
    report = await client.prepare("cp-real", deadline_ts=soon(1.0))
    assert report.ready_to_commit is False
    assert report.completed_unacknowledged == 1
    [listed] = report.completed_unacknowledged_attempts
    assert listed.key == (r, 0) and listed.completion_receipt is not None
    # adopt it without the (ext) header: the replayed reply matches the listed receipt
    res = await client.replay({"reward": 0.5}, rollout_id=r, attempt_index=0, deadline_ts=soon())
    assert res.replayed is False and res.digest == listed.completion_receipt.result_digest
    await client.acknowledge(listed.completion_receipt, deadline_ts=soon())
    assert (await client.prepare("cp-real", deadline_ts=soon())).ready_to_commit
    await client.resume("cp-real", deadline_ts=soon())


@aio
async def test_capabilities_as_a_real_gym_serves_them(real_gym):
    """Without a token, the fields of a real Gym's ControlCapabilities and its fence snapshot,
    and only the features a real agent participant lists (no (ext) feature, no route name)."""
    async with GymClient(GymEndpoint(url=real_gym.url, token="wrong")) as anonymous:
        caps = await anonymous.capabilities(deadline_ts=soon())
    assert caps is not None and caps.features == list(REAL_FEATURES)
    assert not caps.model_extra and (caps.phase, caps.active_checkpoint_id) == ("idle", None)
    assert (caps.component, caps.checkpoint_mode) == ("responses_api_agents", "export_restore")
    async with GymClient(real_gym.endpoint) as c:
        assert not await c.offers("retire-batch", deadline_ts=soon())
        assert not await c.offers("receipt", deadline_ts=soon())
        await c.prepare("cp-caps", deadline_ts=soon())
        held = await c.capabilities(deadline_ts=soon())
        assert held is not None and held.active_checkpoint_id == "cp-caps"
        await c.resume("cp-caps", deadline_ts=soon())


@aio
async def test_ext_routes_missing(client):
    with pytest.raises(InvalidRequest) as info:  # no receipt route on a real Gym
        await client.receipt(rid(), 0, deadline_ts=soon())
    assert info.value.status == 404


@aio
async def test_a_fastapi_style_401_is_unauthorized_and_409s_pass_as_they_are(real_gym):
    async with GymClient(GymEndpoint(url=real_gym.url, token="wrong")) as bad:
        with pytest.raises(Unauthorized) as info:
            await bad.status("cp-any", deadline_ts=soon())
        assert info.value.status == 401 and info.value.body == {"detail": info.value.detail}
    async with GymClient(real_gym.endpoint) as c:
        r = rid()
        await c.retire(r, 0, checkpoint_id="cp-any", deadline_ts=soon())
        with pytest.raises(StaleAttempt):
            await c.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon())


@aio
async def test_a_run_cancelled_by_retire_is_a_5xx_that_retire_resolves(client, real_gym):
    r = rid()
    run = asyncio.create_task(
        client.run({"sleep_s": 30}, rollout_id=r, attempt_index=0, deadline_ts=soon(60))
    )

    async def running() -> bool:
        return (await client.status("cp-any", deadline_ts=soon())).running == 1

    await until(running, what="the run to start")
    answer = await client.retire(r, 0, checkpoint_id="cp-any", deadline_ts=soon())
    assert answer.retired is True
    # a real Gym's 500 "No response returned." is the retire's outcome, as our server's 409
    with pytest.raises(StaleAttempt) as info:
        await asyncio.wait_for(run, 5)
    assert info.value.status == 500 and real_gym.retired_while_running == 1
    assert failure_kind(info.value) is FailureKind.STALE
    # the caller retires the try after any 5xx: the answer settles it
    again = await client.retire(r, 0, checkpoint_id="cp-any", deadline_ts=soon())
    assert (again.retired, again.tombstoned, again.completed_unacknowledged) == (False, True, False)


@aio
@pytest.mark.slow
async def test_idempotent_calls_retry_across_a_server_restart(tmp_path: Path, caplog):
    with GymServerProcess(token="test-token", state_dir=tmp_path / "state") as srv:
        policy = RetryPolicy(attempts=200, backoff_initial_s=0.05, backoff_max_s=0.2)
        # the breaker stays closed through the restart: this test is about the retry policy
        async with GymClient(srv.endpoint, retry=policy, down_span_s=120) as c:
            r = rid()
            res = await c.run({"reward": 0.25}, rollout_id=r, attempt_index=0, deadline_ts=soon())
            url = srv.url
            srv.kill()
            caplog.set_level(logging.DEBUG, logger="rl_gym_actors.gym.retry")
            fetch = asyncio.create_task(c.receipt(r, 0, deadline_ts=soon(30)))

            async def refused() -> bool:
                return any("ConnectionLost" in m for m in caplog.messages)

            await until(refused, what="a refused try")
            assert not fetch.done()
            await asyncio.to_thread(srv.restart)
            assert srv.url == url  # same port: the endpoint holds
            answer = await asyncio.wait_for(fetch, 30)
            assert answer.state == "completed"
            assert answer.completion_receipt.result_digest == res.digest
            # a run is never retried: against a dead server it fails at once
            srv.kill()
            started = time.monotonic()
            with pytest.raises(ConnectionLost):
                await c.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
            assert time.monotonic() - started < 1.0
