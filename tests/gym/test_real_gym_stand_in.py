"""The real-Gym stand-in answers an agent failure and a status during prepare as NeMo Gym does."""

from __future__ import annotations

import asyncio
import json

import pytest

from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.real_gym import RealGymStandIn


@pytest.mark.parametrize("mode", ["repr", "plain"])
async def test_an_agent_that_raises_gets_a_bare_500_and_retire_finds_nothing_stored(wire_for, mode):
    with GymServerThread() as srv, RealGymStandIn(srv.endpoint, agent_error=mode) as gym:
        wire = wire_for(gym)
        got = await wire.run("rF", fail=True)
        assert got.status == 500
        if mode == "repr":
            text = json.loads(got.raw)
            assert isinstance(text, str) and text.startswith("SimulatedAgentError(")
        else:
            assert got.raw == b"Internal Server Error"
        assert gym.agent_failures == 1
        retired = await wire.retire("rF")
        assert retired.json == {
            "retired": False,
            "tombstoned": True,
            "completed_unacknowledged": False,
        }


async def test_status_during_prepare_lists_running_attempts_as_park_requested(wire_for):
    with GymServerThread() as srv, RealGymStandIn(srv.endpoint) as gym:
        wire = wire_for(gym)
        run = asyncio.create_task(wire.run("rP", sleep_s=30))
        await wire.until(lambda st: st["running"] == 1, what="the run to start")
        before = (await wire.status()).json
        assert [a["state"] for a in before["executions"]] == ["running"]  # accepting
        prepare = asyncio.create_task(wire.prepare("cp-park", deadline_s=30))
        st = await wire.until(lambda st: st["state"] == "preparing", what="prepare")
        assert st["running"] == 1
        assert [a["state"] for a in st["executions"]] == ["park_requested"]
        assert [a["state"] for a in st["blocking_attempts"]] == ["park_requested"]
        await wire.retire("rP", checkpoint_id="cp-park")  # the active id, as a real Gym needs
        assert (await prepare).status == 200
        await wire.resume("cp-park")
        assert (await run).status == 500  # a run retired: a real Gym's plain 500


async def test_no_receipt_or_replayed_header_behind_the_stand_in(wire_for):
    with GymServerThread() as srv, RealGymStandIn(srv.endpoint) as gym:
        wire = wire_for(gym)
        for _ in range(2):
            got = await wire.run("rX")
            assert got.status == 200
            assert "x-gym-completion-receipt" not in got.headers and not got.replayed
