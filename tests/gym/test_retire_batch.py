"""The (ext) ``retire-batch`` against the real server on loopback: one call answers every key as
``retire`` would, in the order sent; bad bodies get a named 422; the client uses it only where
the server offers it (a real Gym does not)."""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors.errors import ConfigError, StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.protocol import CONTROL_PREFIX, MAX_RETIRE_BATCH
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import scaled, soon, until
from rl_gym_actors.testing.real_gym import RealGymStandIn

PATH = CONTROL_PREFIX + "/retire-batch"


def batch(*keys: str | tuple[str, int], checkpoint_id: str = "rl-retire") -> dict:
    pairs = [(k, 0) if isinstance(k, str) else k for k in keys]
    return {
        "checkpoint_id": checkpoint_id,
        "deadline_ts": soon(10),
        "executions": [{"rollout_id": r, "attempt_index": a} for r, a in pairs],
    }


async def test_one_call_answers_every_key_as_retire_would_in_order(wire):
    runs = [asyncio.create_task(wire.run(f"rRun{i}", sleep_s=30)) for i in range(3)]
    await wire.until(lambda st: st["running"] == 3, what="three runs running")
    receipt_c = await wire.complete("rC")
    await wire.ack(await wire.complete("rA"))
    assert "retire-batch" in (await wire.capabilities()).json["features"]

    got = await wire.request(
        "POST", PATH, body=batch("rC", "rRun0", "rUnknown", "rRun1", "rA", "rRun2")
    )

    assert got.status == 200, got.raw
    answers = got.json["retired"]
    assert [(a["rollout_id"], a["attempt_index"]) for a in answers] == [
        ("rC", 0),
        ("rRun0", 0),
        ("rUnknown", 0),
        ("rRun1", 0),
        ("rA", 0),
        ("rRun2", 0),
    ]
    flags = [(a["retired"], a["tombstoned"], a["completed_unacknowledged"]) for a in answers]
    assert flags == [
        (False, False, True),  # completed, un-ACKed: refused, only an ACK releases it
        (True, True, False),
        (False, True, False),  # unknown: tombstoned anyway
        (True, True, False),
        (False, False, False),  # ACKed
        (True, True, False),
    ]
    assert answers[4]["acknowledged"] is True
    # every run's caller learns it was retired; the completed reply survives
    assert [(await r).code for r in runs] == ["stale_attempt"] * 3
    assert (await wire.run("rUnknown")).code == "stale_attempt"
    assert (await wire.run("rC")).replayed
    assert (await wire.ack(receipt_c)).json["acknowledged"] is True
    st = (await wire.status()).json
    assert (st["running"], st["completed_unacknowledged"]) == (0, 0)
    # the same batch again: each key answers as it stands now
    again = (await wire.request("POST", PATH, body=batch("rRun0", "rC"))).json["retired"]
    assert [(a["retired"], a["tombstoned"]) for a in again] == [(False, True), (False, False)]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(batch(), id="empty"),
        pytest.param(batch("r1", "r1"), id="duplicate-key"),
        pytest.param(batch(*(f"r{i}" for i in range(MAX_RETIRE_BATCH + 1))), id="too-many"),
        pytest.param({**batch("r1"), "checkpoint_id": "bad id"}, id="bad-checkpoint-id"),
        pytest.param({"executions": [{"rollout_id": "r1", "attempt_index": 0}]}, id="no-ids"),
        pytest.param(batch(("r1", -1)), id="negative-attempt"),
        pytest.param(batch(("r1", True)), id="bool-attempt"),
        pytest.param(batch(("r1", 2**63)), id="attempt-past-64-bits"),
        pytest.param(batch("r1\n"), id="id-with-a-newline"),
        pytest.param(batch("r" * 257), id="id-too-long"),
        pytest.param(
            {**batch(), "executions": [{"rollout_id": "r1", "attempt_index": 0, "x": 1}]},
            id="key-with-another-field",
        ),
        pytest.param({**batch("r1"), "deadline_ts": "soon"}, id="deadline-not-a-number"),
    ],
)
async def test_bad_bodies_are_a_named_422_and_change_nothing(wire, body):
    got = await wire.request("POST", PATH, body=body)
    assert (got.status, got.code) == (422, "invalid_request"), got.raw
    assert (await wire.run("r1")).status == 200  # r1 was not tombstoned


async def test_a_body_the_hand_checks_leave_to_the_model_is_answered_alike(wire):
    """An integer deadline is not what the checks by the thousand take (a float), so the
    model reads that body: the answer is the same, byte for byte."""
    body = {**batch("rX", ("rY", 2)), "deadline_ts": int(soon(10))}
    by_model = await wire.request("POST", PATH, body=body)
    by_hand = await wire.request("POST", PATH, body={**body, "deadline_ts": float(soon(10))})
    assert by_model.status == by_hand.status == 200, by_model.raw
    assert by_model.raw == by_hand.raw
    assert by_hand.json["retired"][1] == {
        "retired": False,
        "tombstoned": True,
        "completed_unacknowledged": False,
        "rollout_id": "rY",
        "attempt_index": 2,
    }


async def test_the_token_guards_it(wire):
    got = await wire.request("POST", PATH, body=batch("r1"), token="wrong")
    assert got.status == 401
    assert (await wire.run("r1")).status == 200


async def test_the_client_batches_only_where_the_server_offers_it():
    with GymServerThread(token="test-token") as server, RealGymStandIn(server.endpoint) as real:
        async with GymClient(server.endpoint) as ours, GymClient(real.endpoint) as theirs:
            assert await ours.offers("retire-batch", deadline_ts=soon())
            assert not await theirs.offers("retire-batch", deadline_ts=soon())
            run = asyncio.ensure_future(
                ours.run({"sleep_s": 30}, rollout_id="slow", attempt_index=0, deadline_ts=soon(60))
            )

            async def running() -> bool:
                return (await ours.status("probe", deadline_ts=soon())).running == 1

            await until(running, what="the run to start")
            answers = await ours.retire_batch(
                [("slow", 0), ("never", 3)], checkpoint_id="cid-1", deadline_ts=soon()
            )
            assert [(a.key, a.retired, a.tombstoned) for a in answers] == [
                (("slow", 0), True, True),
                (("never", 3), False, True),
            ]
            with pytest.raises(StaleAttempt):
                await asyncio.wait_for(run, scaled(5))
            with pytest.raises(ConfigError):  # refused before it is sent
                await ours.retire_batch(
                    [("a", 0), ("a", 0)], checkpoint_id="cid-1", deadline_ts=soon()
                )


async def test_the_retired_metric_counts_each_tombstone_of_a_batch(wire):
    await wire.complete("rC")
    got = await wire.request("POST", PATH, body=batch("rT1", "rC", "rT2"))
    assert [a["tombstoned"] for a in got.json["retired"]] == [True, False, True]
    text = (await wire.request("GET", "/metrics", token=None)).raw.decode()
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples["gym_attempts_retired_total"] == 2
