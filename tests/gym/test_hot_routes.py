"""The hot routes (/run, receipt, completion-receipt, ACK) are plain ASGI in front of FastAPI
(rl_gym_actors/gym/asgi.py): bad input there is still a named 4xx, never a 500; their answers
carry the headers every answer of ours carries; the metrics label them by route."""

from __future__ import annotations

import json

import aiohttp
import pytest

from rl_gym_actors.protocol import CONTROL_PREFIX, RECEIPT_HEADER
from rl_gym_actors.testing.gym_process import GymServerThread

P = CONTROL_PREFIX
LIMIT = 4096


@pytest.fixture
def gym(agent):
    with GymServerThread(agent=agent, max_body_bytes=LIMIT) as server:
        yield server


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/run", b'\xff\xfe{"_ng_rollout_id": "rX"}'),  # not UTF-8
        ("/run", b'{"_ng_rollout_id": "rX", "x": ' + b"[" * 200 + b"]" * 200 + b"}"),  # deep
        ("/run", b'{"_ng_rollout_id": "rX", "_ng_attempt_index": 1e400}'),  # inf
        ("/run", b"null"),
        ("/run", b""),
        (P + "/acknowledge", b"null"),
        (P + "/acknowledge", b"[]"),
        (P + "/acknowledge", b"\xff"),
        (P + "/acknowledge", b"[" * 200 + b"]" * 200),
    ],
)
async def test_a_bad_body_on_a_hot_route_is_a_422_never_a_500(wire, agent, path, raw):
    got = await wire.request("POST", path, data=raw, headers={"Content-Type": "application/json"})
    assert (got.status, got.code) == (422, "invalid_request"), got.raw
    assert got.json["error"]["detail"]
    assert agent.starts[("rX", 0)] == 0


async def test_an_oversized_chunked_ack_is_a_413(wire):
    async def chunks():
        yield b'{"pad": "'
        for _ in range(8):
            yield b"x" * 1024
        yield b'"}'

    got = await wire.request("POST", P + "/acknowledge", data=chunks())
    assert (got.status, got.code) == (413, "payload_too_large")


@pytest.mark.parametrize("path", [P + "/receipt", P + "/completion-receipt", P + "/acknowledge"])
async def test_a_hot_control_route_without_the_token_is_a_401_with_its_challenge(wire, path):
    method = "POST" if path.endswith("acknowledge") else "GET"
    got = await wire.request(method, path, data=b"{}", token=None)
    assert (got.status, got.code) == (401, "unauthorized")
    assert got.headers["www-authenticate"] == "Bearer"


async def test_receipt_queries_read_as_the_framework_reads_them(wire):
    await wire.complete("rQ")
    got = await wire.request(  # a repeated name: the last value wins
        "GET", P + "/receipt", params=None, data=None, headers=None, token=wire.token
    )
    assert (got.status, got.code) == (422, "invalid_request")  # no key at all
    url = P + "/receipt?rollout_id=nope&rollout_id=rQ&attempt_index=0"
    got = await wire.request("GET", url)
    assert got.status == 200 and got.json["completion_receipt"]["rollout_id"] == "rQ"
    got = await wire.request("GET", P + "/receipt?rollout_id=rQ&attempt_index=%D9%A3")
    assert (got.status, got.code) == (422, "invalid_request")  # a non-ASCII digit


async def test_completion_receipt_of_an_unknown_key_is_the_real_participants_409(wire):
    got = await wire.request(
        "GET", P + "/completion-receipt", params={"rollout_id": "rNo", "attempt_index": "0"}
    )
    assert (got.status, got.code) == (409, "completed_execution_acknowledgement_error")


async def test_hot_routes_refuse_other_methods_as_framework_routes_do(wire):
    for method in ("HEAD", "PUT"):
        hot = await wire.request(method, P + "/receipt")
        framework = await wire.request(method, P + "/lease")
        assert hot.status == framework.status == 405
    got = await wire.request("GET", "/run")
    assert (got.status, got.code) == (405, "method_not_allowed")


async def test_hot_answers_carry_every_header_of_ours(wire):
    ran = await wire.run("rH")
    receipt = await wire.receipt("rH")
    acked = await wire.ack(receipt.json["completion_receipt"])
    ready = await wire.request("GET", "/ready")  # a framework route, for comparison
    for got in (ran, receipt, acked, ready):
        assert got.status == 200, got.raw
        assert got.headers["content-type"] == "application/json"
        assert int(got.headers["content-length"]) == len(got.raw)
        assert float(got.headers["x-gym-time"]) > 1e9 and got.headers["date"]
    assert json.loads(ran.headers[RECEIPT_HEADER.lower()]) == receipt.json["completion_receipt"]
    assert acked.json == {"acknowledged": True, "idempotent": False}


async def test_the_metrics_label_hot_routes_by_their_route(gym, wire):
    await wire.run("rM")
    await wire.receipt("rM")
    await wire.receipt("rNever")  # a 404: never seen
    async with aiohttp.ClientSession() as s, s.get(gym.url + "/metrics") as answer:
        text = await answer.text()
    lines = [
        line for line in text.splitlines() if line.startswith("gym_request_duration_seconds_count")
    ]
    assert any('route="/run"' in line and 'status="200"' in line for line in lines), lines
    receipt = f'route="{P}/receipt"'
    assert any(receipt in line and 'status="200"' in line for line in lines), lines
    assert any(receipt in line and 'status="404"' in line for line in lines), lines
