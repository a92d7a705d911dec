"""A real Gym's failures told apart, against the real-Gym stand-in (testing/real_gym.py) in front
of our server: an agent that raises answers a 500 (its exception's repr as a JSON string, or plain
text) and is an ``AgentFailed`` carrying that text, never a lost connection; the orchestrator
retires each such try and tries again within ``max_tries``, each try running the agent once; a
try that a real Gym lists as ``park_requested`` during a prepare is waited for as running."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.errors import AgentFailed
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import soon
from rl_gym_actors.testing.real_gym import RealGymStandIn

pytestmark = pytest.mark.slow  # Ray end to end: `make test` runs it

AGENT_TEXT = "the row asked the simulated agent to fail"  # what the agent raises


@pytest.fixture
def agent():
    return CountingAgent()


@pytest.fixture
def server(agent):
    with GymServerThread(agent=agent, token="test-token") as srv:
        yield srv


@pytest.mark.parametrize("mode", ["repr", "plain"])
async def test_a_raising_agent_is_agent_failed_with_its_text_never_connection_lost(
    server, agent, mode
):
    with RealGymStandIn(server.endpoint, agent_error=mode) as real:
        async with GymClient(real.endpoint) as client:
            with pytest.raises(AgentFailed) as info:
                await client.run(
                    {"fail": True},
                    rollout_id=f"raise-{mode}",
                    attempt_index=0,
                    deadline_ts=soon(10),
                )
            assert info.value.status == 500 and real.agent_failures == 1
            if mode == "repr":
                assert AGENT_TEXT in info.value.detail
            else:
                assert info.value.detail == "Internal Server Error"
            # retire confirms it did not complete (a real Gym stored nothing for it)
            answer = await client.retire(
                f"raise-{mode}", 0, checkpoint_id="probe-raise", deadline_ts=soon(10)
            )
            assert not answer.completed_unacknowledged
    assert agent.starts[(f"raise-{mode}", 0)] == 1


@pytest.mark.ray
def test_the_orchestrator_retries_an_agent_failure_within_max_tries(ray_session, server, agent):
    from rl_gym_actors.orchestrator import Orchestrator

    policy = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    with (
        RealGymStandIn(server.endpoint) as real,
        Orchestrator(
            [real.endpoint], policy=policy, pool_size=1, rollouts_per_actor=2, progress=False
        ) as orch,
    ):
        bad, good = orch.run_batch(
            [
                {"_ng_rollout_id": "rg-bad", "fail": True},
                {"_ng_rollout_id": "rg-good", "reward": 0.25},
            ]
        )
        assert bad.status == "failed" and bad.failure is FailureKind.AGENT_FAILED
        assert bad.tries == 2 and AGENT_TEXT in bad.reason
        assert good.status == "sealed" and good.reward == 0.25
        # each try ran the agent once: a 500 is not a lost reply to replay or rerun
        assert agent.starts[("rg-bad", 0)] == 1 and agent.starts[("rg-bad", 1)] == 1
        assert agent.runs_of("rg-bad") == 2 and real.agent_failures == 2


@pytest.mark.ray
def test_a_forgotten_run_listed_as_park_requested_is_retired(ray_session, server, agent, tmp_path):
    """With live owners the gate defers runs the book never heard of until its first prepare
    has closed admission; from then on a real Gym lists them as park_requested. Read as running,
    the forgotten one is retired and the checkpoint commits (left out, it would block until the
    deadline)."""
    from rl_gym_actors.errors import GymUnavailable
    from rl_gym_actors.orchestrator import Orchestrator

    policy = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=1, control_s=5.0)
    with (
        RealGymStandIn(server.endpoint) as real,
        Orchestrator(
            [real.endpoint], policy=policy, pool_size=1, run_id="rg", progress=False
        ) as orch,
    ):  # rg-*: this run's, not a foreign one

        async def walk_away() -> None:
            async with GymClient(real.endpoint) as client:
                with pytest.raises(GymUnavailable):
                    await client.run(
                        {"sleep_s": 60},
                        rollout_id="rg-forgotten",
                        attempt_index=0,
                        deadline_ts=time.time() + 0.5,
                    )

        asyncio.run(walk_away())
        assert agent.starts[("rg-forgotten", 0)] == 1
        report = orch.checkpoint("rg-park", str(tmp_path / "ck"), deadline_s=20)
        assert report.retired == 1 and report.endpoints[0].prepare_rounds >= 2
    assert ("rg-forgotten", 0) in agent.cancelled
