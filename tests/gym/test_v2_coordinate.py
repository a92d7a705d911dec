"""The v2 gate's steps over several v2 servers on loopback: a whole checkpoint with multi-step
episodes in flight, restarts left out of the commit scope, blockers named in CheckpointFailed,
the lease renewed while open, restore all-or-nothing, retire and forget callers first."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from gym_test_helpers import rid, soon

from rl_gym_actors.errors import CheckpointFailed, ConfigError, StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2 import coordinate as co
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import EpisodeId, Phase
from rl_gym_actors.testing.counting_agent import HeldAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")


@contextlib.asynccontextmanager
async def servers(*argss):
    with contextlib.ExitStack() as stack:
        srvs = [stack.enter_context(V2ServerThread(args=a)) for a in argss]
        async with contextlib.AsyncExitStack() as astack:
            clients = {
                f"s{i}": await astack.enter_async_context(GymClient(s.endpoint))
                for i, s in enumerate(srvs)
            }
            parts = await co.discover_participants(clients, deadline_ts=soon())
            yield srvs, clients, parts


def test_orders_and_renew_interval():
    v = V2Client.__new__(V2Client)
    parts = co.ordered(
        [
            co.Participant("b", "resources", v),
            co.Participant("a", "agent", v),
            co.Participant("m", "model", v),
            co.Participant("e", "environment", v),
        ]
    )
    assert [p.kind for p in parts] == ["environment", "model", "agent", "resources"]
    with pytest.raises(ValueError):
        co.ordered([co.Participant("x", "judge", v)])
    assert co.renew_every(60) == 10.0 and co.renew_every(6) == 2.0 and co.renew_every(0) == 0.01


@aio
async def test_checkpoint_commits_the_continued_scope_without_restarts(tmp_path):
    async with servers([], ["--restart-only"]) as (srvs, clients, parts):
        a, b = rid(), rid()
        runs = [
            asyncio.ensure_future(
                clients["s0"].run(
                    {"steps": 5, "step_s": 0.1}, rollout_id=a, attempt_index=0, deadline_ts=soon(30)
                )
            ),
            asyncio.ensure_future(
                clients["s1"].run(
                    {"steps": 3, "step_s": 0.2}, rollout_id=b, attempt_index=0, deadline_ts=soon(30)
                )
            ),
        ]
        await until(
            lambda: srvs[0].participant.steps_run >= 1 and srvs[1].participant.table.live,
            what="both running",
        )
        dirs = {"s0": str(tmp_path / "s0"), "s1": str(tmp_path / "s1")}
        out = await co.checkpoint(
            parts, "ck1", dirs, [EpisodeId(rollout_id=a), EpisodeId(rollout_id=b)], timeout_s=10
        )
        assert out.restarts == [b] and out.scope == [EpisodeId(rollout_id=a)]
        assert out.commits["s0"].episode_ids == [a] and out.commits["s1"].episode_ids == []
        for s in srvs:
            assert s.participant.machine.phase is Phase.IDLE  # resumed
        assert (await runs[0]).reply["steps_run"] == 5 and (await runs[1]).reply["steps_run"] == 3


@aio
async def test_not_ready_names_the_blockers_and_resumes(tmp_path):
    held = HeldAgent()
    with V2ServerThread(agent=held) as srv:
        async with GymClient(srv.endpoint) as gym:
            parts = await co.discover_participants({"only": gym}, deadline_ts=soon())
            r = rid()
            run = asyncio.ensure_future(
                gym.run({}, rollout_id=r, attempt_index=0, deadline_ts=soon(30))
            )
            await until(lambda: srv.participant.table.live, what="running")
            with pytest.raises(CheckpointFailed) as info:
                await co.checkpoint(
                    parts, "ck2", {"only": str(tmp_path)}, [EpisodeId(rollout_id=r)], timeout_s=0.6
                )
            assert info.value.blockers == {
                "only": {"phase": "preparing", "blockers": [r], "blocker_count": 1}
            }
            assert srv.participant.machine.phase is Phase.IDLE and srv.participant.table.accepting
            held.release()
            assert (await run).reply == {"ok": True}


@aio
async def test_renewer_keeps_the_lease_while_open():
    with V2ServerThread() as srv:
        async with GymClient(srv.endpoint) as gym:
            parts = await co.discover_participants({"x": gym}, deadline_ts=soon())
            await co.prepare(parts, "ck3", deadline_ts=time.time() + 0.3)  # a lease renews extend
            first = srv.participant.machine.lease_expires_at
            async with co.Renewer(parts, "ck3", timeout_s=0.3) as renewer:
                await until(lambda: renewer.renewals >= 2, what="two renewals")
            assert srv.participant.machine.lease_expires_at > first
            await co.resume(parts, "ck3", deadline_ts=soon())


@aio
async def test_restore_is_all_or_nothing(tmp_path):
    r = rid()
    async with servers([], []) as (srvs, clients, parts):
        run = asyncio.ensure_future(
            clients["s0"].run(
                {"steps": 20, "step_s": 0.05}, rollout_id=r, attempt_index=0, deadline_ts=soon(30)
            )
        )
        await until(lambda: srvs[0].participant.steps_run >= 1, what="a step")
        dirs = {"s0": str(tmp_path / "s0"), "s1": str(tmp_path / "s1")}
        await co.checkpoint(parts, "ck4", dirs, [EpisodeId(rollout_id=r)], timeout_s=10)
        run.cancel()
    async with servers([], []) as (srvs, clients, parts):
        broken = {"s0": str(tmp_path / "s0"), "s1": str(tmp_path / "missing")}
        with pytest.raises(co.CoordinationError) as info:
            await co.restore(parts, "rs1", broken, [EpisodeId(rollout_id=r)], deadline_ts=soon())
        assert (
            set(info.value.failures) == {"s1"}
            and "CheckpointStateInvalid" in info.value.failures["s1"]
        )
        s0 = srvs[0].participant
        assert s0.machine.phase is Phase.IDLE and not s0.table.restored and s0.table.accepting
        assert s0.machine.retired.refused(EpisodeId(rollout_id=r, attempt=1))  # retired replacement
        await co.forget(parts, "rs1", [r, r], deadline_ts=soon())
        assert len(s0.machine.retired) == 0
        # the whole restore works once both have their files
        good = {"s0": str(tmp_path / "s0"), "s1": str(tmp_path / "s1")}
        answers = await co.restore(
            parts, "rs2", good, [EpisodeId(rollout_id=r)], deadline_ts=soon()
        )
        assert answers["s0"].restored == [f"{r}-a1"] and answers["s1"].restored == []
        await co.resume(parts, "rs2", deadline_ts=soon())


@aio
async def test_agent_protocol_server_is_no_v2_participant():
    with GymServerThread(token="test-token") as srv:
        async with GymClient(srv.endpoint) as gym:
            with pytest.raises(ConfigError):
                await co.discover_participants({"old": gym}, deadline_ts=soon())


@aio
async def test_forget_hygiene_keeps_retired_marks_and_kept_replies_bounded():
    """400 rollouts, 1 in 20 dropped by its deadline (retired while it runs); every rollout
    finished for good is forgotten in batches of 50: the marks never pass one batch."""
    async with servers([]) as (srvs, clients, parts):
        gym, p = clients["s0"], srvs[0].participant
        forgetter = co.Forgetter(parts, batch=50)
        peaks = []
        for wave in range(8):
            ids = [rid() for _ in range(50)]
            dropped = set(ids[::20])
            runs = {
                r: asyncio.ensure_future(
                    gym.run(
                        {"sleep_s": 5 if r in dropped else 0},
                        rollout_id=r,
                        attempt_index=0,
                        deadline_ts=soon(30),
                    )
                )
                for r in ids
            }
            finished = [runs[r] for r in ids if r not in dropped]
            await until(lambda fs=finished: all(f.done() for f in fs), what="a wave")
            await co.retire(
                parts, f"w{wave}", [EpisodeId(rollout_id=r) for r in dropped], deadline_ts=soon()
            )
            for r in dropped:
                with pytest.raises(StaleAttempt):  # its caller hears it was retired
                    await runs[r]
            peaks.append((len(p.machine.retired), sum(len(k) for k in p.table.kept.values())))
            await forgetter.add(ids, f"w{wave}")
        assert forgetter.forgotten == 400 and forgetter.pending == 0
        status = await V2Client(gym).status(deadline_ts=soon())
        assert status.retired_rollouts == 0 and status.model_extra["kept_replies"] == 0
        assert max(m for m, _ in peaks) == 3 and max(k for _, k in peaks) <= 50
        # a forget while a checkpoint is open is refused and kept for later
        await co.prepare(parts, "open", deadline_ts=soon())
        await forgetter.add(["late"], "open")
        assert not await forgetter.flush("open") and forgetter.pending == 1
        await co.resume(parts, "open", deadline_ts=soon())
        assert await forgetter.flush("after") and forgetter.pending == 0
