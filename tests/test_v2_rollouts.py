"""Rollout actors and the orchestrator against a Gym v2 server (``gym serve --protocol v2``):
rows seal with no receipt route and no ACK; a checkpoint taken mid-batch parks multi-step
episodes, commits them and they continue (no step rerun); a row refused with 409
``admission_closed`` while the checkpoint is open waits for resume and spends no try; a reply
lost after Gym finished is adopted from our server's kept reply ((ext) ``/run?replay_only=1``),
not rerun; a rollout whose deadline fires while Gym still runs it is retired with v2's retire
and tried again. Real parts: local Ray, the orchestrator's actors, the v2 server on loopback.
"""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def orchestrator(server: V2ServerThread, policy: TryPolicy, **kw):
    from rl_gym_actors.orchestrator import Orchestrator

    return Orchestrator(
        [server.endpoint],
        policy=policy,
        pool_size=1,
        rollouts_per_actor=kw.pop("slots", 8),
        progress=False,
        start=False,
        **kw,
    )


async def test_v2_batch_with_a_checkpoint_mid_batch(ray_session, tmp_path):
    with V2ServerThread() as server:
        policy = TryPolicy(rollout_s=30.0, max_tries=2, control_s=5.0, admission_wait_s=30.0)
        rows = [
            {"_ng_rollout_id": f"multi-{i}", "steps": 3, "step_s": 0.6, "reward": 0.1 * i}
            for i in range(3)
        ]
        async with orchestrator(server, policy) as orch:
            batch = asyncio.ensure_future(orch.arun_batch(rows))

            async def running() -> bool:
                return server.participant.status()["report"]["counts"]["episodes"] == 3

            await until(running, timeout_s=20.0, what="3 episodes running")
            report = await orch.acheckpoint("v2-mid", str(tmp_path), deadline_s=20.0)
            assert report.endpoints[0].protocol == "v2"
            assert report.endpoints[0].commit.records == 3  # parked at a boundary, exported
            # a row sent while the checkpoint is open would get 409 admission_closed; it is
            # resent after resume (spending no try): sent right after, it runs once
            late = await orch.arun_batch([{"_ng_rollout_id": "late", "reward": 0.9}])
            outcomes = await asyncio.wait_for(batch, 60.0)
        assert [o.status for o in outcomes] == ["sealed"] * 3
        assert [o.reward for o in outcomes] == pytest.approx([0.0, 0.1, 0.2])
        assert all(o.attempt_index == 0 for o in outcomes)  # continued, not rerun
        assert server.participant.steps_run == 10  # 3 steps each + the late row, none twice
        assert late[0].status == "sealed" and late[0].attempt_index == 0


async def test_v2_admission_closed_waits_for_resume_and_spends_no_try(ray_session, tmp_path):
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.gym.v2.client import V2Client

    with V2ServerThread() as server:
        policy = TryPolicy(rollout_s=30.0, max_tries=1, control_s=5.0, admission_wait_s=30.0)
        async with GymClient(server.endpoint) as gym, orchestrator(server, policy) as orch:
            v2 = V2Client(gym)
            import time

            await v2.prepare("held-open", deadline_ts=time.time() + 5)  # admission closed
            batch = asyncio.ensure_future(
                orch.arun_batch([{"_ng_rollout_id": "waits", "reward": 0.5}])
            )
            await asyncio.sleep(1.0)  # refused with admission_closed meanwhile (not a failure)
            assert not batch.done()
            await v2.resume("held-open", deadline_ts=time.time() + 5)
            [outcome] = await asyncio.wait_for(batch, 30.0)
        assert outcome.status == "sealed" and outcome.tries == 1 and outcome.attempt_index == 0


async def test_v2_lost_reply_is_adopted_and_deadline_retires(ray_session):
    with V2ServerThread(allow_faults=True) as server:
        policy = TryPolicy(rollout_s=2.0, max_tries=2, control_s=5.0)
        rows = [
            {"_ng_rollout_id": "lost", "reward": 0.3, "drop_reply": True},
            {"_ng_rollout_id": "slow", "sleep_s": 60.0, "reward": 0.4},
        ]
        async with orchestrator(server, policy) as orch:
            lost, slow = await asyncio.wait_for(orch.arun_batch(rows), 60.0)
            snap = await orch.asnapshot()
        assert server.faults.dropped == 1
        # the lost reply: adopted from the kept reply, the agent ran once
        assert lost.status == "sealed" and lost.reward == 0.3 and lost.attempt_index == 0
        assert snap.actors.v2_kept_replies_found == 1
        # the slow one: its deadline fired twice, each try retired on Gym (stale from then on)
        assert slow.status == "failed" and slow.tries == 2
        status = server.participant.status()
        assert status["retired_rollouts"] == 1 and status["report"]["counts"]["episodes"] == 0


async def test_v2_gym_kill_9_with_a_state_dir_mid_batch(ray_session, tmp_path):
    """``gym serve --protocol v2 --state-dir`` SIGKILLed with 3 runs in flight and restarted on
    its port: the kept replies of the batch before survive (4), every in-flight row is sealed
    by a later try or failed with a reason (its retire met the endpoint while it restarted, as
    on the agent-checkpoint server), the checkpoint commits, the failed rows sent again seal,
    and the server ends with no episode, no kept reply and no retired mark."""
    import time

    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.gym.v2.client import V2Client
    from rl_gym_actors.testing.gym_process import GymServerProcess

    server = GymServerProcess(args=["--protocol", "v2"], state_dir=tmp_path / "state").start()
    policy = TryPolicy(rollout_s=20.0, max_tries=3, control_s=5.0, admission_wait_s=30.0)
    try:
        async with GymClient(server.endpoint) as gym, orchestrator(server, policy) as orch:
            v2 = V2Client(gym)
            before = await orch.arun_batch(
                [{"_ng_rollout_id": f"kept-{i}", "reward": 0.1} for i in range(4)]
            )
            assert [o.status for o in before] == ["sealed"] * 4
            rows = [{"_ng_rollout_id": f"cut-{i}", "sleep_s": 3.0, "reward": 0.2} for i in range(3)]
            batch = asyncio.ensure_future(orch.arun_batch(rows))

            async def running() -> bool:
                status = await v2.status(deadline_ts=time.time() + 5)
                return status.report.counts.get("episodes") == 3

            await until(running, timeout_s=20.0, what="3 runs in flight")
            server.kill()
            server.start()
            status = await v2.status(deadline_ts=time.time() + 10)
            assert (status.model_extra or {})["kept_replies"] == 4  # durable across the crash
            outcomes = await asyncio.wait_for(batch, 90.0)
            for o in outcomes:  # a first try never finished: sealed later, or failed naming why
                assert (o.status == "sealed" and o.attempt_index >= 1 and o.reward == 0.2) or (
                    o.status == "failed" and o.reason
                ), o
            report = await orch.acheckpoint("after-kill", str(tmp_path / "ck"), deadline_s=30.0)
            assert report.endpoints[0].protocol == "v2" and report.endpoints[0].commit is not None
            sealed = [o.rollout_id for o in outcomes if o.status == "sealed"]
            left = [{**r, "sleep_s": 0.0} for r in rows if r["_ng_rollout_id"] not in sealed]

            async def resent() -> bool:  # an actor that still has the endpoint down fails at once
                again = await orch.arun_batch(left)
                for o in again:
                    assert o.status == "sealed" or o.reason, o
                    if o.status == "sealed":
                        sealed.append(o.rollout_id)
                        left[:] = [r for r in left if r["_ng_rollout_id"] != o.rollout_id]
                return not left

            await until(resent, timeout_s=30.0, interval_s=1.0, what="the cut rows to seal")
            assert sorted(sealed) == sorted(r["_ng_rollout_id"] for r in rows)  # each once
            await orch.acheckpoint("after-again", str(tmp_path / "ck2"), deadline_s=30.0)
            status = await v2.status(deadline_ts=time.time() + 10)
            extra = status.model_extra or {}
            assert status.report.counts.get("episodes") == 0 and extra["kept_replies"] == 0
            assert status.retired_rollouts == 0
    finally:
        server.kill()


async def test_v2_rollout_deadline_pauses_while_a_checkpoint_parks_its_episode(ray_session):
    """A checkpoint held open (its episode parked at a boundary) for longer than ``rollout_s``:
    the rollout's deadline does not count the parked time, as Gym's own does not; after resume
    the row seals with one agent run (every step once, attempt 0, one try)."""
    import time

    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.gym.v2.client import V2Client

    with V2ServerThread() as server:
        policy = TryPolicy(rollout_s=2.0, max_tries=2, control_s=5.0, admission_wait_s=30.0)
        row = {"_ng_rollout_id": "parked", "steps": 3, "step_s": 0.4, "reward": 0.7}
        async with GymClient(server.endpoint) as gym, orchestrator(server, policy) as orch:
            v2 = V2Client(gym)
            batch = asyncio.ensure_future(orch.arun_batch([row]))
            await until(lambda: server.participant.steps_run >= 1, timeout_s=20.0, what="a step")
            prepared = await v2.prepare("held-long", deadline_ts=time.time() + 10)
            assert prepared.prepared  # the episode is parked at a boundary
            held_from = time.monotonic()
            await asyncio.sleep(2 * policy.rollout_s)  # the checkpoint stays open that long
            assert not batch.done() and time.monotonic() - held_from >= policy.rollout_s
            await v2.resume("held-long", deadline_ts=time.time() + 5)
            [outcome] = await asyncio.wait_for(batch, 30.0)
            snap = await orch.asnapshot()
        assert outcome.status == "sealed" and outcome.reward == 0.7, outcome.reason
        assert outcome.tries == 1 and outcome.attempt_index == 0
        assert outcome.reply["steps_run"] == 3 and server.participant.steps_run == 3
        # its own /run answered it: not given up on and then adopted from our server's kept
        # reply (a real Gym keeps none: it would have run again)
        assert not outcome.adopted and snap.actors.v2_kept_replies_found == 0
        assert snap.actors.deadlines_paused == 1
        status = server.participant.status()
        assert status["retired_rollouts"] == 0 and status["report"]["counts"]["episodes"] == 0


async def test_v2_admission_refused_past_admission_wait_fails_typed(ray_session):
    """A row refused with 409 ``admission_closed`` for all of ``admission_wait_s`` ends failed
    ``admission_closed`` through the orchestrator, with one try and nothing retired (no send
    of it ran); sent again after resume it seals and the agent runs once."""
    import time

    from rl_gym_actors.failures import FailureKind
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.gym.v2.client import V2Client

    with V2ServerThread() as server:
        policy = TryPolicy(rollout_s=10.0, max_tries=2, control_s=2.0, admission_wait_s=1.0)
        row = {"_ng_rollout_id": "refused", "reward": 0.4}
        async with GymClient(server.endpoint) as gym, orchestrator(server, policy) as orch:
            v2 = V2Client(gym)
            await v2.prepare("held", deadline_ts=time.time() + 5)
            [refused] = await asyncio.wait_for(orch.arun_batch([row]), 30.0)
            assert server.participant.status()["retired_rollouts"] == 0
            await v2.resume("held", deadline_ts=time.time() + 5)
            [again] = await asyncio.wait_for(orch.arun_batch([row]), 30.0)
        assert refused.status == "failed" and refused.failure is FailureKind.ADMISSION_CLOSED
        assert refused.tries == 1 and "admission" in (refused.reason or "")
        assert "retire" not in (refused.reason or "")  # none tried, none waited out
        assert again.status == "sealed" and again.reward == 0.4
        assert server.participant.steps_run == 1
