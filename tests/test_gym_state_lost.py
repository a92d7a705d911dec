"""Gym's memory is checked, not assumed (issue 16). A Gym server restarted on an empty state dir
mid-run forgot the 8 sealed results it held (not yet ACKed): before, the next checkpoint
committed without a word and re-sent rows ran again. Now the checkpoint raises GymStateLost
naming the endpoint and the count, ACKs nothing, and the one after commits; every row sent
again is answered without an agent run (held results ``repeated``, committed ones
``forgotten_rollout``): 0 ids counted twice."""

from __future__ import annotations

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.errors import CheckpointFailed, GymStateLost
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerProcess, GymServerThread

pytestmark = [pytest.mark.slow, pytest.mark.ray]

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)


def test_a_gym_restarted_on_an_empty_state_dir_raises_gym_state_lost(ray_session, tmp_path):
    agent = CountingAgent()
    with (
        GymServerThread(agent=agent, state_dir=tmp_path / "state-1") as gym,
        Orchestrator(
            [gym.endpoint], policy=POLICY, pool_size=1, rollouts_per_actor=8, progress=False
        ) as orch,
    ):
        committed = [{"_ng_rollout_id": f"gl-a-{i}", "reward": 0.25} for i in range(8)]
        held = [{"_ng_rollout_id": f"gl-b-{i}", "reward": 0.75} for i in range(8)]
        assert [o.status for o in orch.run_batch(committed)] == ["sealed"] * 8
        orch.checkpoint("gl-ck-1", str(tmp_path / "ck1"), deadline_s=30)
        first = orch.run_batch(held)
        assert [o.status for o in first] == ["sealed"] * 8
        gym.stop()
        gym.state_dir = str(tmp_path / "state-2")  # a fresh, empty state dir
        gym.start()
        with pytest.raises(GymStateLost) as info:
            orch.checkpoint("gl-ck-2", str(tmp_path / "ck2"), deadline_s=30)
        assert isinstance(info.value, CheckpointFailed)
        assert list(info.value.lost.values()) == [8]
        assert "lost" in str(info.value) and gym.url in str(info.value)
        # the trainer has the held results: re-sent, they come back, no agent run
        again = orch.run_batch(held)
        assert all(o.status == "sealed" and o.repeated for o in again)
        assert [o.reward for o in again] == [o.reward for o in first]
        late = orch.run_batch(committed)
        assert [o.failure for o in late] == [FailureKind.FORGOTTEN] * 8
        report = orch.checkpoint("gl-ck-3", str(tmp_path / "ck3"), deadline_s=30)
        assert report.sealed_acked == 0
        snap = orch.snapshot()
        assert snap.ledger.checkpoints_committed == 2 and snap.ledger.checkpoints_failed == 1
    # every id ran exactly once, across both servers
    assert all(agent.runs_of(r["_ng_rollout_id"]) == 1 for r in committed + held)


def test_a_gym_serve_that_forgot_its_state_is_named_even_holding_nothing(ray_session, tmp_path):
    """(ext) store epoch: ``gym serve`` restarted between two checkpoints with nothing held. On
    the same state dir: the next checkpoint commits. On an empty one: GymStateLost names the
    server (0 results lost: the book had nothing there, the server forgot what it held)."""
    gym = GymServerProcess(state_dir=tmp_path / "state-1")
    with (
        gym,
        Orchestrator(
            [gym.endpoint], policy=POLICY, pool_size=1, rollouts_per_actor=4, progress=False
        ) as orch,
    ):
        rows = [{"_ng_rollout_id": f"ge-{i}", "reward": 0.5} for i in range(4)]
        assert [o.status for o in orch.run_batch(rows)] == ["sealed"] * 4
        orch.checkpoint("ge-ck-1", str(tmp_path / "ck1"), deadline_s=30)
        gym.stop()
        gym.start()  # the same state dir: it remembers
        orch.checkpoint("ge-ck-2", str(tmp_path / "ck2"), deadline_s=30)
        gym.stop()
        gym.state_dir = str(tmp_path / "state-2")  # a fresh, empty state dir
        gym.start()
        with pytest.raises(GymStateLost) as info:
            orch.checkpoint("ge-ck-3", str(tmp_path / "ck3"), deadline_s=30)
        assert list(info.value.lost.values()) == [0]
        (before, after), *_ = info.value.epochs.values()
        assert before != after
        assert gym.url in str(info.value) and "store epoch changed" in str(info.value)
        orch.checkpoint("ge-ck-4", str(tmp_path / "ck4"), deadline_s=30)  # the new one stands
        snap = orch.snapshot()
        assert snap.ledger.checkpoints_committed == 3 and snap.ledger.checkpoints_failed == 1
