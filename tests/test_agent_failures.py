"""An agent that fails its row, end to end on both protocols: a data failure (``AgentDataError``,
the simulated agent's ``fail``, an unexpected ``ValueError`` or ``KeyError``) fails the row at
once with ``failure.is_data`` and one agent run; a transient one (``AgentTransientError``, a
``TimeoutError``) is tried ``max_tries`` times and fails with ``failure.is_transport``; and the
NeMo RL drop-in's classes follow (data -> ``RolloutDataError``)."""

from __future__ import annotations

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.integrations.nemo_rl.rows import RolloutDataError, failure_class
from rl_gym_actors.testing import failing_agents
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = pytest.mark.slow  # Ray end to end: `make test` runs it

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=3, control_s=5.0)
DATA = ("fails_as_data", "raises_value_error", "raises_key_error")
TRANSIENT = ("fails_transiently", "times_out")


@pytest.mark.ray
@pytest.mark.parametrize("server_cls", [GymServerThread, V2ServerThread], ids=["v1", "v2"])
def test_data_failures_are_terminal_and_transient_ones_are_tried_again(ray_session, server_cls):
    proto = server_cls.__name__[:2].lower()
    with (
        server_cls(agent=failing_agents.by_row, token="test-token") as gym,
        Orchestrator(
            [gym.endpoint], policy=POLICY, pool_size=1, rollouts_per_actor=8, progress=False
        ) as orch,
    ):
        names = (*DATA, *TRANSIENT)
        rows = [{"_ng_rollout_id": f"af-{proto}-{n}", "fails": n} for n in names]
        rows.append({"_ng_rollout_id": f"af-{proto}-ok", "reward": 0.5})
        outcomes = dict(zip((*names, "ok"), orch.run_batch(rows), strict=True))

    assert outcomes["ok"].status == "sealed" and outcomes["ok"].reward == 0.5
    for name in DATA:
        o = outcomes[name]
        assert (o.status, o.failure, o.tries) == ("failed", FailureKind.AGENT_DATA, 1), name
        assert o.failure.is_data and not o.failure.is_transport
        assert failing_agents.CALLS[f"af-{proto}-{name}"] == 1, name  # never run again
        assert failure_class(o.failure) is RolloutDataError
    assert "the task does not parse" in outcomes["fails_as_data"].reason
    assert "ValueError" in outcomes["raises_value_error"].reason
    for name in TRANSIENT:
        o = outcomes[name]
        assert (o.status, o.failure, o.tries) == ("failed", FailureKind.AGENT_FAILED, 3), name
        assert o.failure.is_transport and not o.failure.is_data
        assert failing_agents.CALLS[f"af-{proto}-{name}"] == 3, name


@pytest.mark.ray
def test_the_simulated_agents_fail_row_is_a_data_failure_as_the_readme_says(ray_session):
    with (
        GymServerThread(agent="simulated", token="test-token") as gym,
        Orchestrator([gym.endpoint], policy=POLICY, pool_size=1, progress=False) as orch,
    ):
        (bad,) = orch.run_batch([{"fail": True}])
    assert (bad.status, bad.failure, bad.tries) == ("failed", FailureKind.AGENT_DATA, 1)
    assert bad.failure.is_data and bad.reward is None
