"""tests/test_killed_checkpoint.py's trainer SIGKILLed inside its own checkpoint, on ``gym serve
--protocol v2`` (a 600 s lease): the next trainer, restored from the dead checkpoint's directory,
frees Gym at once, gets its rows from the part (none rerun) and commits; the dead slow row is
retired."""

from __future__ import annotations

import pytest
from killed_checkpoint_steps import kill_in_checkpoint, restart_and_check, soon

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.hold import HoldCalls
from rl_gym_actors.testing.v2_server import V2ServerThread


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("at", ["prepare", "commit"])
async def test_v2_a_trainer_killed_in_its_checkpoint(ray_session, tmp_path, monkeypatch, at):
    hold = HoldCalls("/commit", armed=at == "commit", limit=1)  # the dead one's, never done
    with V2ServerThread(extensions=[hold.extension()]) as server:
        server.hold = hold
        endpoint = GymEndpoint(url=server.url, token=server.token)
        try:
            async with GymClient(endpoint) as client:
                await kill_in_checkpoint(server, client, str(tmp_path / "step-1"), v2=True, at=at)
                await restart_and_check(server, client, endpoint, tmp_path, monkeypatch, v2=True)
                status = await V2Client(client).status(deadline_ts=soon())
                assert status.report.counts["episodes"] == 0  # the dead slow row was retired
        finally:
            hold.release()
