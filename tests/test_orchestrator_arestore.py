"""``Orchestrator.arestore`` (and ``restore``, its sync form): a started orchestrator of the same
run loads a checkpoint's part (what the NeMo RL drop-in's ``restore_checkpoint`` does after
spin-up): rows sent again are answered ``repeated`` with their rewards and never run again;
another run's part is refused."""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.errors import ConfigError

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)


def test_a_started_orchestrator_restores_a_part_and_answers_sealed_rows_repeated(
    ray_session, gym, agent, tmp_path
):
    rows = [{"_ng_rollout_id": f"ar-{i}", "reward": 0.25 * i} for i in range(3)]
    with Orchestrator(
        [gym.endpoint],
        policy=POLICY,
        pool_size=1,
        rollouts_per_actor=4,
        run_id="ar",
        progress=False,
    ) as first:
        assert [o.status for o in first.run_batch(rows)] == ["sealed"] * 3
        first.checkpoint("ar-ck-1", str(tmp_path / "ck1"), deadline_s=30)
    with (
        Orchestrator(
            [gym.endpoint],
            policy=POLICY,
            pool_size=1,
            rollouts_per_actor=4,
            run_id="other",
            progress=False,
        ) as stranger,
        pytest.raises(ConfigError),
    ):
        stranger.restore(tmp_path / "ck1")  # the sync form
    with Orchestrator(
        [gym.endpoint],
        policy=POLICY,
        pool_size=1,
        rollouts_per_actor=4,
        run_id="ar",
        progress=False,
    ) as second:
        asyncio.run(second.arestore(tmp_path / "ck1"))
        again = second.run_batch(rows)
    assert [(o.status, o.repeated) for o in again] == [("sealed", True)] * 3
    assert [o.reward for o in again] == [0.0, 0.25, 0.5]
    assert all(agent.runs_of(f"ar-{i}") == 1 for i in range(3))
