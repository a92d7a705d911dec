"""A trainer SIGKILLed inside its own checkpoint costs the next one nothing (the agent-checkpoint
server here, v2 in tests/test_killed_checkpoint_v2.py; the steps: killed_checkpoint_steps.py).

A driver process (with its own local Ray) checkpoints ``step-1`` and is killed in it: during
prepare (a slow row holds it) or between its ACK / prepare and its commit (the server holds the
commit call, :mod:`rl_gym_actors.testing.hold`). Gym is left holding ``step-1``: admission
closed, on a server with no lease (agent-checkpoint, as a real Gym) or a 600 s one (v2). A new
trainer restored from that checkpoint's directory (whose part names ``step-1``) resumes it at
start: Gym takes work within 5 s of the start, the rows sent again come back from the part
(none rerun), and its first checkpoint commits at once. A trainer of another run leaves
``step-1`` alone, and its checkpoint fails naming it."""

from __future__ import annotations

import time

import pytest
from killed_checkpoint_steps import POLICY, RUN, kill_in_checkpoint, restart_and_check, soon

from rl_gym_actors.checkpoint_part import own_open_ids, write_part
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.hold import HoldCalls


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("at", ["prepare", "commit"])
async def test_agent_checkpoint_a_trainer_killed_in_its_checkpoint(
    ray_session, tmp_path, monkeypatch, at
):
    hold = HoldCalls("/commit", armed=at == "commit", limit=1)  # the dead one's, never done
    with GymServerThread(token="test-token", extensions=[hold.extension()]) as server:
        server.hold = hold
        endpoint = GymEndpoint(url=server.url, token=server.token)
        try:
            async with GymClient(endpoint) as client:
                await kill_in_checkpoint(server, client, str(tmp_path / "step-1"), v2=False, at=at)
                if at == "prepare":
                    await another_run_leaves_it(endpoint, tmp_path)
                await restart_and_check(server, client, endpoint, tmp_path, monkeypatch, v2=False)
                status = await client.status("probe-end", deadline_ts=soon())
                assert status.running == 0 and status.completed_unacknowledged == 0
        finally:
            hold.release()


async def another_run_leaves_it(endpoint: GymEndpoint, tmp_path) -> None:
    """A trainer of another run does not resume ``step-1``: its checkpoint fails naming it."""
    from rl_gym_actors.orchestrator import Orchestrator

    async with Orchestrator(
        [endpoint], policy=POLICY, pool_size=1, run_id="other-run", progress=False, start=False
    ) as other:
        await other.astart()
        with pytest.raises(CheckpointFailed) as failed:
            await other.acheckpoint("other-1", str(tmp_path / "other-1"), deadline_s=2.0)
    (entry,) = failed.value.blockers.values()
    assert isinstance(entry, dict) and entry.get("active_checkpoint_id") == "step-1", entry


def test_own_open_ids_names_newer_parts_of_the_run_beside_the_restored_one(tmp_path):
    """A trainer restoring from its last committed checkpoint (``step-1``) learns the id of the
    one it was killed in (``step-2``, whose part was written later beside it); another run's
    part and an older one of its own are not named."""
    import os

    def part(name: str, run_id: str, mtime: float) -> str:
        d = tmp_path / name
        write_part(
            d, run_id=run_id, checkpoint_id=name, handed=[], undelivered=[], sealed=SealedIds()
        )
        os.utime(d / "rl_gym_actors" / "part.json", (mtime, mtime))
        return str(d)

    now = time.time()
    part("step-0", RUN, now - 30)
    restored = part("step-1", RUN, now - 20)
    part("step-2", RUN, now - 10)
    part("theirs-9", "other-run", now - 5)
    (tmp_path / "junk").mkdir()
    assert own_open_ids(restored, RUN, "step-1") == ["step-1", "step-2"]
