"""(ext) ``gym serve --protocol v2 --state-dir``: kept replies, retired marks and committed
answers survive a ``kill -9`` of the server; the store on its own (load after writes, a crashed
store writes nothing and says so)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from gym_test_helpers import rid, soon

from rl_gym_actors.errors import StaleAttempt, StaleCheckpoint
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.state import StateWriteFailed, V2State
from rl_gym_actors.gym.v2.wire import EpisodeId
from rl_gym_actors.testing.gym_process import GymServerProcess

aio = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.slow  # seconds: out of make test-fast
def test_kept_reply_marks_and_commit_survive_sigkill(tmp_path):
    kept, retired, c = rid(), rid(), f"c{uuid.uuid4().hex[:8]}"
    ckpt = str(tmp_path / "ckpt")
    srv = GymServerProcess(
        state_dir=tmp_path / "state", allow_faults=False, args=["--protocol", "v2"]
    )
    srv.start()
    try:

        async def before():
            async with GymClient(srv.endpoint) as gym:
                v2 = V2Client(gym)
                first = await gym.run(
                    {"steps": 2, "reward": 0.25},
                    rollout_id=kept,
                    attempt_index=0,
                    deadline_ts=soon(),
                )
                await v2.retire("any", [(retired, 0)], deadline_ts=soon())
                await v2.prepare(c, deadline_ts=soon())
                committed = await v2.commit(c, ckpt, None, deadline_ts=soon())
                return first, committed

        first, committed = asyncio.run(before())
        assert not first.replayed and first.reply["steps_run"] == 2
        srv.kill()  # SIGKILL right after the answers: what they promised must be on disk
        assert srv.returncode == -9
        srv.start()

        async def after():
            async with GymClient(srv.endpoint) as gym:
                v2 = V2Client(gym)
                status = await v2.status(deadline_ts=soon())
                again = await gym.run(
                    {"steps": 2, "reward": 0.25},
                    rollout_id=kept,
                    attempt_index=0,
                    deadline_ts=soon(),
                )
                status_after = await v2.status(deadline_ts=soon())
                with pytest.raises(StaleAttempt):
                    await gym.run({}, rollout_id=retired, attempt_index=0, deadline_ts=soon())
                replayed_commit = await v2.commit(c, ckpt, None, deadline_ts=soon())
                resumed = await v2.resume(c, deadline_ts=soon())
                with pytest.raises(StaleCheckpoint):
                    await v2.commit(c, ckpt, None, deadline_ts=soon())
                await v2.forget("any", [retired, kept], deadline_ts=soon())
                fresh = await gym.run({}, rollout_id=retired, attempt_index=0, deadline_ts=soon())
                return status, again, status_after, replayed_commit, resumed, fresh

        status, again, status_after, replayed_commit, resumed, fresh = asyncio.run(after())
    finally:
        srv.stop()
    extra = status.model_extra or {}
    assert status.phase.value == "idle" and status.retired_rollouts == 1
    assert extra["kept_replies"] == 1 and extra["durable"] is True
    assert again.replayed and again.raw == first.raw  # answered from the state dir
    assert (status_after.model_extra or {})["steps_run"] == 0  # the agent did not run again
    assert replayed_commit.model_dump() == committed.model_dump()
    assert resumed.idempotent
    assert fresh.reply["steps_run"] == 1  # forgotten: the attempt runs again


@aio
async def test_store_loads_what_it_wrote_and_a_crash_writes_nothing(tmp_path):
    state = V2State(tmp_path)
    a, b = EpisodeId(rollout_id="a", attempt=0), EpisodeId(rollout_id="b", attempt=1)
    await state.keep(a, b'{"r":1}')
    await state.keep(EpisodeId(rollout_id="b", attempt=0), b"{}")
    await state.retire([b])  # b's mark 1 drops its kept attempt 0
    await state.committed("c1", {"phase": "committed"})
    await state.committed("c2", {"phase": "committed"})
    await state.resumed("c2")
    state.close()
    state = V2State(tmp_path)
    loaded = state.load()
    assert loaded.kept == {"a": {0: b'{"r":1}'}}
    assert loaded.marks == {"b": 1} and list(loaded.committed) == ["c1"]
    await state.forget(["a", "b"])
    state.crash()
    with pytest.raises(StateWriteFailed) as info:
        await state.keep(a, b"{}")
    assert info.value.status == 503 and info.value.code == "store_write_failed"
    state.close()
    loaded = V2State(tmp_path).load()
    assert not loaded.kept and not loaded.marks
