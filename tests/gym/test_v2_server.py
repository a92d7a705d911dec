"""Our v2 server (``gym serve --protocol v2``) on loopback: episodes park at step boundaries,
a checkpoint exports their progress, a restore in a fresh process continues each as its next
attempt (only the steps after the boundary run again), the lease reopens on its own, retire
stops a run and refuses its attempt until forget, a commit scope deletes restored state it
leaves out, and the pure transition table."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from gym_test_helpers import cid, expect_type, rid, soon

from rl_gym_actors.errors import (
    AdmissionClosed,
    CheckpointConflict,
    CheckpointRejected,
    CheckpointStateInvalid,
    InvalidPhase,
    StaleAttempt,
    StaleCheckpoint,
)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.machine import ALLOWED, Machine
from rl_gym_actors.gym.v2.wire import EpisodeId, Phase
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")


# ---------------------------------------------------------------- the pure table


def test_transition_table_and_fencing():
    m = Machine(lease_grace_s=5.0)
    assert m.admit("prepare", "a") is None and m.admit("restore", "a") is None
    for op in ("renew", "commit", "resume"):
        with pytest.raises(InvalidPhase):
            m.admit(op, "a")
    m.open_checkpoint("a", Phase.PREPARING, 100.0)
    assert m.lease_expires_at == 105.0 and m.renew(90.0) == 105.0  # never shortened
    with pytest.raises(CheckpointConflict):
        m.admit("prepare", "b")
    with pytest.raises(InvalidPhase):
        m.admit("retire", "a")
    m.to(Phase.PREPARED)
    m.record("a", "commit", {"phase": "committed"})
    assert m.admit("commit", "a") == {"phase": "committed"}
    assert m.expired(104.9) is None and m.expired(105.0) == "a"
    assert m.resume("a") == ({"phase": "idle", "idempotent": False}, True)
    assert m.resume("a") == ({"phase": "idle", "idempotent": True}, False)
    with pytest.raises(StaleCheckpoint):
        m.admit("prepare", "a")
    with pytest.raises(StaleCheckpoint):
        m.admit("commit", "a")
    m.retired.mark([EpisodeId(rollout_id="x", attempt=2), EpisodeId(rollout_id="x", attempt=1)])
    with pytest.raises(StaleAttempt):
        m.retired.check(EpisodeId(rollout_id="x", attempt=2))
    m.retired.check(EpisodeId(rollout_id="x", attempt=3))
    assert set(ALLOWED["retire"]) == {Phase.IDLE, Phase.RESTORED}


# ---------------------------------------------------------------- live server


@aio
async def test_episode_parks_at_a_boundary_is_exported_and_continues(
    v2_server, v2_client, v2, tmp_path
):
    r = rid()
    row = {"steps": 6, "step_s": 0.1}
    run = asyncio.ensure_future(
        v2_client.run(row, rollout_id=r, attempt_index=0, deadline_ts=soon(30))
    )
    await until(lambda: v2_server.participant.steps_run >= 2, what="two steps ran")
    c = cid()
    prepared = await v2.prepare(c, deadline_ts=soon())
    assert prepared.prepared and prepared.report.counts["parked"] == 1
    steps_at_cut = v2_server.participant.steps_run
    committed = await v2.commit(c, str(tmp_path), [(r, 0)], deadline_ts=soon())
    assert committed.episode_ids == [r]
    path = tmp_path / "gym" / "agent" / "agent" / committed.manifest.records_file
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["episode_id"] == {"rollout_id": r, "attempt": 0}
    assert 1 <= record["boundary"]["step"] < 6
    await asyncio.sleep(0.3)
    assert v2_server.participant.steps_run == steps_at_cut  # parked: no step ran
    assert not run.done()
    await v2.resume(c, deadline_ts=soon())
    reply = (await run).reply
    assert reply["steps_run"] == 6 and reply["steps"] == 6


@aio
async def test_restore_in_a_fresh_server_continues_as_the_next_attempt(
    v2_server, v2_client, v2, tmp_path
):
    r = rid()
    run = asyncio.ensure_future(
        v2_client.run(
            {"steps": 8, "step_s": 0.1}, rollout_id=r, attempt_index=0, deadline_ts=soon(30)
        )
    )
    await until(lambda: v2_server.participant.steps_run >= 3, what="three steps ran")
    c = cid()
    assert (await v2.prepare(c, deadline_ts=soon())).prepared
    await v2.commit(c, str(tmp_path), [(r, 0)], deadline_ts=soon())
    boundary = v2_server.participant.table.live[r].boundary["step"]
    run.cancel()
    # a fresh process: nothing of the old one survives
    with V2ServerThread() as fresh:
        async with GymClient(fresh.endpoint) as gym:
            v2 = V2Client(gym)
            restore_id = cid()
            await expect_type(
                CheckpointStateInvalid,
                v2.restore(restore_id, str(tmp_path / "nothing"), [(r, 0)], deadline_ts=soon()),
            )
            restored = await v2.restore(restore_id, str(tmp_path), [(r, 0)], deadline_ts=soon())
            assert restored.phase is Phase.RESTORED and restored.restored == [f"{r}-a1"]
            assert restored.source_checkpoint_id == c
            status = await v2.status(deadline_ts=soon())
            assert status.model_extra["restored_pending"] == [f"{r}-a1"]
            await expect_type(
                StaleAttempt, gym.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon())
            )
            refused = await expect_type(
                AdmissionClosed, gym.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
            )
            # Gym's own code (AdmissionClosedError.code), which NeMo RL matches to yield
            # GymAdmissionClosed; agent_admission_closed is the agent-checkpoint protocol's
            assert (refused.status, refused.code) == (409, "admission_closed")
            row = {"steps": 8, "step_s": 0.05}
            replacement = asyncio.ensure_future(
                gym.run(row, rollout_id=r, attempt_index=1, deadline_ts=soon(30))
            )
            await until(lambda: r in fresh.participant.table.live, what="the replacement began")
            await asyncio.sleep(0.2)
            assert fresh.participant.steps_run == 0  # parked at its first boundary until resume
            await v2.resume(restore_id, deadline_ts=soon())
            reply = (await replacement).reply
            assert reply["steps_run"] == 8 - boundary  # only the steps after the boundary


@aio
async def test_commit_scope_deletes_restored_state_it_leaves_out(
    v2_server, v2_client, v2, tmp_path
):
    a, b = rid(), rid()
    runs = [
        asyncio.ensure_future(
            v2_client.run(
                {"steps": 50, "step_s": 0.05},
                rollout_id=x,
                attempt_index=0,
                deadline_ts=soon(30),
            )
        )
        for x in (a, b)
    ]
    await until(lambda: v2_server.participant.steps_run >= 2, what="steps ran")
    c = cid()
    await v2.prepare(c, deadline_ts=soon())
    assert (await v2.commit(c, str(tmp_path), None, deadline_ts=soon())).episode_ids == sorted(
        [a, b]
    )
    for run in runs:
        run.cancel()
    with V2ServerThread() as fresh:
        async with GymClient(fresh.endpoint) as gym:
            v2 = V2Client(gym)
            rc = cid()
            await v2.restore(rc, str(tmp_path), [(a, 0), (b, 0)], deadline_ts=soon())
            await v2.resume(rc, deadline_ts=soon())
            # restoring into a process that holds restored episodes is refused
            await expect_type(
                CheckpointRejected, v2.restore(cid(), str(tmp_path), [], deadline_ts=soon())
            )
            c2 = cid()
            await v2.prepare(c2, deadline_ts=soon())
            second = tmp_path / "second"
            committed = await v2.commit(c2, str(second), [(a, 1)], deadline_ts=soon())
            assert committed.episode_ids == [f"{a}-a1"]  # exported under its replacement attempt
            assert fresh.participant.table.restored_pending() == [
                EpisodeId(rollout_id=a, attempt=1)
            ]
            await v2.resume(c2, deadline_ts=soon())
            # b's restored state is gone and its attempt is not refused: it may start over
            fresh_b = await gym.run({}, rollout_id=b, attempt_index=1, deadline_ts=soon())
            assert fresh_b.reply["steps_run"] == 1
            # a second, different commit into the same directory is refused
            c3 = cid()
            await v2.prepare(c3, deadline_ts=soon())
            await expect_type(
                CheckpointStateInvalid, v2.commit(c3, str(second), [], deadline_ts=soon())
            )
            await v2.resume(c3, deadline_ts=soon())


@aio
async def test_retire_stops_a_run_prepare_blockers_and_lease_expiry():
    async def slow(row):  # no boundary but its start: a prepare waits for it
        await asyncio.sleep(row.get("sleep_s", 0))
        return {"ok": True}

    with V2ServerThread(agent=slow, lease_grace_s=0.5) as srv:
        async with GymClient(srv.endpoint) as gym:
            v2 = V2Client(gym)
            r = rid()
            run = asyncio.ensure_future(
                gym.run({"sleep_s": 30}, rollout_id=r, attempt_index=0, deadline_ts=soon(40))
            )
            await until(lambda: srv.participant.table.live, what="the run started")
            c = cid()
            answer = await v2.prepare(c, deadline_ts=time.time() + 0.5)  # to miss
            assert answer.phase is Phase.PREPARING and answer.report.blockers == [r]
            assert answer.report.blocker_count == 1
            status = await v2.status(deadline_ts=soon())
            assert status.model_extra["accepting"] is False  # stays closed after a missed prepare
            # no renew: the lease (deadline + 0.5 s) runs out and the server resumes on its own
            await until(
                lambda: srv.participant.machine.phase is Phase.IDLE,
                timeout_s=10,
                what="lease expiry",
            )
            await expect_type(StaleCheckpoint, v2.renew(c, deadline_ts=soon()))
            retired = await v2.retire(cid(), [(r, 0)], deadline_ts=soon())
            assert retired.retired == [r]
            await expect_type(StaleAttempt, run)
            assert not srv.participant.table.live
            await expect_type(
                StaleAttempt, gym.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon())
            )


@aio
async def test_kept_listing_names_each_kept_reply_until_retired_or_forgotten(
    v2_server, v2_client, v2
):
    """(ext) ``GET .../kept``: the capture keys of the kept replies, sorted, capped by
    ``limit`` with the full count; a bad limit is 422, a wrong token 401."""
    from rl_gym_actors.errors import InvalidRequest, Unauthorized

    a, b = sorted([rid(), rid()])
    for r, att in ((a, 0), (b, 0), (b, 1)):
        await v2_client.run({}, rollout_id=r, attempt_index=att, deadline_ts=soon())
    listed = await v2.kept(deadline_ts=soon())
    assert listed is not None and listed.kept == sorted([a, b, f"{b}-a1"])
    assert listed.count == 3
    first = await v2.kept(deadline_ts=soon(), limit=1)
    assert first is not None and (first.kept, first.count) == ([min(listed.kept)], 3)
    await v2.retire(cid(), [(b, 0)], deadline_ts=soon())  # attempt 1 stays kept
    await v2.forget(cid(), [a], deadline_ts=soon())
    listed = await v2.kept(deadline_ts=soon())
    assert listed is not None and (listed.kept, listed.count) == ([f"{b}-a1"], 1)
    for bad in ("0", "x", "100001"):
        answer = await v2_client._send(
            "GET",
            "/ng-control/v1/checkpoint/kept",
            control=True,
            params={"limit": bad},
            deadline_ts=soon(),
        )
        assert answer.status == 422, (bad, answer.status)
    with pytest.raises(InvalidRequest):  # a 422 is raised; only a 404/405 is None
        await v2.kept(deadline_ts=soon(), limit=0)
    async with GymClient(v2_server.endpoint.model_copy(update={"token": "wrong"})) as other:
        with pytest.raises(Unauthorized):
            await V2Client(other).kept(deadline_ts=soon())


@pytest.mark.slow  # seconds: out of make test-fast
def test_cli_serves_v2():
    with GymServerProcess(args=["--protocol", "v2"], allow_faults=False) as srv:

        async def main():
            async with GymClient(srv.endpoint) as gym:
                status = await V2Client(gym).status(deadline_ts=soon())
                res = await gym.run(
                    {"steps": 2}, rollout_id=rid(), attempt_index=0, deadline_ts=soon()
                )
                return status, res

        status, res = asyncio.run(main())
    assert status.kind == "agent" and status.phase is Phase.IDLE
    assert res.reply["steps_run"] == 2
