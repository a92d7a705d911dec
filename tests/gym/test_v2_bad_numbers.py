"""v2's bad numbers on the wire, each a named 422 and never a 500 or a hang: attempts past 64
bits (the agent-checkpoint side's bounds, on a durable server too), query parameters, deadlines
that are no finite Unix time, and simulated rows past the agent's bounds (which, within them,
yields the loop to the control plane at every step, even at ``step_s`` 0). And a restore that
finds a manifest whose counts were edited refuses it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import Wire
from gym_test_helpers import rid

from rl_gym_actors.gym.agents import MAX_SIMULATED_STEPS
from rl_gym_actors.gym.v2.wire import ROUTE_PREFIX
from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD, WIRE_INT_MAX
from rl_gym_actors.testing.gym_process import GymServerProcess, GymServerThread
from rl_gym_actors.testing.polling import scaled, soon, until
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")
TOO_BIG = 2**63


def _refused(got, status: int = 422, code: str = "invalid_request") -> None:
    assert (got.status, got.code) == (status, code), (got.status, got.raw[:300])


async def _v2_integers(wire: Wire) -> None:
    for attempt in (TOO_BIG, -1, 10**40):
        _refused(await wire.run(rid(), attempt, timeout_s=scaled(5)))
    _refused(await wire.run(f"{rid()}-a{'9' * 30}", timeout_s=scaled(5)))  # a capture key's too
    _refused(await wire.run(f"{rid()}-a{'9' * 5000}", timeout_s=scaled(5)))  # past int()'s limit
    assert (await wire.run(rid(), WIRE_INT_MAX)).status == 200  # the largest that fits
    for episode in ({"rollout_id": rid(), "attempt": TOO_BIG}, {"rollout_id": "x" * 257}):
        got = await wire.request(
            "POST",
            ROUTE_PREFIX + "/retire",
            body={"checkpoint_id": "c1", "deadline_ts": soon(10), "episode_ids": [episode]},
        )
        _refused(got)
    got = await wire.request(
        "POST",
        ROUTE_PREFIX + "/restore",
        body={
            "checkpoint_id": "c2",
            "deadline_ts": soon(10),
            "checkpoint_dir": "/nonexistent",
            "episode_ids": [{"rollout_id": rid(), "attempt": WIRE_INT_MAX}],  # no next attempt
        },
    )
    _refused(got)
    assert (await wire.run(rid())).status == 200  # nothing was left broken


@aio
async def test_v2_attempts_past_64_bits_are_422_in_memory(v2_server):
    await _v2_integers(Wire.of(v2_server))


@aio
async def test_v2_attempts_past_64_bits_are_422_on_a_durable_server(tmp_path):
    with GymServerProcess(args=["--protocol", "v2"], state_dir=tmp_path, allow_faults=False) as srv:
        await _v2_integers(Wire.of(srv))


@aio
@pytest.mark.parametrize(
    "query",
    ["limit=" + "1" * 33, "limit=²", "limit=١٢", "limit=0", "limit=100001", "limit=-1", "limit="],
)
async def test_v2_kept_limit_outside_its_range_is_422(v2_server, query):
    wire = Wire.of(v2_server)
    _refused(await wire.request("GET", f"{ROUTE_PREFIX}/kept?{query}"))
    assert (await wire.request("GET", f"{ROUTE_PREFIX}/kept?limit=5")).status == 200


@aio
async def test_v2_replay_only_takes_0_or_1(v2_server):
    wire = Wire.of(v2_server)
    row = {ROLLOUT_ID_FIELD: rid(), ATTEMPT_INDEX_FIELD: 0}
    for value in ("2", "yes", ""):
        _refused(await wire.request("POST", f"/run?replay_only={value}", body=row, token=None))
    assert (await wire.request("POST", "/run?replay_only=0", body=row, token=None)).status == 200


# ---------------------------------------------------------------- deadlines


@aio
@pytest.mark.parametrize("deadline", ["true", "1e308", '"1700000000"', "-1", "4102444801"])
async def test_a_deadline_that_is_no_sane_unix_time_is_422_on_both_protocols(deadline):
    body = '{"checkpoint_id": "cp-d", "deadline_ts": ' + deadline + "}"
    with V2ServerThread() as v2, GymServerThread(allow_faults=False) as agent:
        for url, path in (
            (v2.url, ROUTE_PREFIX + "/prepare"),
            (v2.url, ROUTE_PREFIX + "/renew"),
            (agent.url, "/ng-control/v1/agent-checkpoint/prepare"),
        ):
            got = await Wire(url, "test-token").request(
                "POST", path, data=body, headers={"Content-Type": "application/json"}
            )
            _refused(got)
        status = await Wire(v2.url, "test-token").request("GET", ROUTE_PREFIX + "/status")
        assert status.json["phase"] == "idle"  # nothing was opened with it


# ---------------------------------------------------------------- the simulated agent


@aio
async def test_a_simulated_row_past_its_bounds_is_422_and_the_server_answers_on(v2_server):
    wire = Wire.of(v2_server)
    for fields in (
        {"steps": 1e12, "step_s": 0},
        {"steps": MAX_SIMULATED_STEPS + 1},
        {"steps": 10, "step_s": 1e6},
        {"sleep_s": float("1e308")},
        {"steps": "many"},
    ):
        _refused(await wire.run(rid(), timeout_s=scaled(5), **fields))
    assert (await wire.request("GET", "/ready", timeout_s=scaled(2))).status == 200


@aio
async def test_the_control_plane_answers_while_a_simulated_agent_runs_steps_of_0_s(v2_server):
    wire, participant = Wire.of(v2_server), v2_server.participant
    total = MAX_SIMULATED_STEPS
    run = asyncio.ensure_future(wire.run(rid(), steps=total, step_s=0, timeout_s=scaled(120)))
    await until(lambda: participant.steps_run > 0 or run.done(), what="the steps to start")
    answers = []

    async def answered_mid_run() -> bool:
        # the loop is the agent's too: /ready and status answer between its steps
        ready = await wire.request("GET", "/ready", timeout_s=scaled(5))
        status = await wire.request("GET", ROUTE_PREFIX + "/status", timeout_s=scaled(5))
        answers.append((ready.status, status.status, participant.steps_run))
        return run.done() or 0 < participant.steps_run < total

    await until(answered_mid_run, what="the control plane answering mid-run")
    assert answers[-1][:2] == (200, 200)
    assert 0 < answers[-1][2] < total, f"only answered once the run was over: {answers}"
    done = await run
    assert done.status == 200 and done.json["steps_run"] == total


# ---------------------------------------------------------------- restore checks the counts


@aio
async def test_restore_refuses_a_manifest_whose_record_count_was_edited(tmp_path, wire_for):
    with GymServerThread(allow_faults=False) as srv:
        wire = wire_for(srv)
        for i in range(3):
            await wire.ack(await wire.complete(f"k{i}"))
        assert (await wire.prepare("cp-1")).status == 200
        assert (await wire.commit("cp-1", tmp_path)).status == 200
        assert (await wire.resume("cp-1")).status == 200
        manifest_path = Path(tmp_path) / "manifest.json"
        manifest = json.loads(manifest_path.read_bytes())
        assert manifest["records"] == 3
        for field, edited in (("records", 4), ("records", True), ("continuation_index", 1)):
            changed = dict(manifest)
            if field == "continuation_index":
                changed[field] = {**manifest[field], "records": edited}
            else:
                changed[field] = edited
            manifest_path.write_text(json.dumps(changed))
            refused = await wire.restore(f"cp-r{field}{edited}", tmp_path)
            assert (refused.status, refused.code) == (409, "restore_failed"), refused.raw
        manifest_path.write_text(json.dumps(manifest))
        restored = await wire.restore("cp-ok", tmp_path)
        assert restored.status == 200 and restored.json["records"] == 3
        await wire.resume("cp-ok")
