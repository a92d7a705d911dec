"""The client's pure parts: error mapping, retry policy, deadline arithmetic, argument checks.

No Gym server here: a fake clock drives the retry loop, and the few network tests aim at a
loopback port that is bound but not listening (so a connection is refused, reliably).
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import socket
import threading
import time

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.errors import (
    ERROR_BY_CODE,
    AgentFailed,
    CheckpointConflict,
    CheckpointFailed,
    ConfigError,
    ConnectionLost,
    DeadlineExceeded,
    GymRejected,
    GymServerError,
    InvalidRequest,
    PoolClosed,
    ProtocolViolation,
    RlGymError,
    ServerBusy,
    StaleAttempt,
    Unauthorized,
    gym_error,
)
from rl_gym_actors.failures import failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import (
    GymClient,
    RunResult,
    error_for_response,
    run_failure,
)
from rl_gym_actors.gym.retry import (
    RetryOn,
    RetryPolicy,
    call_with_retry,
    check_deadline,
    is_retryable,
    remaining,
)
from rl_gym_actors.protocol import CompletionReceipt, result_digest

aio = pytest.mark.asyncio(loop_scope="session")  # the suite shares one event loop

T0 = 1_700_000_000.0


class FakeTime:
    """A clock that only moves when the retry loop sleeps (or a try says it took time)."""

    def __init__(self, start: float = T0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def scripted(outcomes: list, fake: FakeTime, took: float = 0.0):
    """An attempt that fails or succeeds as scripted, recording each try's deadline."""
    seen: list[float] = []

    async def attempt(try_deadline: float):
        seen.append(try_deadline)
        fake.now += took
        outcome = outcomes[min(len(seen) - 1, len(outcomes) - 1)]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return attempt, seen


# ---------------------------------------------------------------- error mapping


def body(code: str, detail: str = "d", **extra) -> bytes:
    return json.dumps({"error": {"code": code, "detail": detail}, **extra}).encode()


@pytest.mark.parametrize("code,cls", sorted(ERROR_BY_CODE.items()))
def test_every_known_code_maps_to_its_class(code, cls):
    err = error_for_response(409, body(code, "why"), url="http://h/x")
    assert type(err) is cls
    assert (err.status, err.code, err.detail, err.url) == (409, code, "why", "http://h/x")


def test_fastapi_default_422_is_invalid_request_with_the_locations():
    raw = json.dumps(
        {
            "detail": [
                {
                    "type": "missing",
                    "loc": ["body", "checkpoint_id"],
                    "msg": "Field required",
                    "input": {},
                }
            ]
        }
    ).encode()
    err = error_for_response(422, raw)
    assert isinstance(err, InvalidRequest)
    assert err.code == "invalid_request" and "body.checkpoint_id: Field required" in err.detail


def test_fastapi_style_401_is_unauthorized():
    err = error_for_response(401, b'{"detail": "Not authenticated"}')
    assert isinstance(err, Unauthorized) and err.detail == "Not authenticated"


def test_plain_text_500_is_a_lost_connection_carrying_the_text():
    err = error_for_response(500, b"Internal Server Error", url="http://h/run")
    assert isinstance(err, ConnectionLost) and "Internal Server Error" in str(err)
    assert isinstance(error_for_response(502, b""), ConnectionLost)
    assert isinstance(error_for_response(503, b"[1, 2]"), ConnectionLost)


@pytest.mark.parametrize(
    "status, raw, text",
    [
        (500, b"\"RuntimeError('the agent raised')\"", "RuntimeError('the agent raised')"),
        (500, b"Internal Server Error", "Internal Server Error"),
        (502, b"", ""),
        (500, b'{"error": {"code": "agent_failed", "detail": "boom"}}', "boom"),
        (503, b'{"error": {"code": "store_unavailable", "detail": "disk"}}', "disk"),
    ],
)
def test_a_5xx_to_run_is_agent_failed_with_status_and_text(status, raw, text):
    err = run_failure(status, raw, url="http://h/run")
    assert type(err) is AgentFailed and err.status == status and err.detail == text
    assert err.url == "http://h/run"


def test_a_503_too_many_connections_to_run_is_server_busy_not_agent_failed():
    err = run_failure(503, body("too_many_connections", "full"), url="http://h/run")
    assert type(err) is ServerBusy and (err.status, err.detail) == (503, "full")
    kind = failure_kind(err)
    assert kind.is_transport and kind.may_pass  # nothing ran: not the row's, sent again
    assert type(error_for_response(503, body("too_many_connections"))) is ServerBusy


def test_json_5xx_maps_by_code_and_unknown_codes_are_server_errors():
    assert isinstance(error_for_response(500, body("agent_failed")), AgentFailed)
    err = error_for_response(503, body("overloaded"))
    assert isinstance(err, GymServerError) and not isinstance(err, GymRejected)
    assert err.code == "overloaded" and err.status == 503


def test_other_4xx_are_rejections():
    assert isinstance(error_for_response(404, b'{"detail": "Not Found"}'), InvalidRequest)
    assert isinstance(error_for_response(409, body("something_new")), GymRejected)
    assert isinstance(error_for_response(405, b"Method Not Allowed"), GymRejected)


def all_errors() -> list[RlGymError]:
    errs: list[RlGymError] = [
        gym_error(409, code, f"detail of {code}", url="http://h/p", body={"error": {"code": code}})
        for code in ERROR_BY_CODE
    ]
    errs += [
        gym_error(503, "overloaded", "busy"),
        gym_error(418, None, "teapot"),
        ConnectionLost("reset", url="http://h/run"),
        DeadlineExceeded("late", url="http://h"),
        ProtocolViolation("bad digest"),
        ConfigError("bad id"),
        PoolClosed("closed"),
        CheckpointFailed("gave up", checkpoint_id="c1", blockers={"h": [["r", 0]]}),
    ]
    return errs


@pytest.mark.parametrize("err", all_errors(), ids=lambda e: type(e).__name__ + ":" + str(e)[:20])
def test_every_error_pickles_with_all_its_fields(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert back.__dict__ == err.__dict__ and str(back) == str(err)
    if isinstance(err, DeadlineExceeded):
        assert isinstance(back, TimeoutError)


# ---------------------------------------------------------------- policy and deadlines


def test_policy_refuses_bad_values():
    # a settings object like every other: one line of ConfigError names the field
    for bad in (
        dict(attempts=0),
        dict(attempts=True),
        dict(jitter=1.5),
        dict(backoff_multiplier=0.5),
        dict(try_timeout_s=0),
        dict(backoff_initial_s=math.nan),
        dict(backoff_max_s=math.inf),
        dict(min_try_s=-1),
    ):
        with pytest.raises(ConfigError) as info:
            RetryPolicy(**bad)
        assert str(info.value).startswith(f"invalid RetryPolicy: {next(iter(bad))}: ")


def test_the_retry_policy_is_reachable_from_the_try_policy():
    policy = TryPolicy.model_validate({"retry": {"attempts": 2, "backoff_max_s": 0.5}})
    assert policy.retry == RetryPolicy(attempts=2, backoff_max_s=0.5)
    assert TryPolicy().retry == RetryPolicy()


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 200),
    rand=st.floats(0, 1, exclude_max=True),
    initial=st.floats(0, 5),
    cap=st.floats(0, 10),
    mult=st.floats(1, 10),
    jitter=st.floats(0, 1),
)
def test_backoff_stays_within_its_jitter_band_and_cap(n, rand, initial, cap, mult, jitter):
    policy = RetryPolicy(
        backoff_initial_s=initial, backoff_max_s=cap, backoff_multiplier=mult, jitter=jitter
    )
    try:
        base = min(cap, initial * mult ** (n - 1))
    except OverflowError:
        base = cap
    sleep = policy.backoff(n, rand)
    assert base * (1 - jitter) - 1e-9 <= sleep <= base + 1e-9 and sleep <= cap + 1e-9


@settings(max_examples=200, deadline=None)
@given(left=st.floats(-10, 1e4), margin=st.floats(0, 5))
def test_wire_deadline_leaves_a_margin_of_at_most_a_tenth(left, margin):
    policy = RetryPolicy(reply_margin_s=margin)
    wire = policy.wire_deadline(T0 + left, T0)
    assert wire <= T0 + left
    assert (T0 + left) - wire <= max(left, 0) / 10 + 1e-6


def test_try_deadline_and_remaining():
    assert RetryPolicy().try_deadline(T0 + 5, T0) == T0 + 5
    assert RetryPolicy(try_timeout_s=1).try_deadline(T0 + 5, T0) == T0 + 1
    assert RetryPolicy(try_timeout_s=9).try_deadline(T0 + 5, T0) == T0 + 5
    assert remaining(T0 + 2, T0) == 2 and remaining(T0, T0 + 2) == 0


def test_deadline_must_be_absolute_and_finite():
    assert check_deadline(T0) == T0
    for bad in (5.0, math.nan, math.inf, "soon", None):
        with pytest.raises(ConfigError):
            check_deadline(bad)


def test_what_each_kind_retries():
    lost, late = ConnectionLost("x"), DeadlineExceeded("x")
    server, rejected = gym_error(503, "boom"), StaleAttempt("x")
    kw = dict(deadline_ts=T0 + 1, now=T0)
    assert [is_retryable(e, RetryOn.IDEMPOTENT, **kw) for e in (lost, late, server, rejected)] == [
        True,
        True,
        True,
        False,
    ]
    assert [is_retryable(e, RetryOn.TRANSPORT, **kw) for e in (lost, late, server, rejected)] == [
        True,
        False,
        False,
        False,
    ]
    assert not any(is_retryable(e, RetryOn.NOTHING, **kw) for e in (lost, late, server))
    busy = gym_error(503, "too_many_connections")  # refused unread: every kind sends it again
    assert all(is_retryable(busy, k, **kw) for k in RetryOn if k is not RetryOn.CHECKPOINT_HELD)
    assert not is_retryable(late, RetryOn.IDEMPOTENT, deadline_ts=T0, now=T0)  # the call's own
    assert not is_retryable(asyncio.CancelledError(), RetryOn.IDEMPOTENT, **kw)
    assert not is_retryable(ProtocolViolation("x"), RetryOn.IDEMPOTENT, **kw)


# ---------------------------------------------------------------- the retry loop (fake clock)


@aio
async def test_retries_a_lost_connection_then_succeeds():
    fake = FakeTime()
    attempt, seen = scripted([ConnectionLost("a"), gym_error(503, "boom"), "ok"], fake)
    policy = RetryPolicy(attempts=5, backoff_initial_s=0.1, backoff_multiplier=2, jitter=0)
    got = await call_with_retry(
        attempt,
        kind=RetryOn.IDEMPOTENT,
        policy=policy,
        deadline_ts=T0 + 10,
        clock=fake,
        sleep=fake.sleep,
    )
    assert got == "ok" and len(seen) == 3
    assert fake.sleeps == pytest.approx([0.1, 0.2])


@aio
async def test_stops_at_the_attempts_bound_with_the_last_error():
    fake = FakeTime()
    attempt, seen = scripted([ConnectionLost("first"), ConnectionLost("last")], fake)
    with pytest.raises(ConnectionLost, match="last"):
        await call_with_retry(
            attempt,
            kind=RetryOn.IDEMPOTENT,
            policy=RetryPolicy(attempts=3),
            deadline_ts=T0 + 60,
            clock=fake,
            sleep=fake.sleep,
        )
    assert len(seen) == 3


@pytest.mark.parametrize(
    "kind,err",
    [
        (RetryOn.IDEMPOTENT, StaleAttempt("no")),
        (RetryOn.IDEMPOTENT, ProtocolViolation("bad")),
        (RetryOn.TRANSPORT, gym_error(503, "boom")),
        (RetryOn.NOTHING, ConnectionLost("lost")),
    ],
)
@aio
async def test_no_retry_where_the_kind_forbids_it(kind, err):
    fake = FakeTime()
    attempt, seen = scripted([err, "ok"], fake)
    with pytest.raises(type(err)):
        await call_with_retry(
            attempt,
            kind=kind,
            policy=RetryPolicy(attempts=5),
            deadline_ts=T0 + 60,
            clock=fake,
            sleep=fake.sleep,
        )
    assert len(seen) == 1 and fake.sleeps == []


@aio
async def test_never_sleeps_past_the_deadline():
    fake = FakeTime()
    attempt, seen = scripted([ConnectionLost("x")], fake, took=0.05)
    policy = RetryPolicy(
        attempts=100, backoff_initial_s=0.2, backoff_multiplier=1, jitter=0, min_try_s=0.01
    )
    with pytest.raises(ConnectionLost):
        await call_with_retry(
            attempt,
            kind=RetryOn.IDEMPOTENT,
            policy=policy,
            deadline_ts=T0 + 1.0,
            clock=fake,
            sleep=fake.sleep,
        )
    # tries at 0, .25, .5, .75; a fifth would start at 1.0 + 0.05 > deadline - min_try_s
    assert len(seen) == 4 and fake.now <= T0 + 1.0


@aio
async def test_a_backoff_that_overruns_the_deadline_raises_the_real_cause():
    """On a loaded machine a backoff's sleep can end past the deadline (seen in CI: a status to
    a killed server raised DeadlineExceeded 'before the call' instead of the lost connection):
    the call fails with the failure it retried, and no try is sent past the deadline."""

    class Overrun(FakeTime):
        async def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            self.now += seconds + 5.0  # the loop woke up long after the deadline

    fake = Overrun()
    attempt, seen = scripted([ConnectionLost("refused"), "ok"], fake)
    policy = RetryPolicy(attempts=5, backoff_initial_s=0.05, jitter=0, min_try_s=0.01)
    with pytest.raises(ConnectionLost, match="refused"):
        await call_with_retry(
            attempt,
            kind=RetryOn.IDEMPOTENT,
            policy=policy,
            deadline_ts=T0 + 1.0,
            clock=fake,
            sleep=fake.sleep,
        )
    assert len(seen) == 1 and fake.sleeps == [0.05]


@aio
async def test_one_try_timeout_is_retried_but_the_calls_deadline_is_final():
    fake = FakeTime()
    policy = RetryPolicy(attempts=10, try_timeout_s=0.3, backoff_initial_s=0.0)
    seen: list[float] = []

    async def attempt(try_deadline: float):
        seen.append(try_deadline)
        fake.now = try_deadline  # every try hangs until its own deadline
        raise DeadlineExceeded("hung")

    with pytest.raises(DeadlineExceeded):
        await call_with_retry(
            attempt,
            kind=RetryOn.IDEMPOTENT,
            policy=policy,
            deadline_ts=T0 + 1.0,
            clock=fake,
            sleep=fake.sleep,
        )
    assert seen == pytest.approx([T0 + 0.3, T0 + 0.6, T0 + 0.9, T0 + 1.0])
    assert fake.now == pytest.approx(T0 + 1.0)


@aio
@pytest.mark.parametrize("kind", [RetryOn.NOTHING, RetryOn.TRANSPORT])
async def test_only_idempotent_tries_are_cut_by_the_try_timeout(kind):
    fake = FakeTime()
    attempt, seen = scripted(["ok"], fake)
    policy = RetryPolicy(attempts=5, try_timeout_s=0.5)
    await call_with_retry(
        attempt, kind=kind, policy=policy, deadline_ts=T0 + 30, clock=fake, sleep=fake.sleep
    )
    assert seen == [T0 + 30]  # a run, or a prepare the server lets wait, gets it all


@aio
async def test_a_checkpoint_in_the_way_is_waited_out_until_the_deadline_whatever_the_attempts():
    fake = FakeTime()
    held = CheckpointConflict("held", status=409)
    attempt, seen = scripted([held] * 8 + ["prepared"], fake, took=0.05)
    heard: list[BaseException] = []
    policy = RetryPolicy(attempts=2, backoff_initial_s=0.05, backoff_max_s=0.5, jitter=0)
    got = await call_with_retry(
        attempt,
        kind=RetryOn.CHECKPOINT_HELD,
        policy=policy,
        deadline_ts=T0 + 30,
        clock=fake,
        sleep=fake.sleep,
        on_retry=heard.append,
    )
    assert got == "prepared" and len(seen) == 9 and heard == [held] * 8
    assert fake.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5])
    fake, lost = FakeTime(), ConnectionLost("x")  # only the conflict is waited out
    attempt, seen = scripted([lost, "ok"], fake)
    with pytest.raises(ConnectionLost):
        await call_with_retry(
            attempt,
            kind=RetryOn.CHECKPOINT_HELD,
            policy=policy,
            deadline_ts=T0 + 30,
            clock=fake,
            sleep=fake.sleep,
        )
    fake = FakeTime()
    attempt, seen = scripted([held] * 100, fake, took=0.05)
    with pytest.raises(CheckpointConflict):
        await call_with_retry(
            attempt,
            kind=RetryOn.CHECKPOINT_HELD,
            policy=policy,
            deadline_ts=T0 + 2,
            clock=fake,
            sleep=fake.sleep,
        )
    assert fake.now <= T0 + 2


@aio
async def test_cancellation_is_never_retried():
    fake = FakeTime()
    attempt, seen = scripted([asyncio.CancelledError()], fake)
    with pytest.raises(asyncio.CancelledError):
        await call_with_retry(
            attempt,
            kind=RetryOn.IDEMPOTENT,
            policy=RetryPolicy(attempts=5),
            deadline_ts=T0 + 60,
            clock=fake,
            sleep=fake.sleep,
        )
    assert len(seen) == 1


@aio
async def test_cancelling_during_a_backoff_ends_the_call_at_once():
    tries = 0
    failed = asyncio.Event()

    async def attempt(try_deadline: float):
        nonlocal tries
        tries += 1
        failed.set()
        raise ConnectionLost("x")

    policy = RetryPolicy(attempts=5, backoff_initial_s=30, jitter=0)
    task = asyncio.create_task(
        call_with_retry(
            attempt, kind=RetryOn.IDEMPOTENT, policy=policy, deadline_ts=time.time() + 120
        )
    )
    await asyncio.wait_for(failed.wait(), 5)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert tries == 1 and time.monotonic() - started < 1


# ---------------------------------------------------------------- the client without a server


@pytest.fixture
def refused_endpoint():
    """A loopback port that is bound but not listening: every connection is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield GymEndpoint(url=f"http://127.0.0.1:{sock.getsockname()[1]}", token="t")
    sock.close()


def test_the_client_pickles_as_its_construction_arguments(refused_endpoint):
    policy = RetryPolicy(attempts=2, try_timeout_s=1.5)
    client = GymClient(refused_endpoint, limit=7, retry=policy)
    back = pickle.loads(pickle.dumps(client))
    assert type(back) is GymClient and back is not client
    assert back.endpoint == refused_endpoint and back.retry == policy


def test_run_result_digest_is_the_canonical_digest():
    reply = {"reward": 0.5, "id": "r-x", "text": "é"}
    assert RunResult(reply, False, b"").digest == result_digest(reply)


@aio
async def test_bad_arguments_are_config_errors_before_any_network(refused_endpoint):
    receipt = CompletionReceipt.for_reply("r1", 0, 1, {"id": "r-r1"})
    dl = time.time() + 5
    async with GymClient(refused_endpoint) as client:
        bad_calls = [
            client.run({}, rollout_id="bad id", attempt_index=0, deadline_ts=dl),
            client.run({}, rollout_id="r1", attempt_index=-1, deadline_ts=dl),
            client.run(
                {"_ng_rollout_id": "other"}, rollout_id="r1", attempt_index=0, deadline_ts=dl
            ),
            client.run({"x": math.nan}, rollout_id="r1", attempt_index=0, deadline_ts=dl),
            client.run({}, rollout_id="r1", attempt_index=0, deadline_ts=5.0),
            client.receipt("r1", True, deadline_ts=dl),
            client.status("", deadline_ts=dl),
            client.retire("r1", 0, checkpoint_id="no/slash", deadline_ts=dl),
            client.commit("c1", "", deadline_ts=dl),
            client.acknowledge({"rollout_id": "r1"}, deadline_ts=dl),
            client.acknowledge_completed([], deadline_ts=dl),
            client.acknowledge_completed([receipt, receipt], deadline_ts=dl),
        ]
        for call in bad_calls:
            with pytest.raises(ConfigError):
                await call


@aio
async def test_a_passed_deadline_raises_without_connecting(refused_endpoint):
    async with GymClient(refused_endpoint) as client:
        with pytest.raises(DeadlineExceeded):  # a connection attempt would be ConnectionLost
            await client.status("c1", deadline_ts=time.time() - 0.001)


@aio
async def test_a_refused_connection_is_connection_lost(refused_endpoint):
    policy = RetryPolicy(attempts=3, backoff_initial_s=0.01)
    async with GymClient(refused_endpoint, retry=policy) as client:
        with pytest.raises(ConnectionLost) as info:
            await client.run({}, rollout_id="r1", attempt_index=0, deadline_ts=time.time() + 5)
        assert isinstance(info.value.__cause__, OSError)  # raised from the foreign error
        with pytest.raises(ConnectionLost):
            await client.status("c1", deadline_ts=time.time() + 5)


@aio
async def test_a_closed_client_raises_pool_closed(refused_endpoint):
    client = GymClient(refused_endpoint)
    await client.close()
    with pytest.raises(PoolClosed):
        await client.status("c1", deadline_ts=time.time() + 5)


@aio
async def test_a_client_stays_on_the_loop_that_first_used_it(refused_endpoint):
    async with GymClient(refused_endpoint, retry=RetryPolicy(attempts=1)) as client:
        with pytest.raises(ConnectionLost):
            await client.status("c1", deadline_ts=time.time() + 5)
        caught: list[BaseException] = []

        def other_loop() -> None:
            try:
                asyncio.run(client.status("c1", deadline_ts=time.time() + 5))
            except BaseException as exc:
                caught.append(exc)

        thread = threading.Thread(target=other_loop)
        thread.start()
        thread.join(10)
        assert len(caught) == 1 and isinstance(caught[0], ConfigError)


@aio
async def test_a_passed_in_session_is_used_and_left_open(refused_endpoint):
    session = aiohttp.ClientSession()
    async with GymClient(refused_endpoint, session=session, retry=RetryPolicy(attempts=1)) as c:
        with pytest.raises(ConnectionLost):
            await c.status("c1", deadline_ts=time.time() + 5)
    assert not session.closed
    await session.close()
    async with GymClient(refused_endpoint, session=session) as c:
        with pytest.raises(PoolClosed):
            await c.status("c1", deadline_ts=time.time() + 5)
