"""A server at its connection cap answers 503 ``too_many_connections`` before it reads the
request: the client reads that as ``ServerBusy`` (infrastructure, nothing ran, may pass), not
as ``AgentFailed``; ``/run`` is sent again with backoff inside its deadline and runs once a
connection frees. The real server on loopback, its cap held by raw sockets; an aiohttp trace on
the client's own session counts the refusals it met."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from rl_gym_actors.errors import ServerBusy
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.retry import RetryPolicy
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import scaled, soon, until

aio = pytest.mark.asyncio(loop_scope="session")
CAP = 4
# a retry policy whose tries only the deadline bounds, at most 0.2 s apart
PATIENT = RetryPolicy(attempts=10_000, backoff_initial_s=0.02, backoff_max_s=0.2)


@pytest.fixture(scope="module")
def agent() -> CountingAgent:
    return CountingAgent()


@pytest.fixture(scope="module")
def server(agent: CountingAgent) -> Iterator[GymServerThread]:
    args = ["--max-connections", str(CAP), "--idle-timeout-s", "120"]
    with GymServerThread(agent=agent, args=args) as srv:
        yield srv


def _open(srv: GymServerThread) -> int:
    return len(srv.server._uvicorn.server_state.connections)


@asynccontextmanager
async def _cap_held(srv: GymServerThread) -> AsyncIterator[list[asyncio.StreamWriter]]:
    """Every connection the server takes, held open by raw sockets that send nothing."""
    host, port = srv.url.split("//", 1)[1].rsplit(":", 1)
    await until(lambda: _open(srv) == 0, what="no connection open before the test")
    held = [(await asyncio.open_connection(host, int(port)))[1] for _ in range(CAP)]
    try:
        await until(lambda: _open(srv) >= CAP, what=f"{CAP} connections open")
        yield held
    finally:
        for writer in held:
            writer.close()


@asynccontextmanager
async def _client(srv: GymServerThread) -> AsyncIterator[tuple[GymClient, list[str]]]:
    """A client on a session of its own that notes the path of every 503 answered to it."""
    seen: list[str] = []

    async def on_end(_s: object, _c: object, params: aiohttp.TraceRequestEndParams) -> None:
        if params.response.status == 503:
            seen.append(params.url.path)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    async with (
        aiohttp.ClientSession(trace_configs=[trace]) as session,
        GymClient(srv.endpoint, session=session, retry=PATIENT) as client,
    ):
        yield client, seen


def _rid() -> str:
    return f"busy-{uuid.uuid4().hex[:10]}"


# the deadlines the refusals are expected to outlast are not scaled (polling's rule): 1 s


@aio
async def test_a_run_refused_at_the_cap_until_its_deadline_is_server_busy_and_never_ran(
    server, agent
):
    key = _rid()
    async with _client(server) as (c, seen), _cap_held(server):
        with pytest.raises(ServerBusy) as info:
            await c.run({}, rollout_id=key, attempt_index=0, deadline_ts=time.time() + 1.0)
    err = info.value
    assert (err.status, err.code) == (503, "too_many_connections")
    kind = failure_kind(err)
    assert kind is FailureKind.BUSY and kind.is_transport and kind.may_pass
    assert "/run" in seen  # a refusal, not a lost connection (sent again: the next test)
    assert agent.runs_of(key) == 0  # refused before the request was read: nothing ran


@aio
async def test_a_run_refused_at_the_cap_is_sent_again_and_runs_once_a_connection_frees(
    server, agent
):
    key = _rid()
    async with _client(server) as (c, seen):
        async with _cap_held(server):
            run = asyncio.ensure_future(
                c.run({}, rollout_id=key, attempt_index=0, deadline_ts=soon(30))
            )
            await until(lambda: "/run" in seen or run.done(), what="a refused /run")
        # the held connections are closed: a connection frees
        got = await asyncio.wait_for(run, scaled(30))
    assert got.reply is not None and got.receipt is not None
    assert agent.runs_of(key) == 1


@aio
async def test_a_control_call_refused_at_the_cap_is_server_busy(server):
    async with _client(server) as (c, seen), _cap_held(server):
        with pytest.raises(ServerBusy):
            await c.status("c1", deadline_ts=time.time() + 1.0)
    assert seen  # the refusal itself, answered to the status call
