"""Bad input, each its own test: a 4xx with a named code, never a 500, and nothing stored lost or
changed (a fingerprint of every stored reply, receipt and count is the same before and after)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rl_gym_actors.protocol import CONTROL_PREFIX
from rl_gym_actors.testing.gym_process import GymServerThread

LIMIT = 4096  # the body limit of the server under test, to keep oversized bodies small
P = CONTROL_PREFIX
NOW = time.time()
RECEIPT = {
    "rollout_id": "rC",
    "attempt_index": 0,
    "execution_generation": 1,
    "result_identity": "r-rC",
    "result_digest": "0" * 64,
}


@pytest.fixture
def gym(agent):
    with GymServerThread(agent=agent, max_body_bytes=LIMIT) as server:
        yield server


async def _seed(wire) -> None:
    """A completed key rC, an ACKed key rA and a tombstoned key rT."""
    await wire.complete("rC", reward=0.5)
    await wire.ack(await wire.complete("rA"))
    await wire.retire("rT")


async def _fingerprint(wire) -> dict[str, Any]:
    status = (await wire.status()).json
    for name in ("blocking_attempts", "completed_unacknowledged_attempts", "executions"):
        for attempt in status[name]:
            attempt.pop("age_seconds")  # a clock, not state
    return {
        "status": status,
        "receipts": [(await wire.receipt(r)).raw for r in ("rC", "rA", "rT")],
        "replay": (await wire.run("rC")).raw,
    }


def _phase(checkpoint_id: Any = "c1", **extra: Any) -> dict[str, Any]:
    return {"checkpoint_id": checkpoint_id, "deadline_ts": NOW + 60, **extra}


def _retire(**over: Any) -> dict[str, Any]:
    return {**_phase("c-retire"), "rollout_id": "rC", "attempt_index": 0, **over}


# (method, path, raw body or JSON-able body, expected status, expected code, extra request args)
CASES: dict[str, tuple] = {
    # malformed JSON
    "run-malformed-json": ("POST", "/run", b'{"_ng_rollout_id": "rX",', 422, "invalid_request"),
    "run-nan": ("POST", "/run", b'{"_ng_rollout_id": "rX", "x": NaN}', 422, "invalid_request"),
    "ack-malformed-json": ("POST", P + "/acknowledge", b"{not json", 422, "invalid_request"),
    "prepare-malformed-json": ("POST", P + "/prepare", b"", 422, "invalid_request"),
    "retire-malformed-json": ("POST", P + "/retire", b"[1, 2", 422, "invalid_request"),
    # wrong shape
    "run-array": ("POST", "/run", [{"_ng_rollout_id": "rX"}], 422, "invalid_request"),
    "run-string": ("POST", "/run", "rX", 422, "invalid_request"),
    "run-without-rollout-id": ("POST", "/run", {"prompt": "hi"}, 422, "invalid_request"),
    "ack-missing-field": (
        "POST",
        P + "/acknowledge",
        {k: v for k, v in RECEIPT.items() if k != "result_digest"},
        422,
        "invalid_request",
    ),
    "ack-unknown-field": (
        "POST",
        P + "/acknowledge",
        {**RECEIPT, "extra": 1},
        422,
        "invalid_request",
    ),
    "ack-bad-digest": (
        "POST",
        P + "/acknowledge",
        {**RECEIPT, "result_digest": "XYZ"},
        422,
        "invalid_request",
    ),
    "ack-batch-empty": (
        "POST",
        P + "/acknowledge-completed",
        {"schema_version": 1, "executions": []},
        422,
        "invalid_request",
    ),
    "ack-batch-duplicate-keys": (
        "POST",
        P + "/acknowledge-completed",
        {"schema_version": 1, "executions": [RECEIPT, RECEIPT]},
        422,
        "invalid_request",
    ),
    "ack-batch-schema-version": (
        "POST",
        P + "/acknowledge-completed",
        {"schema_version": 2, "executions": [RECEIPT]},
        422,
        "invalid_request",
    ),
    "retire-unknown-field": ("POST", P + "/retire", _retire(force=True), 422, "invalid_request"),
    "retire-missing-deadline": (
        "POST",
        P + "/retire",
        {k: v for k, v in _retire().items() if k != "deadline_ts"},
        422,
        "invalid_request",
    ),
    "prepare-deadline-string": (
        "POST",
        P + "/prepare",
        _phase(deadline_ts="soon"),
        422,
        "invalid_request",
    ),
    "prepare-deadline-infinite": (
        "POST",
        P + "/prepare",
        b'{"checkpoint_id": "c1", "deadline_ts": 1e999}',
        422,
        "invalid_request",
    ),
    "commit-without-dir": ("POST", P + "/commit", _phase(), 422, "invalid_request"),
    # invalid rollout ids
    "run-rollout-id-leading-dash": (
        "POST",
        "/run",
        {"_ng_rollout_id": "-rX"},
        422,
        "invalid_request",
    ),
    "run-rollout-id-space": ("POST", "/run", {"_ng_rollout_id": "r X"}, 422, "invalid_request"),
    "run-rollout-id-too-long": (
        "POST",
        "/run",
        {"_ng_rollout_id": "r" * 257},
        422,
        "invalid_request",
    ),
    "run-rollout-id-number": ("POST", "/run", {"_ng_rollout_id": 7}, 422, "invalid_request"),
    "retire-rollout-id-slash": (
        "POST",
        P + "/retire",
        _retire(rollout_id="a/b"),
        422,
        "invalid_request",
    ),
    "receipt-rollout-id-empty": (
        "GET",
        P + "/receipt",
        None,
        422,
        "invalid_request",
        {"params": {"rollout_id": "", "attempt_index": "0"}},
    ),
    # invalid checkpoint ids
    "prepare-checkpoint-id-space": ("POST", P + "/prepare", _phase("c 1"), 422, "invalid_request"),
    "prepare-checkpoint-id-too-long": (
        "POST",
        P + "/prepare",
        _phase("c" * 129),
        422,
        "invalid_request",
    ),
    "resume-checkpoint-id-empty": ("POST", P + "/resume", _phase(""), 422, "invalid_request"),
    "status-checkpoint-id-dots-first": (
        "GET",
        P + "/status",
        None,
        422,
        "invalid_request",
        {"params": {"checkpoint_id": ".c1"}},
    ),
    # negative (or non-integer) attempts
    "run-negative-attempt": (
        "POST",
        "/run",
        {"_ng_rollout_id": "rX", "_ng_attempt_index": -1},
        422,
        "invalid_request",
    ),
    "run-attempt-string": (
        "POST",
        "/run",
        {"_ng_rollout_id": "rX", "_ng_attempt_index": "0"},
        422,
        "invalid_request",
    ),
    "run-attempt-bool": (
        "POST",
        "/run",
        {"_ng_rollout_id": "rX", "_ng_attempt_index": True},
        422,
        "invalid_request",
    ),
    "retire-negative-attempt": (
        "POST",
        P + "/retire",
        _retire(attempt_index=-1),
        422,
        "invalid_request",
    ),
    "ack-negative-attempt": (
        "POST",
        P + "/acknowledge",
        {**RECEIPT, "attempt_index": -1},
        422,
        "invalid_request",
    ),
    "receipt-negative-attempt": (
        "GET",
        P + "/receipt",
        None,
        422,
        "invalid_request",
        {"params": {"rollout_id": "rC", "attempt_index": "-1"}},
    ),
    # missing and wrong token
    "prepare-missing-token": (
        "POST",
        P + "/prepare",
        _phase(),
        401,
        "unauthorized",
        {"token": None},
    ),
    "retire-wrong-token": (
        "POST",
        P + "/retire",
        _retire(),
        401,
        "unauthorized",
        {"token": "not-the-token"},
    ),
    "ack-wrong-token": ("POST", P + "/acknowledge", RECEIPT, 401, "unauthorized", {"token": "x"}),
    # a receipt with one field changed, and an ACK of a key that never ran
    "ack-receipt-field-changed": (
        "POST",
        P + "/acknowledge",
        RECEIPT,
        409,
        "completed_execution_acknowledgement_error",
    ),
    "ack-never-ran": (
        "POST",
        P + "/acknowledge",
        {**RECEIPT, "rollout_id": "rNever"},
        409,
        "completed_execution_acknowledgement_error",
    ),
    "ack-batch-never-ran": (
        "POST",
        P + "/acknowledge-completed",
        {"schema_version": 1, "executions": [{**RECEIPT, "rollout_id": "rNever"}]},
        409,
        "completed_execution_acknowledgement_error",
    ),
    # oversized bodies
    "run-oversized": (
        "POST",
        "/run",
        {"_ng_rollout_id": "rBig", "blob": "x" * LIMIT},
        413,
        "payload_too_large",
    ),
    "ack-oversized": (
        "POST",
        P + "/acknowledge",
        {**RECEIPT, "pad": "x" * LIMIT},
        413,
        "payload_too_large",
    ),
    # unknown routes and methods
    "unknown-route": ("GET", "/nope", None, 404, "not_found"),
    "wrong-method": ("GET", "/run", None, 405, "method_not_allowed"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
async def test_bad_input_is_a_named_4xx_and_changes_nothing(wire, agent, case):
    method, path, body, status, code, *more = CASES[case]
    kwargs = dict(more[0]) if more else {}
    await _seed(wire)
    before = await _fingerprint(wire)
    if isinstance(body, bytes):
        kwargs["data"] = body
        kwargs.setdefault("headers", {"Content-Type": "application/json"})
    elif body is not None:
        kwargs["body"] = body
    got = await wire.request(method, path, **kwargs)
    assert (got.status, got.code) == (status, code), got.raw
    assert got.json["error"]["detail"]
    assert await _fingerprint(wire) == before
    assert agent.starts[("rX", 0)] == 0 and agent.starts[("rBig", 0)] == 0


async def test_an_oversized_chunked_body_is_refused_without_reading_it_all(wire, agent):
    await _seed(wire)
    before = await _fingerprint(wire)

    async def chunks():
        yield b'{"_ng_rollout_id": "rBig", "blob": "'
        for _ in range(64):
            yield b"x" * 1024
        yield b'"}'

    got = await wire.request(
        "POST", "/run", data=chunks(), token=None, headers={"Content-Type": "application/json"}
    )
    assert (got.status, got.code) == (413, "payload_too_large")
    assert await _fingerprint(wire) == before
    assert agent.starts[("rBig", 0)] == 0


async def test_the_server_keeps_serving_after_bad_input(wire):
    for case in ("run-malformed-json", "run-oversized", "prepare-missing-token"):
        method, path, body, status, *_ = CASES[case]
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        assert (await wire.request(method, path, data=data, token=None)).status == status
    assert (await wire.run("rOk")).status == 200


async def test_the_body_limit_comes_from_the_serve_arguments(wire_for):
    with GymServerThread(args=["--max-body-bytes", "64"]) as server:
        got = await wire_for(server).run("rB", blob="x" * 64)
    assert (got.status, got.code) == (413, "payload_too_large")
