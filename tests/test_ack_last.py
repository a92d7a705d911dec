"""ACK last (issue 16): a checkpoint ACKs nothing until every endpoint is ready but for the
results it releases. A checkpoint that fails on its deadline (a run still going) left every
sealed result completed and un-ACKed on Gym: a trainer restarting from its last checkpoint gets
them replayed, not ``forgotten_rollout``. Before, round 1 ACKed every sealed result and then
the deadline failed the checkpoint."""

from __future__ import annotations

import threading

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.testing.inspect_gym import key_state_sync
from rl_gym_actors.testing.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ray]

POLICY = TryPolicy(rollout_s=60.0, receipt_s=2.0, max_tries=1, control_s=5.0)


def test_a_checkpoint_that_fails_on_its_deadline_acks_nothing(ray_session, gym, agent, tmp_path):
    with Orchestrator(
        [gym.endpoint], policy=POLICY, pool_size=2, rollouts_per_actor=4, progress=False
    ) as orch:
        fast = [{"_ng_rollout_id": f"al-{i}", "reward": 0.5} for i in range(6)]
        assert [o.status for o in orch.run_batch(fast)] == ["sealed"] * 6
        slow_done: list = []
        slow = threading.Thread(
            target=lambda: slow_done.extend(
                orch.run_batch([{"_ng_rollout_id": "al-slow", "sleep_s": 8.0}])
            )
        )
        slow.start()
        try:
            wait_for(lambda: agent.runs_of("al-slow") == 1, timeout_s=30, what="slow run")
            with pytest.raises(CheckpointFailed):
                orch.checkpoint("al-ck-1", str(tmp_path / "ck1"), deadline_s=2.0)
            # nothing released: every sealed result is still held (completed, un-ACKed)
            states = {key_state_sync(gym.endpoint, r["_ng_rollout_id"], 0) for r in fast}
            assert states == {"completed"}, states
        finally:
            slow.join(60)
        assert [o.status for o in slow_done] == ["sealed"]
        report = orch.checkpoint("al-ck-2", str(tmp_path / "ck2"), deadline_s=30)
        assert report.sealed_acked == 7
        states = {key_state_sync(gym.endpoint, f"al-{i}", 0) for i in range(6)}
        assert states == {"acknowledged"}
        assert all(agent.runs_of(f"al-{i}") == 1 for i in range(6))
