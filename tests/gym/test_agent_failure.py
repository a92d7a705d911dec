"""What an agent's exception means (pure): data unless it is infrastructure, as README's table
("When an agent fails a row") says, with the cause chain read and an explicit class winning."""

from __future__ import annotations

import aiohttp
import pytest

from rl_gym_actors.errors import AgentDataError, AgentDataFailed, AgentFailed, AgentTransientError
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_failure import agent_failure, is_transient
from rl_gym_actors.gym.agents import SimulatedAgentError, UpstreamAgentError


def chained(outer: BaseException, cause: BaseException) -> BaseException:
    try:
        raise outer from cause
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (AgentDataError("bad"), False),
        (SimulatedAgentError("fail"), False),
        (ValueError("x"), False),
        (KeyError("x"), False),
        (RuntimeError("x"), False),
        (UpstreamAgentError("u", status=400), False),
        (UpstreamAgentError("no JSON"), False),
        (AgentTransientError("busy"), True),
        (TimeoutError("t"), True),
        (ConnectionResetError("c"), True),
        (aiohttp.ServerDisconnectedError(), True),
        (UpstreamAgentError("u", status=503), True),
        (UpstreamAgentError("u", status=429), True),
        (chained(ValueError("x"), TimeoutError("t")), True),
        (chained(AgentDataError("x"), TimeoutError("t")), False),  # explicit data wins
    ],
)
def test_an_agents_exception_is_data_unless_it_is_infrastructure(exc, transient):
    assert is_transient(exc) is transient
    answer = agent_failure(exc)
    if transient:
        assert isinstance(answer, AgentFailed) and answer.status == 500
        assert (
            failure_kind(answer) is FailureKind.AGENT_FAILED and failure_kind(answer).is_transport
        )
    else:
        assert isinstance(answer, AgentDataFailed) and answer.status == 422
        assert failure_kind(answer) is FailureKind.AGENT_DATA and failure_kind(answer).is_data
        assert not failure_kind(answer).may_pass


def test_a_cause_chain_that_loops_ends():
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert is_transient(a) is False
