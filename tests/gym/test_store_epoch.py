"""(ext) Gym's memory, the server side (issue 16): our server's ``GET .../lease`` reports an
``instance_id`` (new per process start) and a ``store_epoch`` (written once into a fresh
``--state-dir``; without one, the instance id). A client remembers the first epoch it saw and
reports a change; a server restarted on the same state dir keeps its epoch."""

from __future__ import annotations

import time

from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.agent_checkpoint.participant import Participant
from rl_gym_actors.gym.agents import make_agent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.real_gym import RealGymStandIn


async def _epoch_change(client: GymClient) -> tuple[str, str] | None:
    return await client.epoch_change(deadline_ts=time.time() + 5.0)


async def test_the_store_epoch_outlives_a_restart_on_the_same_dir_only(tmp_path) -> None:
    with GymServerThread(state_dir=tmp_path / "a") as gym:
        async with GymClient(gym.endpoint) as client:
            assert await _epoch_change(client) is None  # the first one seen
            first = client._epoch
            assert first is not None and len(first) == 32
            gym.stop()
            gym.start()  # the same dir: the same epoch
            assert await _epoch_change(client) is None
            assert client._epoch == first
            gym.stop()
            gym.state_dir = str(tmp_path / "b")  # an empty dir: a new epoch
            gym.start()
            change = await _epoch_change(client)
            assert change is not None and change[0] == first and change[1] != first
            assert await _epoch_change(client) is None  # the new one is remembered


async def test_without_a_state_dir_the_epoch_is_the_instance_id() -> None:
    participant = Participant(make_agent("simulated"))
    assert participant.store_epoch == participant.instance_id
    with GymServerThread() as gym:  # no state dir: in memory
        async with GymClient(gym.endpoint) as client:
            assert await _epoch_change(client) is None
            first = client._epoch
            gym.stop()
            gym.start()  # in memory, every start forgets
            change = await _epoch_change(client)
            assert change is not None and change[0] == first


async def test_a_real_gym_reports_no_epoch_and_is_not_checked(tmp_path) -> None:
    with (
        GymServerThread(state_dir=tmp_path / "a") as gym,
        RealGymStandIn(gym.endpoint) as real,
    ):
        async with GymClient(real.endpoint) as client:
            assert await _epoch_change(client) is None
            assert client._epoch is None
