"""GymClient against the real Gym server on loopback: every route's happy path and every typed
error, a dropped reply, a receipt that outlives its deadline, and the control plane's own pool.

One server per module for key-scoped tests (every test uses fresh rollout ids); checkpoint tests
get a server of their own, since a checkpoint's phase is server-wide.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import (
    AckRejected,
    AdmissionClosed,
    AgentDataFailed,
    CheckpointConflict,
    CheckpointNotReady,
    ConnectionLost,
    DeadlineExceeded,
    DuplicateExecution,
    InvalidRequest,
    NotCompleted,
    RlGymError,
    StaleAttempt,
    StaleCheckpoint,
    Unauthorized,
    UnknownExecution,
)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient, error_for_response
from rl_gym_actors.gym.agent_checkpoint.faults import with_faults
from rl_gym_actors.gym.retry import RetryPolicy
from rl_gym_actors.protocol import CONTROL_PREFIX, AckAnswer, ExecutionState
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import scaled, until

aio = pytest.mark.asyncio(loop_scope="session")  # the suite shares one event loop


def rid(prefix: str = "r") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def soon(seconds: float = 10.0) -> float:
    return time.time() + scaled(seconds)  # stretched by the machine's load


async def expect(cls: type[RlGymError], call) -> RlGymError:
    """Await ``call``, which must raise exactly ``cls``; the error must survive pickling."""
    with pytest.raises(RlGymError) as info:
        await call
    err = info.value
    assert type(err) is cls, f"expected {cls.__name__}, got {err!r}"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.__dict__ == err.__dict__
    return err


@pytest.fixture(scope="module")
def server():
    with GymServerThread(token="test-token", allow_faults=True) as srv:
        yield srv


@pytest.fixture
def counting() -> CountingAgent:
    return CountingAgent()


@pytest.fixture
def own_server(counting):
    """A server for one test (checkpoint phases are server-wide), its agent counting starts."""
    with GymServerThread(agent=counting, token="test-token", allow_faults=True) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="session")
async def client(server):
    async with GymClient(server.endpoint) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="session")
async def own_client(own_server):
    async with GymClient(own_server.endpoint) as c:
        yield c


# ---------------------------------------------------------------- data plane and receipts


@aio
async def test_run_receipt_acknowledge_happy_path(client):
    r = rid()
    res = await client.run({"reward": 0.5}, rollout_id=r, attempt_index=0, deadline_ts=soon())
    assert res.reply == {"id": f"r-{r}", "reward": 0.5} and res.replayed is False
    assert json.loads(res.raw) == res.reply

    answer = await client.receipt(r, 0, deadline_ts=soon())
    receipt = answer.completion_receipt
    assert answer.state == "completed" and receipt.key == (r, 0)
    assert receipt.result_digest == res.digest and receipt.result_identity == f"r-{r}"
    assert receipt.execution_generation == 1

    assert await client.acknowledge(receipt, deadline_ts=soon()) == AckAnswer(
        acknowledged=True, idempotent=False
    )
    assert await client.acknowledge(receipt, deadline_ts=soon()) == AckAnswer(
        acknowledged=False, idempotent=True
    )
    assert (await client.receipt(r, 0, deadline_ts=soon())).state == "acknowledged"
    # an ACKed key is spent: running it again is stale, and replaying it too
    await expect(StaleAttempt, client.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon()))
    await expect(StaleAttempt, client.replay({}, rollout_id=r, attempt_index=0, deadline_ts=soon()))


@aio
async def test_acknowledge_completed_is_all_or_nothing(client):
    keys = [rid() for _ in range(3)]
    receipts = []
    for r in keys:
        await client.run({"reward": 1.0}, rollout_id=r, attempt_index=0, deadline_ts=soon())
        receipts.append((await client.receipt(r, 0, deadline_ts=soon())).completion_receipt)

    forged = receipts[2].model_copy(update={"result_digest": "0" * 64})
    await expect(
        AckRejected, client.acknowledge_completed([receipts[0], forged], deadline_ts=soon())
    )
    assert (await client.receipt(keys[0], 0, deadline_ts=soon())).state == "completed"

    answer = await client.acknowledge_completed(receipts, deadline_ts=soon())
    assert answer.acknowledged == receipts
    for r in keys:
        assert (await client.receipt(r, 0, deadline_ts=soon())).state == "acknowledged"


@aio
async def test_ack_mismatch_and_unknown_key_are_rejected(client):
    r = rid()
    await client.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon())
    receipt = (await client.receipt(r, 0, deadline_ts=soon())).completion_receipt
    for bad in (
        receipt.model_copy(update={"result_identity": "someone-else"}),
        receipt.model_copy(update={"execution_generation": 2}),
        receipt.model_copy(update={"rollout_id": rid()}),
    ):
        err = await expect(AckRejected, client.acknowledge(bad, deadline_ts=soon()))
        assert err.status == 409 and err.code == "completed_execution_acknowledgement_error"
    assert (await client.acknowledge(receipt, deadline_ts=soon())).acknowledged


@aio
async def test_a_dropped_reply_is_connection_lost_then_adopted_by_replay(client, server):
    r = rid()
    row = with_faults({"reward": 0.5}, drop_reply=True)
    err = await expect(
        ConnectionLost, client.run(row, rollout_id=r, attempt_index=0, deadline_ts=soon())
    )
    assert isinstance(err.__cause__, aiohttp.ClientError)
    # retire, then adopt: the try had finished, so retire refuses and the reply is replayed
    answer = await client.retire(r, 0, checkpoint_id="cp-any", deadline_ts=soon())
    assert (answer.retired, answer.tombstoned, answer.completed_unacknowledged) == (
        False,
        False,
        True,
    )
    res = await client.replay(row, rollout_id=r, attempt_index=0, deadline_ts=soon())
    assert res.replayed is True and res.reply == {"id": f"r-{r}", "reward": 0.5}
    receipt = (await client.receipt(r, 0, deadline_ts=soon())).completion_receipt
    assert receipt.execution_generation == 1 and receipt.result_digest == res.digest
    assert (await client.acknowledge(receipt, deadline_ts=soon())).acknowledged


@aio
async def test_a_running_key_duplicate_not_completed_then_retired(own_client, counting):
    client = own_client
    r = rid()
    first = asyncio.create_task(
        client.run({"sleep_s": 30}, rollout_id=r, attempt_index=0, deadline_ts=soon(60))
    )

    async def started() -> bool:
        try:
            await client.receipt(r, 0, deadline_ts=soon())
        except UnknownExecution:
            return False
        except NotCompleted:
            return True
        raise AssertionError("a 30 s run cannot be completed yet")

    await until(started, what="the run to start")
    await expect(NotCompleted, client.receipt(r, 0, deadline_ts=soon()))
    await expect(
        DuplicateExecution, client.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon())
    )
    answer = await client.retire(r, 0, checkpoint_id="cp-any", deadline_ts=soon())
    assert (answer.retired, answer.tombstoned) == (True, True)
    await expect(StaleAttempt, asyncio.wait_for(first, 5))  # its caller hears at once
    await expect(StaleAttempt, client.receipt(r, 0, deadline_ts=soon()))
    again = await client.retire(r, 0, checkpoint_id="cp-any", deadline_ts=soon())
    assert (again.retired, again.tombstoned) == (False, True)
    assert counting.cancelled == {(r, 0)} and counting.starts[(r, 0)] == 1


@aio
async def test_unknown_keys_and_tombstones(client):
    r = rid()
    await expect(UnknownExecution, client.receipt(r, 0, deadline_ts=soon()))
    answer = await client.retire(r, 0, checkpoint_id="cp-any", deadline_ts=soon())
    assert (answer.retired, answer.tombstoned, answer.completed_unacknowledged) == (
        False,
        True,
        False,
    )
    await expect(StaleAttempt, client.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon()))
    await expect(StaleAttempt, client.receipt(r, 0, deadline_ts=soon()))
    # the next try of the same rollout is a new key
    res = await client.run({}, rollout_id=r, attempt_index=1, deadline_ts=soon())
    assert res.reply["id"] == f"r-{r}"


@aio
async def test_a_data_failure_of_the_agent_is_agent_data_failed_and_tombstones_the_key(client):
    r = rid()
    err = await expect(
        AgentDataFailed,
        client.run({"fail": True}, rollout_id=r, attempt_index=0, deadline_ts=soon()),
    )
    assert err.status == 422 and "fail" in err.detail
    await expect(StaleAttempt, client.receipt(r, 0, deadline_ts=soon()))


@aio
async def test_control_needs_the_token_and_run_does_not(server):
    for token in ("wrong-token", None):
        endpoint = GymEndpoint(url=server.url, token=token)
        async with GymClient(endpoint, retry=RetryPolicy(attempts=1)) as bad:
            err = await expect(Unauthorized, bad.status("cp-any", deadline_ts=soon()))
            assert err.status == 401
            await expect(Unauthorized, bad.receipt(rid(), 0, deadline_ts=soon()))
            res = await bad.run({}, rollout_id=(r := rid()), attempt_index=0, deadline_ts=soon())
            assert res.reply["id"] == f"r-{r}"


@aio
async def test_invalid_requests_are_typed(tmp_path: Path):
    with GymServerThread(token="test-token", max_body_bytes=2048) as small:
        async with GymClient(small.endpoint) as c:
            err = await expect(
                InvalidRequest,
                c.run({"blob": "x" * 4096}, rollout_id=rid(), attempt_index=0, deadline_ts=soon()),
            )
            assert err.status == 413 and err.code == "payload_too_large"
        # what the typed client refuses to send, the server refuses too: its 422 body maps
        async with aiohttp.ClientSession() as raw_session:
            url = small.url + CONTROL_PREFIX + "/retire"
            async with raw_session.post(
                url,
                json={"rollout_id": "r", "attempt_index": -1},
                headers={"Authorization": "Bearer test-token"},
            ) as resp:
                status, raw = resp.status, await resp.read()
    err = error_for_response(status, raw, url=url)
    assert type(err) is InvalidRequest and err.status == 422 and "attempt_index" in err.detail


@aio
async def test_a_receipt_that_outlives_its_deadline_is_deadline_exceeded(client):
    r = rid()
    row = with_faults({}, receipt_delay_s=3.0)
    await client.run(row, rollout_id=r, attempt_index=0, deadline_ts=soon())
    budget = 0.4
    deadline = time.time() + budget
    await expect(DeadlineExceeded, client.receipt(r, 0, deadline_ts=deadline))
    overshoot = time.time() - deadline
    # measured on 2 cores: a few milliseconds; the bound leaves room for a loaded machine
    assert -0.01 <= overshoot < 0.15, overshoot
    assert (await client.receipt(r, 0, deadline_ts=soon())).state == "completed"


@aio
async def test_control_calls_do_not_queue_behind_long_runs(server):
    async with GymClient(server.endpoint, limit=1) as c:
        runs = [
            asyncio.create_task(
                c.run({"sleep_s": 0.6}, rollout_id=rid(), attempt_index=0, deadline_ts=soon(30))
            )
            for _ in range(2)
        ]

        async def one_running() -> bool:
            return (await c.status("cp-any", deadline_ts=soon())).running >= 1

        await until(one_running, what="a run to start")
        started = time.monotonic()
        await c.status("cp-any", deadline_ts=soon())
        assert time.monotonic() - started < 0.3  # the /run pool is full, the control one not
        results = await asyncio.gather(*runs)
        assert all(not r.replayed for r in results)


@aio
async def test_capabilities_of_our_server(client):
    caps = await client.capabilities(deadline_ts=soon())
    assert caps is not None and "prepare-report" in caps.features and "receipt" in caps.features


# ---------------------------------------------------------------- checkpoints


@aio
async def test_a_checkpoint_cycle_and_its_fences(own_server, tmp_path: Path):
    async with GymClient(own_server.endpoint) as c:
        r = rid()
        await c.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon())
        receipt = (await c.receipt(r, 0, deadline_ts=soon())).completion_receipt
        await c.acknowledge(receipt, deadline_ts=soon())
        await expect(CheckpointNotReady, c.commit("cp1", str(tmp_path / "x"), deadline_ts=soon()))

        report = await c.prepare("cp1", deadline_ts=soon())
        assert report.ready_to_commit and report.state == "preparing"
        assert (await c.prepare("cp1", deadline_ts=soon())).ready_to_commit  # recorded
        err = await expect(
            AdmissionClosed, c.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
        )
        assert err.status == 409
        await expect(CheckpointConflict, c.prepare("cp2", deadline_ts=soon()))

        answer = await c.commit("cp1", str(tmp_path / "ckpt"), deadline_ts=soon())
        assert (tmp_path / "ckpt" / "manifest.json").is_file()
        assert await c.commit("cp1", str(tmp_path / "ckpt"), deadline_ts=soon()) == answer

        resumed = await c.resume("cp1", deadline_ts=soon())
        assert resumed.state == "accepting"
        assert await c.resume("cp1", deadline_ts=soon()) == resumed  # a lost answer, resent
        for call in (
            c.status("cp1", deadline_ts=soon()),
            c.prepare("cp1", deadline_ts=soon()),
            c.retire(rid(), 0, checkpoint_id="cp1", deadline_ts=soon()),
        ):
            await expect(StaleCheckpoint, call)
        res = await c.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
        assert res.replayed is False  # admission is open again


@aio
async def test_the_seed_scenario_prepare_409_is_a_value_with_the_report(own_server, counting):
    async with GymClient(own_server.endpoint) as c:
        # 1. a run finishes on Gym, but its reply never reaches us
        await expect(
            ConnectionLost,
            c.run(
                with_faults({"reward": 0.5}, drop_reply=True),
                rollout_id="rD",
                attempt_index=0,
                deadline_ts=soon(),
            ),
        )
        # 2. prepare: not ready, a value that lists (rD, 0) with its receipt
        report = await c.prepare("cp-seed", deadline_ts=soon(1.0))
        assert not report.ready_to_commit
        assert (report.running, report.parked, report.completed_unacknowledged) == (0, 0, 1)
        listed = report.completed_unacknowledged_attempts
        assert [a.key for a in listed] == [("rD", 0)]
        assert listed[0].state == ExecutionState.COMPLETED.value
        assert listed[0].completion_receipt is not None
        # 3. re-POST /run during prepare: the stored reply; the agent does not run
        res = await c.replay({"reward": 0.5}, rollout_id="rD", attempt_index=0, deadline_ts=soon())
        assert res.replayed and res.reply == {"id": "r-rD", "reward": 0.5}
        assert res.digest == listed[0].completion_receipt.result_digest
        # 4. ACK it; 5. prepare again: ready
        assert await c.acknowledge(listed[0].completion_receipt, deadline_ts=soon()) == AckAnswer(
            acknowledged=True, idempotent=False
        )
        report = await c.prepare("cp-seed", deadline_ts=soon())
        assert report.ready_to_commit and report.completed_unacknowledged == 0
        # 6. ran once
        assert counting.starts[("rD", 0)] == 1
        assert listed[0].completion_receipt.execution_generation == 1
        await c.resume("cp-seed", deadline_ts=soon())
