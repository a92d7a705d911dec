"""`POST /run` against the real server on loopback: every row of PROTOCOL.md's table, in order."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
import pytest

from rl_gym_actors.protocol import canonical_json
from rl_gym_actors.testing import failing_agents
from rl_gym_actors.testing.gym_process import GymServerThread


async def test_new_key_runs_the_agent_and_answers_its_reply(wire, agent):
    got = await wire.run("rA", reward=0.5)
    assert got.status == 200
    assert got.json == {"id": "r-rA", "reward": 0.5}
    assert not got.replayed and "x-gym-replayed" not in got.headers
    assert agent.starts[("rA", 0)] == 1


async def test_completed_key_answers_the_stored_reply_and_the_agent_does_not_run(wire, agent):
    first = await wire.run("rD", reward=0.5)
    again = await wire.run("rD", reward=0.9)  # a different row: still the stored reply
    assert again.status == 200 and again.replayed
    assert again.raw == first.raw
    assert agent.starts[("rD", 0)] == 1


async def test_acked_key_is_stale(wire, agent):
    receipt = await wire.complete("rA")
    assert (await wire.ack(receipt)).status == 200
    got = await wire.run("rA")
    assert (got.status, got.code) == (409, "stale_attempt")
    assert agent.starts[("rA", 0)] == 1


async def test_tombstoned_key_is_stale_and_never_runs(wire, agent):
    assert (await wire.retire("rT")).json["tombstoned"] is True
    got = await wire.run("rT")
    assert (got.status, got.code) == (409, "stale_attempt")
    assert agent.starts[("rT", 0)] == 0


async def test_running_key_is_a_duplicate_and_a_retired_runs_caller_gets_stale_attempt(wire, agent):
    first = asyncio.create_task(wire.run("rR", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rR running")
    dup = await wire.run("rR")
    assert (dup.status, dup.code) == (409, "duplicate_execution")
    assert (await wire.retire("rR")).json == {
        "retired": True,
        "tombstoned": True,
        "completed_unacknowledged": False,
    }
    waited = await asyncio.wait_for(first, 10)
    assert (waited.status, waited.code) == (409, "stale_attempt")
    assert agent.starts[("rR", 0)] == 1
    assert (await wire.status()).json["running"] == 0


async def test_admission_closed_between_prepare_and_resume(wire, agent):
    assert (await wire.prepare("c1")).status == 200
    got = await wire.run("rN")
    assert (got.status, got.code) == (409, "agent_admission_closed")
    assert agent.starts[("rN", 0)] == 0
    assert (await wire.resume("c1")).status == 200
    assert (await wire.run("rN")).status == 200


async def test_the_order_of_decisions_during_prepare(wire, agent):
    """ACKed and tombstoned keys are stale and a completed key replays even while admission is
    closed; only a key never seen meets the closed admission."""
    acked = await wire.complete("rA")
    await wire.ack(acked)
    await wire.retire("rT")
    await wire.complete("rC")
    assert (await wire.prepare("c1")).status == 409  # rC is un-ACKed
    assert (await wire.run("rA")).code == "stale_attempt"
    assert (await wire.run("rT")).code == "stale_attempt"
    replay = await wire.run("rC")
    assert replay.status == 200 and replay.replayed
    assert (await wire.run("rNew")).code == "agent_admission_closed"
    assert agent.starts == {("rA", 0): 1, ("rC", 0): 1}


async def test_a_row_the_simulated_agent_fails_is_422_agent_data_failed_and_tombstones_it(
    wire, agent
):
    got = await wire.run("rF", fail=True)
    assert (got.status, got.code) == (422, "agent_data_failed")
    assert "SimulatedAgentError" in got.json["error"]["detail"]
    assert (await wire.run("rF")).code == "stale_attempt"
    assert (await wire.receipt("rF")).code == "stale_attempt"
    assert agent.starts[("rF", 0)] == 1


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("fails_as_data", (422, "agent_data_failed")),
        ("raises_value_error", (422, "agent_data_failed")),  # unexpected: data
        ("raises_key_error", (422, "agent_data_failed")),
        ("fails_transiently", (500, "agent_failed")),
        ("times_out", (500, "agent_failed")),  # infrastructure
    ],
)
async def test_what_an_agent_raises_decides_the_answer(wire_for, name, answer):
    with GymServerThread(agent=getattr(failing_agents, name)) as server:
        got = await wire_for(server).run("rX")
        assert (got.status, got.code) == answer
        assert (await wire_for(server).run("rX")).code == "stale_attempt"  # tombstoned


async def test_a_reply_that_is_not_json_is_a_data_failure(wire_for):
    async def bad_agent(row):
        return {"reward": float("nan")}

    with GymServerThread(agent=bad_agent) as server:
        got = await wire_for(server).run("rN")
        assert (got.status, got.code) == (422, "agent_data_failed")
        assert (await wire_for(server).run("rN")).code == "stale_attempt"


async def test_a_caller_that_stops_waiting_does_not_cancel_the_run(wire, agent):
    with pytest.raises((asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        await wire.run("rL", sleep_s=0.3, reward=0.25, timeout_s=0.05)
    await wire.until(lambda st: st["completed_unacknowledged"] == 1, what="rL completed")
    replay = await wire.run("rL")
    assert replay.replayed and replay.json == {"id": "r-rL", "reward": 0.25}
    assert agent.starts[("rL", 0)] == 1


async def test_attempts_are_separate_keys(wire, agent):
    await wire.complete("rK", 0)
    await wire.complete("rK", 1)
    assert agent.starts == {("rK", 0): 1, ("rK", 1): 1}


async def test_row_fields_reach_the_agent_untouched(wire_for):
    seen = []

    async def echo(row):
        seen.append(row)
        return {"id": "echo", "row": row}

    row = {
        "_ng_rollout_id": "rE",
        "_ng_attempt_index": 3,
        "responses_create_params": {"input": [{"role": "user", "content": "héllo ✓"}]},
        "drop_reply": False,
        "weird key": [1, 2.5, None, True],
        "unicode": "\u2603",
    }
    with GymServerThread(agent=echo) as server:
        got = await wire_for(server).request("POST", "/run", body=row, token=None)
    assert got.status == 200
    assert seen == [row]
    assert got.json == {"id": "echo", "row": row}


async def test_receipt_matches_the_reply_the_caller_got(wire):
    got = await wire.run("rD", reward=0.5)
    receipt = (await wire.receipt("rD")).json["completion_receipt"]
    assert receipt == {
        "rollout_id": "rD",
        "attempt_index": 0,
        "execution_generation": 1,
        "result_identity": "r-rD",
        "result_digest": hashlib.sha256(canonical_json(got.json)).hexdigest(),
    }


async def test_result_identity_falls_back_to_the_digest(wire_for):
    async def anonymous(row):
        return {"text": "no id here", "n": 1}

    with GymServerThread(agent=anonymous) as server:
        w = wire_for(server)
        await w.run("rX")
        receipt = (await w.receipt("rX")).json["completion_receipt"]
    assert receipt["result_identity"] == receipt["result_digest"]
    assert (
        receipt["result_digest"]
        == hashlib.sha256(
            json.dumps({"n": 1, "text": "no id here"}, separators=(",", ":")).encode()
        ).hexdigest()
    )


async def test_the_run_answer_carries_its_receipt_in_a_header(wire):
    from rl_gym_actors.protocol import RECEIPT_HEADER, CompletionReceipt, result_digest

    fresh = await wire.run("rH", reward=0.25)
    receipt = json.loads(fresh.headers[RECEIPT_HEADER])
    assert receipt == (await wire.receipt("rH")).json["completion_receipt"]
    assert CompletionReceipt.model_validate(receipt).result_digest == result_digest(fresh.json)
    replay = await wire.run("rH", reward=0.25)
    assert replay.replayed and replay.headers[RECEIPT_HEADER] == fresh.headers[RECEIPT_HEADER]
    assert "receipt-header" in (await wire.capabilities()).json["features"]
