"""rl_gym_actors.local_gym_server: the README's way to a Gym server of one's own."""

from __future__ import annotations

import asyncio
import os

import pytest

from rl_gym_actors import local_gym_server
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.local_gym import LocalGymError
from rl_gym_actors.testing.polling import soon, wait_for

pytestmark = pytest.mark.slow  # a server process each: a few seconds under load


def test_it_serves_on_loopback_with_its_token_and_stops_at_the_end():
    with local_gym_server() as gym:
        assert gym.url.startswith("http://127.0.0.1:") and gym.token

        async def status() -> str:
            async with GymClient(gym.endpoint) as client:
                return (await client.status("probe", deadline_ts=soon())).state

        assert asyncio.run(status()) == "accepting"
        pid = gym.pid
    assert not gym.log_path.exists()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, what="the server process to exit")


def test_a_server_that_cannot_start_is_a_config_error_naming_why():
    with pytest.raises(LocalGymError) as info, local_gym_server(agent="no_such_module:agent"):
        pass
    assert isinstance(info.value, ConfigError)
    assert "no_such_module" in str(info.value)
