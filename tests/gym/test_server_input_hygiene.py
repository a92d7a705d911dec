"""Input the server refuses before anything runs (issue 16): an id with a trailing newline (Python's
``$`` matched before it, so the agent ran and the answer was a 500), and bodies nested deeper than
MAX_JSON_DEPTH (a 980-deep row was a RecursionError 500). Each: 422 ``invalid_request``, 0 agent
runs, nothing stored."""

from __future__ import annotations

import json

import pytest

from rl_gym_actors.protocol import (
    CONTROL_PREFIX,
    MAX_JSON_DEPTH,
    is_valid_checkpoint_id,
    is_valid_rollout_id,
    json_depth,
    too_deep,
)


def _nested(depth: int) -> str:
    """A JSON value ``depth`` levels deep (arrays, an object in the middle)."""
    half = depth // 2
    return (
        "[" * half
        + '{"k":'
        + "[" * (depth - half - 1)
        + "1"
        + "]" * (depth - half - 1)
        + "}"
        + "]" * half
    )


def test_ids_must_match_whole_without_a_trailing_newline():
    for bad in ("x\n", "x\n\n", "x\r\n", "\nx", "c\n"):
        assert not is_valid_rollout_id(bad) and not is_valid_checkpoint_id(bad)
    assert is_valid_rollout_id("x") and is_valid_checkpoint_id("c-1.a_b")


def test_json_depth_counts_brackets_outside_strings():
    assert json_depth("1") == 0 and json_depth("{}") == 1 and json_depth("[[1],[2]]") == 2
    assert json_depth(json.dumps({"a": "[[[[{{{" + '\\"[[' * 50})) == 1
    assert json_depth(_nested(980)) == 980 and json_depth(_nested(980).encode()) == 980
    assert too_deep(_nested(MAX_JSON_DEPTH + 1)) and not too_deep(_nested(MAX_JSON_DEPTH))
    assert not too_deep(json.dumps({"tokens": list(range(5000))}))


@pytest.mark.parametrize("rollout_id", ["x\n", "x\r\n", "x\n\n"])
async def test_a_rollout_id_with_a_trailing_newline_is_refused_before_the_agent(
    wire, agent, rollout_id
):
    answer = await wire.request("POST", "/run", body={"_ng_rollout_id": rollout_id}, token=None)
    assert (answer.status, answer.code) == (422, "invalid_request")
    assert sum(agent.starts.values()) == 0
    receipt = await wire.request(
        "GET",
        CONTROL_PREFIX + "/receipt",
        params={"rollout_id": rollout_id, "attempt_index": "0"},
    )
    assert (receipt.status, receipt.code) == (422, "invalid_request")


async def test_a_checkpoint_id_with_a_trailing_newline_is_refused(wire):
    answer = await wire.prepare("c\n")
    assert (answer.status, answer.code) == (422, "invalid_request")
    status = await wire.request("GET", CONTROL_PREFIX + "/status", params={"checkpoint_id": "c\n"})
    assert (status.status, status.code) == (422, "invalid_request")
    assert (await wire.status()).json["state"] == "accepting"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 980, 995, 5000])
async def test_a_row_nested_too_deep_is_refused_up_front(wire, agent, depth):
    raw = ('{"_ng_rollout_id": "deep", "x": ' + _nested(depth - 1) + "}").encode()
    answer = await wire.request("POST", "/run", data=raw, token=None)
    assert (answer.status, answer.code) == (422, "invalid_request"), answer.raw
    assert sum(agent.starts.values()) == 0
    assert (await wire.receipt("deep")).status == 404  # nothing stored under the key


async def test_a_row_at_the_limit_runs(wire, agent):
    raw = ('{"_ng_rollout_id": "ok", "x": ' + _nested(MAX_JSON_DEPTH - 1) + "}").encode()
    answer = await wire.request("POST", "/run", data=raw, token=None)
    assert answer.status == 200, answer.raw
    assert sum(agent.starts.values()) == 1


async def test_a_control_body_nested_too_deep_is_refused(wire):
    raw = ('{"checkpoint_id": "c1", "deadline_ts": 1e12, "x": ' + _nested(980) + "}").encode()
    paths = ("/prepare", "/resume", "/acknowledge", "/retire", "/acknowledge-completed")
    for path in (*paths, "/retire-batch"):
        answer = await wire.request("POST", CONTROL_PREFIX + path, data=raw)
        assert (answer.status, answer.code) == (422, "invalid_request"), (path, answer.raw)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 980, 200_000])
async def test_a_batch_ack_nested_too_deep_is_refused_by_name(wire, depth):
    """The batch ACK (and retire-batch) parse before their depth check (receipts as issued need
    none): a body too deep is still a 422 by name, even past Python's own recursion limit."""
    receipt = await wire.complete("rDeep")
    raw = ('{"executions": [' + json.dumps(receipt) + ", " + _nested(depth) + "]}").encode()
    answer = await wire.request("POST", CONTROL_PREFIX + "/acknowledge-completed", data=raw)
    assert (answer.status, answer.code) == (422, "invalid_request"), answer.raw[:200]
    assert (await wire.status()).json["completed_unacknowledged"] == 1
    raw = '{"checkpoint_id": "c1", "deadline_ts": 1e12, "executions": ' + _nested(depth) + "}"
    answer = await wire.request("POST", CONTROL_PREFIX + "/retire-batch", data=raw.encode())
    assert (answer.status, answer.code) == (422, "invalid_request"), answer.raw[:200]
