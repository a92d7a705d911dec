"""The lost-reply scenario, as PROTOCOL.md says it must read on the wire, in its seven steps."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from rl_gym_actors.gym.agent_checkpoint.faults import with_faults


async def test_seed_scenario(wire, agent):
    # 1. POST /run (rD, 0) finishes on Gym, but its reply never reaches RL
    with pytest.raises(aiohttp.ClientError):
        await wire.request(
            "POST",
            "/run",
            token=None,
            body=with_faults(
                {"_ng_rollout_id": "rD", "_ng_attempt_index": 0, "reward": 0.5}, drop_reply=True
            ),
        )
    assert agent.starts[("rD", 0)] == 1

    # 2. POST /prepare -> 409, running=0 parked=0 completed_unacknowledged=1, listing (rD, 0)
    refused = await wire.prepare("ckpt-1")
    assert (refused.status, refused.code) == (409, "agent_prepare_incomplete")
    report = refused.json["report"]
    assert (
        report["ready_to_commit"],
        report["running"],
        report["parked"],
        report["completed_unacknowledged"],
    ) == (False, 0, 0, 1)
    listed = report["completed_unacknowledged_attempts"]
    assert [(a["rollout_id"], a["attempt_index"]) for a in listed] == [("rD", 0)]

    # 3. POST /run (rD, 0) during prepare -> the stored reply; the agent did not run
    replay = await wire.run("rD", 0, reward=0.5)
    assert replay.status == 200 and replay.replayed
    assert replay.json == {"id": "r-rD", "reward": 0.5}
    assert agent.starts[("rD", 0)] == 1

    # 4. POST /acknowledge with its receipt -> {"acknowledged": true, "idempotent": false}
    receipt = (await wire.receipt("rD", 0)).json["completion_receipt"]
    assert receipt == listed[0]["completion_receipt"]
    acked = await wire.ack(receipt)
    assert acked.json == {"acknowledged": True, "idempotent": False}

    # 5. POST /prepare again -> 200, ready_to_commit=true running=0 parked=0 completed_unack=0
    ready = await wire.prepare("ckpt-1")
    assert ready.status == 200
    assert (
        ready.json["ready_to_commit"],
        ready.json["running"],
        ready.json["parked"],
        ready.json["completed_unacknowledged"],
    ) == (True, 0, 0, 0)

    # 6. the agent ran (rD, 0) exactly once; execution_generation is still 1
    assert agent.starts[("rD", 0)] == 1
    assert receipt["execution_generation"] == 1
    assert (await wire.receipt("rD", 0)).json == {
        "state": "acknowledged",
        "completion_receipt": receipt,
    }

    # 7. POST /retire (rT, 0) while it still runs -> {"retired": true, "tombstoned": true}
    assert (await wire.resume("ckpt-1")).status == 200
    running = asyncio.create_task(wire.run("rT", 0, sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rT running")
    retired = await wire.retire("rT", 0)
    assert (retired.json["retired"], retired.json["tombstoned"]) == (True, True)
    cancelled = await asyncio.wait_for(running, 10)
    assert (cancelled.status, cancelled.code) == (409, "stale_attempt")
    assert (await wire.status()).json["running"] == 0
