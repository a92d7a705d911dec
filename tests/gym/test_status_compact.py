"""Big listings and batch ACKs against the real server on loopback: the (ext) compact listing
(``?listing=compact``: each active attempt once, as columns) names what the full status names;
the full status keeps its shape; the batch ACK's fast path (receipts exactly as issued) answers
what the checked path answers, and anything else still gets the checked path's named error; the
client reads listings either way (compact from ours, full from a real Gym) and ACKs wire-form
receipts, halving a batch the server finds too large."""

from __future__ import annotations

import asyncio
import json

import pytest

from rl_gym_actors.errors import AckRejected, ConfigError, ProtocolViolation
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.listing import (
    ACK_ENDS,
    COMPACT_FEATURE,
    TEXT_FEATURE,
    GymListing,
    receipt_key,
    receipt_wire,
)
from rl_gym_actors.protocol import CONTROL_PREFIX, StatusReport, canonical_json
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import soon
from rl_gym_actors.testing.real_gym import RealGymStandIn

STATUS = CONTROL_PREFIX + "/status"


async def _mixed(wire) -> tuple[list[dict], asyncio.Task]:
    """Three completed (one ACKed after), one running, one tombstoned."""
    receipts = [await wire.complete(f"rC{i}", reward=0.25) for i in range(3)]
    await wire.ack(receipts[2])
    slow = asyncio.create_task(wire.run("rRun", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="one run running")
    await wire.retire("rT")
    return receipts[:2], slow


async def test_compact_listing_names_what_the_full_status_names(wire):
    receipts, slow = await _mixed(wire)
    assert COMPACT_FEATURE in (await wire.capabilities()).json["features"]
    full = (await wire.status()).json
    compact = (
        await wire.request("GET", STATUS, params={"checkpoint_id": "c", "listing": "compact"})
    ).json

    # the full shape: every active attempt in blocking and executions, completed ones also in
    # the completed list, each with the fields NeMo RL's client reads
    keys = {(a["rollout_id"], a["attempt_index"]) for a in full["executions"]}
    assert keys == {("rC0", 0), ("rC1", 0), ("rRun", 0)}
    assert [a["rollout_id"] for a in full["blocking_attempts"]] == ["rC0", "rC1", "rRun"]
    assert [a["completion_receipt"] for a in full["completed_unacknowledged_attempts"]] == receipts
    for a in full["executions"]:
        assert a["parked_boundary_state"] is None and a["age_seconds"] >= 0
        assert a["generation"] == 1
    StatusReport.model_validate(full)

    # compact: the same counts, the lists empty, each attempt once as columns
    assert {k: v for k, v in compact.items() if k != "attempts"} == {
        **{k: v for k, v in full.items() if k not in ("checkpoint_id",)},
        "checkpoint_id": "c",
        "blocking_attempts": [],
        "completed_unacknowledged_attempts": [],
        "executions": [],
    }
    cols = compact["attempts"]
    assert cols["rollout_id"] == ["rC0", "rC1", "rRun"]
    assert cols["attempt_index"] == [0, 0, 0]
    assert cols["state"] == ["completed", "completed", "running"]
    assert cols["completion_receipt"] == [*receipts, None]

    def plain(listing: GymListing) -> dict:
        return {
            k: (v.state, v.completion_receipt and dict(receipt_wire(v.completion_receipt)))
            for k, v in listing.attempts.items()
        }

    assert plain(GymListing.from_compact(compact)) == plain(
        GymListing.of(StatusReport.model_validate(full))
    )
    got = await wire.request("GET", STATUS, params={"checkpoint_id": "c", "listing": "all"})
    assert (got.status, got.code) == (422, "invalid_request")
    await wire.retire("rRun")
    await slow


async def test_the_text_listing_gives_each_receipt_as_issued_and_an_ack_sends_it_back(wire):
    receipts, slow = await _mixed(wire)
    assert TEXT_FEATURE in (await wire.capabilities()).json["features"]
    params = {"checkpoint_id": "c"}
    compact = (await wire.request("GET", STATUS, params={**params, "listing": "compact"})).json
    text = (await wire.request("GET", STATUS, params={**params, "listing": "text"})).json
    assert {k: v for k, v in text.items() if k != "attempts"} == {
        k: v for k, v in compact.items() if k != "attempts"
    }
    cols = text["attempts"]
    assert "completion_receipt" not in cols
    assert cols["completion_receipt_text"] == [
        *(canonical_json(r).decode() for r in receipts),
        None,
    ]
    listing = GymListing.from_compact(text, text=True)
    assert {k: (v.state, v.completion_receipt) for k, v in listing.attempts.items()} == {
        ("rC0", 0): ("completed", cols["completion_receipt_text"][0]),
        ("rC1", 0): ("completed", cols["completion_receipt_text"][1]),
        ("rRun", 0): ("running", None),
    }
    path = CONTROL_PREFIX + "/acknowledge-completed"
    # one receipt canonically the same but not byte for byte (the receipt-by-receipt path),
    # one whose digest differs: nothing is ACKed, the error is named
    spaced = cols["completion_receipt_text"][0].replace(",", ", ")
    other = canonical_json({**receipts[1], "result_digest": "0" * 64}).decode()
    for first in (spaced, cols["completion_receipt_text"][0]):
        bad = await wire.request("POST", path, data=",".join((first, other)).join(ACK_ENDS))
        assert (bad.status, bad.code) == (409, "completed_execution_acknowledgement_error")
    assert (await wire.status()).json["completed_unacknowledged"] == 2
    spliced = ",".join(cols["completion_receipt_text"][:2]).join(ACK_ENDS)
    got = await wire.request("POST", path, data=spliced, params={"count": "1"})
    assert (got.status, got.json) == (200, {"acknowledged_count": 2})
    again = await wire.request("POST", path, data=",".join((spaced,)).join(ACK_ENDS))
    assert again.status == 200 and again.json == {"acknowledged": [receipts[0]]}  # idempotent
    st = (await wire.status()).json
    assert (st["completed_unacknowledged"], st["acknowledged_completed"]) == (0, 3)
    await wire.retire("rRun")
    await slow


async def test_a_prepare_refused_lists_what_is_left_in_either_shape(wire):
    receipts, slow = await _mixed(wire)
    await wire.retire("rRun", checkpoint_id="rl-retire")  # nothing running: prepare answers
    await slow
    path = CONTROL_PREFIX + "/prepare"
    body = {"checkpoint_id": "p1", "deadline_ts": soon(5)}
    full = await wire.request("POST", path, body=body)
    compact = await wire.request("POST", path, body=body, params={"listing": "compact"})
    assert (full.status, full.code, compact.status, compact.code) == (
        409,
        "agent_prepare_incomplete",
        409,
        "agent_prepare_incomplete",
    )
    report = full.json["report"]
    assert [
        a["completion_receipt"] for a in report["completed_unacknowledged_attempts"]
    ] == receipts
    assert report["completed_unacknowledged"] == 2 and report["ready_to_commit"] is False
    assert compact.json["report"]["attempts"]["completion_receipt"] == receipts
    keys = await wire.request("POST", path, body=body, params={"listing": "keys"})
    assert keys.json["report"]["attempts"]["rollout_id"] == ["rC0", "rC1"]
    assert keys.json["report"]["attempts"]["completion_receipt"] == [None, None]
    await wire.resume("p1")


async def test_the_fast_ack_answers_as_the_checked_one_and_errors_stay_named(wire):
    receipts = [await wire.complete(f"rA{i}") for i in range(4)]
    got = await wire.ack_batch(receipts[:2])  # exactly as issued: the fast path
    assert got.status == 200 and got.json == {"acknowledged": receipts[:2]}
    # key order inside a receipt does not matter (canonically the same)
    reordered = dict(reversed(list(receipts[2].items())))
    assert (await wire.ack_batch([reordered])).json == {"acknowledged": [receipts[2]]}
    # a receipt that differs, one ACKed already, an unknown key: the checked path's answers
    changed = {**receipts[3], "result_identity": "other"}
    bad = await wire.ack_batch([receipts[3], changed])
    assert (bad.status, bad.code) == (422, "invalid_request")  # a key twice
    bad = await wire.ack_batch([changed])
    assert (bad.status, bad.code) == (409, "completed_execution_acknowledgement_error")
    again = await wire.ack_batch([receipts[0], receipts[3]])  # one ACKed: idempotent there
    assert again.status == 200 and [r["rollout_id"] for r in again.json["acknowledged"]] == [
        "rA0",
        "rA3",
    ]
    unknown = await wire.ack_batch([{**receipts[3], "rollout_id": "nobody"}])
    assert (unknown.status, unknown.code) == (409, "completed_execution_acknowledgement_error")
    path = CONTROL_PREFIX + "/acknowledge-completed"
    fresh = await wire.complete("rA4")
    counted = await wire.request("POST", path, params={"count": "1"}, body={"executions": [fresh]})
    assert counted.json == {"acknowledged_count": 1}  # (ext) the count, not the echo
    bad = await wire.request("POST", path, params={"count": "2"}, body={"executions": [fresh]})
    assert (bad.status, bad.code) == (422, "invalid_request")
    junk = await wire.request("POST", path, data=b"[1]")
    assert (junk.status, junk.code) == (422, "invalid_request")
    st = (await wire.status()).json
    assert (st["completed_unacknowledged"], st["acknowledged_completed"]) == (0, 5)


async def test_the_client_reads_listings_from_ours_and_from_a_real_gym_alike():
    with GymServerThread(token="test-token") as server, RealGymStandIn(server.endpoint) as real:
        async with GymClient(server.endpoint) as ours, GymClient(real.endpoint) as theirs:
            for i in range(3):
                await ours.run({}, rollout_id=f"rL{i}", attempt_index=0, deadline_ts=soon())
            assert not await theirs.offers(COMPACT_FEATURE, deadline_ts=soon())
            a = await ours.listing("c1", deadline_ts=soon())
            b = await theirs.listing("c1", deadline_ts=soon())
            assert set(a.attempts) == set(b.attempts) == {(f"rL{i}", 0) for i in range(3)}
            assert {k: v.state for k, v in a.attempts.items()} == {
                k: v.state for k, v in b.attempts.items()
            }
            assert a.completed_unacknowledged == b.completed_unacknowledged == 3
            assert all(isinstance(v.completion_receipt, str) for v in a.attempts.values())
            assert {k: receipt_wire(v.completion_receipt) for k, v in a.attempts.items()} == {
                k: receipt_wire(v.completion_receipt) for k, v in b.attempts.items()
            }
            first = b.attempts[("rL0", 0)].completion_receipt
            assert await theirs.acknowledge_wire(  # the echo read where no count is offered
                [receipt_wire(first)], deadline_ts=soon()
            ) == [("rL0", 0)]
            bare = await ours.prepare_listing("c1", deadline_ts=soon(2), keys_only=True)
            assert bare.keys_only and set(bare.attempts) == {("rL1", 0), ("rL2", 0)}
            assert all(v.completion_receipt is None for v in bare.attempts.values())
            p = await ours.prepare_listing("c1", deadline_ts=soon(2))
            assert not p.ready_to_commit and set(p.attempts) == {("rL1", 0), ("rL2", 0)}
            assert not p.keys_only
            receipts = [v.completion_receipt for v in p.attempts.values()]
            acked = await ours.acknowledge_wire(receipts, deadline_ts=soon())
            assert sorted(acked) == sorted(receipt_key(r) for r in receipts)
            with pytest.raises(AckRejected):  # all or nothing, typed
                await ours.acknowledge_wire(
                    [{**receipts[0], "result_digest": "0" * 64}], deadline_ts=soon()
                )
            ready = await ours.prepare_listing("c1", deadline_ts=soon(2))
            assert ready.ready_to_commit and ready.attempts == {}
            with pytest.raises(ConfigError):  # a key per receipt, each once
                await ours.acknowledge_wire(receipts, keys=[("rL1", 0)], deadline_ts=soon())
            await ours.resume("c1", deadline_ts=soon())


@pytest.mark.parametrize(
    "columns",
    [
        pytest.param({"rollout_id": ["a"], "attempt_index": [0], "state": []}, id="short"),
        pytest.param(
            {
                "rollout_id": [1],
                "attempt_index": [0],
                "state": ["running"],
                "completion_receipt": [None],
            },
            id="not-a-string",
        ),
        pytest.param(
            {
                "rollout_id": ["a"],
                "attempt_index": [0],
                "state": ["completed"],
                "completion_receipt": [
                    {"rollout_id": "b", "attempt_index": 0, "result_digest": "x"}
                ],
            },
            id="another's-receipt",
        ),
    ],
)
def test_a_malformed_compact_listing_is_refused(columns):
    if "completion_receipt" in columns:  # the same as JSON text
        receipts = columns["completion_receipt"]
        texts = {**columns, "completion_receipt_text": [r and json.dumps(r) for r in receipts]}
        with pytest.raises(ValueError):
            GymListing.from_compact({"attempts": texts}, text=True)
    with pytest.raises(ValueError):
        GymListing.from_compact({"attempts": columns})
    from rl_gym_actors.gym.agent_checkpoint.client_bulk import BulkCalls

    with pytest.raises(ProtocolViolation):
        BulkCalls._compact({"attempts": columns}, "http://x")


def test_a_text_listing_reads_receipts_with_lineage_and_refuses_another_s():
    from rl_gym_actors.protocol import CompletionReceipt

    fields = dict(execution_generation=1, result_identity="i", result_digest="d" * 64)
    plain = CompletionReceipt(rollout_id="a", attempt_index=2, **fields)
    lineage = CompletionReceipt(
        rollout_id="b",
        attempt_index=0,
        manifest_capture_key="b",
        terminal_model_call_id="call-1",
        **fields,
    )
    texts = [plain.canonical().decode(), lineage.canonical().decode(), None]
    columns = {
        "rollout_id": ["a", "b", "c"],
        "attempt_index": [2, 0, 0],
        "state": ["completed", "completed", "running"],
        "completion_receipt_text": texts,
    }
    listing = GymListing.from_compact({"attempts": columns}, text=True)
    assert [v.completion_receipt for v in listing.attempts.values()] == texts
    assert receipt_key(texts[1]) == ("b", 0)
    for bad in ({"attempt_index": [3, 0, 0]}, {"rollout_id": ["a", "bb", "c"]}):
        with pytest.raises(ValueError, match="another's"):
            GymListing.from_compact({"attempts": {**columns, **bad}}, text=True)
    with pytest.raises(ValueError, match="wrong type"):  # an object where text belongs
        GymListing.from_compact(
            {"attempts": {**columns, "completion_receipt_text": [plain.wire(), None, None]}},
            text=True,
        )


def test_a_listing_json_round_trips_through_one_loads():
    body = json.dumps(
        {
            "running": 0,
            "attempts": {
                "rollout_id": [],
                "attempt_index": [],
                "state": [],
                "completion_receipt": [],
            },
        }
    )
    assert GymListing.from_compact(json.loads(body)).attempts == {}


def test_a_records_line_is_the_canonical_json_of_its_fields():
    from rl_gym_actors.gym.agent_checkpoint.core import encode_reply
    from rl_gym_actors.gym.checkpoint_files import _checkpoint_line
    from rl_gym_actors.gym.store import Execution
    from rl_gym_actors.protocol import ExecutionState, canonical_json

    _, receipt = encode_reply(("rX", 3), 1, {"id": "é", "reward": 0.5})
    for e in (
        Execution("rX", 3, ExecutionState.ACKNOWLEDGED, 1, None, receipt),
        Execution("rY", 0, ExecutionState.TOMBSTONED, 0),
    ):
        fields = {
            "rollout_id": e.rollout_id,
            "attempt_index": e.attempt_index,
            "state": e.state.value,
            "execution_generation": e.generation,
            "completion_receipt": json.loads(e.receipt) if e.receipt else None,
        }
        assert _checkpoint_line(e) == canonical_json(fields)
