"""The v2 client against our v2 server on loopback: every route, every error code a participant
answers, discovery of both protocols, and the wire models' rules (EpisodeId, capture keys)."""

from __future__ import annotations

import json
import time

import pytest
from gym_test_helpers import cid, expect, rid, soon
from pydantic import ValidationError

from rl_gym_actors.errors import (
    AdmissionClosed,
    CheckpointConflict,
    CheckpointDeadlinePassed,
    CheckpointRejected,
    CheckpointStateInvalid,
    ConfigError,
    InvalidPhase,
    RestartInScope,
    RolloutIdRequired,
    StaleAttempt,
    StaleCheckpoint,
    Unauthorized,
)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.answers import error_for_response
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol
from rl_gym_actors.gym.v2.wire import ERROR_STATUS, EpisodeId, Phase, PrepareReport
from rl_gym_actors.testing.counting_agent import HeldAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")


# ---------------------------------------------------------------- wire rules (pure)


def test_episode_id_capture_key_round_trip_and_reserved_suffix():
    assert EpisodeId(rollout_id="x").capture_key == "x"
    assert EpisodeId(rollout_id="x", attempt=3).capture_key == "x-a3"
    assert EpisodeId.from_capture_key("x-a3") == EpisodeId(rollout_id="x", attempt=3)
    assert EpisodeId.from_capture_key("x-a0") == EpisodeId(rollout_id="x-a0")
    assert EpisodeId(rollout_id="x", attempt=3).next_attempt().capture_key == "x-a4"
    for bad in ("x-a1", "x-a12", "", "-x", "a b"):
        with pytest.raises(ValidationError):
            EpisodeId(rollout_id=bad)
    for ok in ("x-a0", "x-a01", "x-a"):
        assert EpisodeId(rollout_id=ok).capture_key == ok
    with pytest.raises(ValidationError):
        EpisodeId(rollout_id="x", attempt=-1)
    with pytest.raises(ValidationError):
        EpisodeId(rollout_id="x", attempt=True)
    with pytest.raises(ValidationError):
        EpisodeId.model_validate({"rollout_id": "x", "attempt": 0, "extra": 1})


def test_prepare_report_caps_blockers_and_keeps_the_count():
    report = PrepareReport.model_validate(
        {"ready": False, "blockers": [str(i) for i in range(250)]}
    )
    assert len(report.blockers) == 100 and report.blocker_count == 250
    assert (
        PrepareReport.model_validate({"ready": True, "restarts": ["a"] * 300}).restarts
        == ["a"] * 300
    )


@pytest.mark.parametrize("code", sorted(ERROR_STATUS))
def test_every_v2_code_maps_to_its_own_type(code):
    expected = {
        "checkpoint_error": CheckpointRejected,
        "stale_checkpoint": StaleCheckpoint,
        "checkpoint_conflict": CheckpointConflict,
        "invalid_phase": InvalidPhase,
        "deadline_exceeded": CheckpointDeadlinePassed,
        "stale_attempt": StaleAttempt,
        "admission_closed": AdmissionClosed,
        "restart_in_scope": RestartInScope,
        "rollout_id_required": RolloutIdRequired,
        "unauthorized": Unauthorized,
        "invalid_checkpoint_state": CheckpointStateInvalid,
    }[code]
    raw = json.dumps({"error": {"code": code, "detail": "d"}}).encode()
    err = error_for_response(ERROR_STATUS[code], raw, url="u")
    assert type(err) is expected and err.code == code and err.status == ERROR_STATUS[code]


# ---------------------------------------------------------------- discovery


@aio
async def test_discovery_finds_v2_and_the_agent_protocol(v2_client, v2_server):
    found = await discover_protocol(v2_client, deadline_ts=soon())
    assert found.protocol is CheckpointProtocol.V2 and found.kind == "agent"
    with GymServerThread(token="test-token") as agent_server:
        async with GymClient(agent_server.endpoint) as other:
            found = await discover_protocol(other, deadline_ts=soon())
    assert found.protocol is CheckpointProtocol.AGENT and found.status is None


@aio
async def test_wrong_token_is_unauthorized_not_a_fallback(v2_server):
    bad = v2_server.endpoint.model_copy(update={"token": "nope"})
    async with GymClient(bad) as c:
        await expect(Unauthorized, discover_protocol(c, deadline_ts=soon()))
        await expect(Unauthorized, V2Client(c).prepare(cid(), deadline_ts=soon()))


# ---------------------------------------------------------------- the checkpoint cycle


@aio
async def test_status_prepare_renew_commit_resume_cycle(v2_client, v2, tmp_path):
    status = await v2.status(deadline_ts=soon())
    assert status.phase is Phase.IDLE and status.retired_rollouts == 0 and status.report.ready
    c = cid()
    prepared = await v2.prepare(c, deadline_ts=soon())
    assert prepared.prepared and prepared.report.ready
    assert await v2.prepare(c, deadline_ts=soon()) == prepared  # replayed
    renewed = await v2.renew(c, deadline_ts=soon(30))
    assert renewed.lease_expires_at >= soon(30) - 1
    committed = await v2.commit(c, str(tmp_path), [], deadline_ts=soon())
    assert committed.phase is Phase.COMMITTED and committed.manifest.record_count == 0
    assert committed.manifest.checkpoint_id == c and committed.manifest.kind == "agent"
    manifest = tmp_path / "gym" / "agent" / "agent" / "manifest.json"
    assert json.loads(manifest.read_text())["records_sha256"] == committed.manifest.records_sha256
    assert await v2.commit(c, str(tmp_path), [], deadline_ts=soon()) == committed  # replayed
    first = await v2.resume(c, deadline_ts=soon())
    assert first.phase is Phase.IDLE and first.idempotent is False
    assert (await v2.resume(c, deadline_ts=soon())).idempotent is True
    await expect(StaleCheckpoint, v2.prepare(c, deadline_ts=soon()))
    never_seen = await v2.resume(cid(), deadline_ts=soon())
    assert never_seen.idempotent is True


@aio
async def test_phase_and_id_rejections(v2, tmp_path):
    c = cid()
    await expect(InvalidPhase, v2.renew(c, deadline_ts=soon()))
    await expect(InvalidPhase, v2.commit(c, str(tmp_path), None, deadline_ts=soon()))
    await v2.prepare(c, deadline_ts=soon())
    err = await expect(CheckpointConflict, v2.prepare(cid(), deadline_ts=soon()))
    assert err.active_checkpoint_id == c
    await expect(InvalidPhase, v2.retire(c, [(rid(), 0)], deadline_ts=soon()))
    await expect(InvalidPhase, v2.forget(c, [rid()], deadline_ts=soon()))
    await expect(InvalidPhase, v2.restore(c, str(tmp_path), [], deadline_ts=soon()))
    await v2.resume(c, deadline_ts=soon())


@aio
async def test_run_admission_retire_forget(v2_client, v2):
    r = rid()
    res = await v2_client.run({"reward": 0.5}, rollout_id=r, attempt_index=0, deadline_ts=soon())
    assert res.reply["reward"] == 0.5 and res.replayed is False
    again = await v2_client.run({"reward": 0.5}, rollout_id=r, attempt_index=0, deadline_ts=soon())
    assert again.replayed is True and again.reply == res.reply  # (ext) the kept reply
    c = cid()
    assert (await v2.retire(c, [(r, 1)], deadline_ts=soon())).retired == [f"{r}-a1"]
    assert (await v2.status(deadline_ts=soon())).retired_rollouts == 1
    await expect(StaleAttempt, v2_client.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon()))
    await expect(StaleAttempt, v2_client.run({}, rollout_id=r, attempt_index=1, deadline_ts=soon()))
    later = await v2_client.run({}, rollout_id=r, attempt_index=2, deadline_ts=soon())
    assert later.replayed is False  # a later attempt is admitted without forget
    assert (await v2.forget(c, [r, r], deadline_ts=soon())).forgotten == [r]
    assert (await v2.status(deadline_ts=soon())).retired_rollouts == 0
    # admission closed while a checkpoint is open
    p = cid()
    await v2.prepare(p, deadline_ts=soon())
    await expect(
        AdmissionClosed, v2_client.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
    )
    await v2.resume(p, deadline_ts=soon())


@aio
async def test_bad_input_gets_named_4xx(v2_server, v2_client, v2):
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.post(v2_server.url + "/run", json={"reward": 1}) as resp:
            body = await resp.json()
            assert resp.status == 400 and body["error"]["code"] == "rollout_id_required"
        headers = {"Authorization": "Bearer test-token"}
        for body in ({"checkpoint_id": "c", "deadline_ts": soon(), "x": 1}, {"checkpoint_id": "c"}):
            async with s.post(
                v2_server.url + "/ng-control/v1/checkpoint/prepare", json=body, headers=headers
            ) as resp:
                assert resp.status == 422
                assert (await resp.json())["error"]["code"] == "invalid_request"
        async with s.post(
            v2_server.url + "/ng-control/v1/checkpoint/retire",
            json={"checkpoint_id": "c", "deadline_ts": soon(), "episode_ids": []},
            headers=headers,
        ) as resp:
            assert resp.status == 422
        async with s.post(
            v2_server.url + "/ng-control/v1/checkpoint/restore",
            json={
                "checkpoint_id": "c",
                "deadline_ts": time.time() - 1,
                "checkpoint_dir": "/x",
                "episode_ids": [],
            },
            headers=headers,
        ) as resp:
            assert resp.status == 409
            assert (await resp.json())["error"]["code"] == "deadline_exceeded"
    with pytest.raises(ConfigError):
        await v2.retire(cid(), [], deadline_ts=soon())
    with pytest.raises(ConfigError):
        await v2.retire(cid(), [("x-a1", 0)], deadline_ts=soon())
    with pytest.raises(ConfigError):
        await v2.forget(cid(), [], deadline_ts=soon())


@aio
async def test_restore_of_a_missing_checkpoint_is_invalid_state(v2, tmp_path):
    c = cid()
    await expect(CheckpointStateInvalid, v2.restore(c, str(tmp_path), [], deadline_ts=soon()))
    status = await v2.status(deadline_ts=soon())
    assert status.phase is Phase.IDLE and status.model_extra["accepting"] is True


@aio
async def test_restart_in_scope_and_deadline_passed():
    held = HeldAgent()  # the run lasts until the test releases it
    with V2ServerThread(agent=held, token="test-token", args=["--restart-only"]) as srv:
        async with GymClient(srv.endpoint) as gym:
            v2 = V2Client(gym)
            import asyncio

            r = rid()
            run = asyncio.ensure_future(
                gym.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon())
            )
            await until(lambda: srv.participant.table.live, what="the run started")
            c = cid()
            prepared = await v2.prepare(c, deadline_ts=soon())
            assert prepared.prepared and prepared.report.restarts == [r]
            await expect(
                RestartInScope, v2.commit(c, "/tmp/unused-v2", [(r, 0)], deadline_ts=soon())
            )
            held.release()
            assert (await run).reply == {"ok": True}
            assert held.started == 1  # a restart keeps running through it
            await v2.resume(c, deadline_ts=soon())
