"""A Gym server served in a thread of its own says so when it stops serving without being asked
(nobody joins a daemon thread: before, a test's server that went away showed only as
ECONNREFUSED in its clients), and says nothing when it is stopped."""

from __future__ import annotations

import logging

from rl_gym_actors.gym.agent_checkpoint.participant import Participant
from rl_gym_actors.gym.agents import make_agent
from rl_gym_actors.gym.server import GymServer


def _served() -> GymServer:
    return GymServer(Participant(make_agent("simulated")), token="test-token", graceful_s=1.0)


def test_a_server_thread_that_stops_unasked_logs_an_error(caplog):
    server = _served()
    thread = server.serve_in_thread(10.0)
    with caplog.at_level(logging.ERROR, logger="rl_gym_actors.gym.server"):
        assert server._uvicorn is not None
        server._uvicorn.should_exit = True  # as uvicorn itself ends its loop, not stop()
        thread.join(10.0)
    assert not thread.is_alive()
    assert [r.getMessage() for r in caplog.records] == [
        f"the Gym server on {server.url} stopped serving unasked"
    ]


def test_a_stopped_server_thread_logs_nothing(caplog):
    server = _served()
    thread = server.serve_in_thread(10.0)
    with caplog.at_level(logging.ERROR, logger="rl_gym_actors.gym.server"):
        server.stop()
        thread.join(10.0)
    assert not thread.is_alive()
    assert caplog.records == []
