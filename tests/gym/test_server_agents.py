"""The agent adapters behind the real server: ``module:function`` and an upstream HTTP Gym agent
that gains checkpoint participation by standing behind ours."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.agents import HttpAgent, make_agent, simulated_agent
from rl_gym_actors.testing.gym_process import GymServerThread


async def test_a_dotted_async_function(wire_for):
    with GymServerThread(agent="rl_gym_actors.gym.agents:simulated_agent") as server:
        got = await wire_for(server).run("rM", reward=0.75)
    assert got.json == {"id": "r-rM", "reward": 0.75}


async def test_a_dotted_sync_function_runs_in_a_thread(wire_for):
    # builtins:dict copies the row: a sync agent whose reply is the row itself
    with GymServerThread(agent="builtins:dict") as server:
        got = await wire_for(server).run("rS", reward=0.1, note="as is")
    assert got.json == {
        "_ng_rollout_id": "rS",
        "_ng_attempt_index": 0,
        "reward": 0.1,
        "note": "as is",
    }


@pytest.mark.parametrize(
    "spec",
    [
        "no_colon",
        "no_such_module_xyz:fn",
        "rl_gym_actors.gym.agents:missing",
        "rl_gym_actors:__version__",
    ],
)
def test_a_bad_agent_spec_is_a_config_error(spec):
    with pytest.raises(ConfigError):
        make_agent(spec)


def test_make_agent_kinds():
    assert make_agent("simulated") is simulated_agent
    assert isinstance(make_agent("http://127.0.0.1:1/run"), HttpAgent)
    with pytest.raises(ConfigError):
        HttpAgent("ftp://x")


@pytest.fixture
async def upstream():
    """A plain Gym agent (no checkpoint participation) on loopback, in the test's loop."""
    seen: list[dict] = []
    cancelled: list[dict] = []

    async def run(request: web.Request) -> web.Response:
        row = await request.json()
        seen.append(row)
        if row.get("explode"):
            return web.Response(status=500, text="upstream broke")
        try:
            await asyncio.sleep(row.get("sleep_s", 0))
        except asyncio.CancelledError:  # our caller closed the connection
            cancelled.append(row)
            raise
        return web.json_response({"id": f"up-{len(seen)}", "echo": row})

    app = web.Application()
    app.router.add_post("/run", run)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/run", seen, cancelled
    await runner.cleanup()


@pytest.mark.asyncio(loop_scope="session")
async def test_an_upstream_agent_gains_replay_and_ack_behind_our_server(upstream, wire_for):
    url, seen, cancelled = upstream
    with GymServerThread(agent=url) as server:
        wire = wire_for(server)
        got = await wire.run("rU", reward=0.5, prompt={"text": "hi"})
        assert got.status == 200
        assert got.json == {"id": "up-1", "echo": {"reward": 0.5, "prompt": {"text": "hi"}}}
        assert seen == [{"reward": 0.5, "prompt": {"text": "hi"}}]  # identity fields taken off
        replay = await wire.run("rU", reward=0.5)
        assert replay.replayed and replay.raw == got.raw and len(seen) == 1
        receipt = (await wire.receipt("rU")).json["completion_receipt"]
        assert receipt["result_identity"] == "up-1"
        assert (await wire.ack(receipt)).json["acknowledged"] is True
        # an upstream error is agent_failed and tombstones the key
        failed = await wire.run("rX", explode=True)
        assert (failed.status, failed.code) == (500, "agent_failed")
        assert "upstream broke" in failed.json["error"]["detail"]
        assert (await wire.run("rX")).code == "stale_attempt"
        # retire cancels a forwarded run, and the upstream sees its connection go
        slow = asyncio.create_task(wire.run("rSlow", sleep_s=30))
        await wire.until(lambda st: st["running"] == 1, what="rSlow running")
        assert (await wire.retire("rSlow")).json["retired"] is True
        assert (await slow).code == "stale_attempt"
        deadline = asyncio.get_running_loop().time() + 10
        while not cancelled:
            assert asyncio.get_running_loop().time() < deadline, "upstream run not cancelled"
            await asyncio.sleep(0.01)
        assert cancelled == [{"sleep_s": 30}]
