"""Fault injection (gym/agent_checkpoint/faults.py), honoured only with --allow-faults."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import pytest

from rl_gym_actors.gym.agent_checkpoint.faults import with_faults, without_faults
from rl_gym_actors.protocol import canonical_json
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import until

ROW = {"_ng_rollout_id": "rD", "_ng_attempt_index": 0, "reward": 0.5}


async def test_drop_reply_loses_the_first_answer_only_and_keeps_the_reply(wire, agent, gym):
    with pytest.raises(aiohttp.ClientError):  # the body is cut short and the connection closed
        await wire.request("POST", "/run", body=with_faults(ROW, drop_reply=True), token=None)
    assert gym.faults.dropped == 1
    receipt = (await wire.receipt("rD")).json["completion_receipt"]  # stored, durably
    replay = await wire.run("rD", reward=0.5, drop_reply=True)
    assert replay.status == 200 and replay.replayed
    assert replay.json == {"id": "r-rD", "reward": 0.5}
    assert receipt["result_digest"] == hashlib.sha256(canonical_json(replay.json)).hexdigest()
    assert (await wire.run("rD")).status == 200  # every replay answers
    assert agent.starts[("rD", 0)] == 1


async def test_receipt_delay_holds_the_first_receipt_request_only(wire, gym):
    await wire.run("rD", receipt_delay_s=1.0)
    with pytest.raises(asyncio.TimeoutError):
        await wire.receipt("rD", timeout_s=0.2)
    assert gym.faults.delayed == 1
    got = await wire.receipt("rD", timeout_s=0.5)  # later ones at once
    assert got.status == 200 and got.json["state"] == "completed"


async def test_a_held_receipt_request_ends_when_its_caller_hangs_up(agent, wire_for):
    """A caller that gives up on a held receipt leaves nothing running on the server (else a
    stopping server waits its graceful timeout on it)."""
    with GymServerThread(agent=agent, allow_faults=True) as server:
        w = wire_for(server)
        await w.run("rH", receipt_delay_s=60)
        with pytest.raises(asyncio.TimeoutError):
            await w.receipt("rH", timeout_s=0.2)  # its session closes: the caller hangs up
        assert server.faults.delayed == 1
        requests = server.server._uvicorn.server_state.tasks
        await until(lambda: not requests, timeout_s=5, what="the held request to end")


async def test_a_fault_plan_comes_from_the_first_row_of_a_key(wire, gym):
    await wire.run("rD")
    replay = await wire.run("rD", drop_reply=True, receipt_delay_s=5)
    assert replay.status == 200
    assert (await wire.receipt("rD", timeout_s=2)).status == 200
    assert (gym.faults.dropped, gym.faults.delayed) == (0, 0)


async def test_without_allow_faults_the_fields_are_ordinary_row_data(agent, wire_for):
    with GymServerThread(agent=agent, allow_faults=False) as server:
        w = wire_for(server)
        got = await w.run("rD", reward=0.5, drop_reply=True, receipt_delay_s=30)
        assert got.status == 200 and got.json == {"id": "r-rD", "reward": 0.5}
        assert (await w.receipt("rD", timeout_s=2)).status == 200
        assert "faults" not in (await w.capabilities()).json["features"]


def test_row_helpers():
    row = with_faults(ROW, drop_reply=True, receipt_delay_s=2)
    assert row == {**ROW, "drop_reply": True, "receipt_delay_s": 2.0}
    assert without_faults(row) == ROW
    assert with_faults(ROW) == ROW


async def test_the_injector_holds_nothing_for_plain_rows_or_fired_plans(agent, wire_for):
    """A long run must not grow the server: the injector keeps only plans not yet fired."""
    with GymServerThread(agent=agent, allow_faults=True) as server:
        w = wire_for(server)

        def held() -> int:  # entries in every container the injector owns
            return sum(
                len(v) for v in vars(server.faults).values() if isinstance(v, (set, dict, list))
            )

        for i in range(30):
            assert (await w.run(f"rM{i}")).status == 200
        assert held() == 0
        assert (await w.run("rM-late", receipt_delay_s=0.05)).status == 200
        assert server.faults.planned == 1
        assert (await w.receipt("rM-late", timeout_s=5)).status == 200  # fires the plan
        replay = await w.run("rM-late", receipt_delay_s=5, drop_reply=True)
        assert replay.status == 200 and replay.replayed  # not the first row
        assert (await w.receipt("rM-late", timeout_s=2)).status == 200
        assert held() == 0 and server.faults.planned == 0
