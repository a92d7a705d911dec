"""A handed-over try is kept (issue 16): a row fails while the Gym server's disk is full (its
store write fails, so ``/run`` answers 503 although the run completed) and its try is handed to
the ledger unsettled. Before, once the disk healed the next checkpoint ACKed that finished run
as an orphan and the row's next dispatch ran the agent again. Now the gate adopts it (replays
``/run`` for the same key) before anything is ACKed, the orchestrator keeps it and writes it
into the checkpoint part's ``undelivered``, and the row's next dispatch gets it: 1 agent run."""

from __future__ import annotations

import json

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import wait_for
from rl_gym_actors.testing.store_faults import FaultyStore

pytestmark = [pytest.mark.slow, pytest.mark.ray]

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)


def test_a_try_handed_over_on_a_full_disk_is_kept(ray_session, tmp_path):
    agent = CountingAgent()
    with (
        GymServerThread(
            agent=agent, state_dir=tmp_path / "state", store_factory=FaultyStore
        ) as gym,
        Orchestrator(
            [gym.endpoint], policy=POLICY, pool_size=1, rollouts_per_actor=4, progress=False
        ) as orch,
    ):
        store = gym.participant.store
        row = {"_ng_rollout_id": "hk-0", "reward": 0.5}
        store.fail_always()
        [failed] = orch.run_batch([row])
        assert failed.status != "sealed" and failed.reward is None
        assert agent.runs_of("hk-0") == 1
        store.heal()

        def stored() -> bool:  # the disk works again and Gym holds the finished run
            return not store.broken and gym.participant.core.report().completed_unacknowledged == 1

        wait_for(stored, what="the handed-over run to be stored")
        report = orch.checkpoint("hk-ck-1", str(tmp_path / "ck1"), deadline_s=30)
        assert report.orphans_acked == 0 and report.sealed_acked == 1
        assert [(o.rollout_id, o.attempt_index, o.reward) for o in report.kept] == [
            ("hk-0", failed.attempt_index, 0.5)
        ]
        part = json.loads((tmp_path / "ck1" / "rl_gym_actors" / "part.json").read_text())
        assert [o["rollout_id"] for o in part["undelivered"]] == ["hk-0"]
        [again] = orch.run_batch([row])
        assert again.status == "sealed" and again.reward == 0.5
        assert agent.runs_of("hk-0") == 1  # answered from the kept result, no agent run
        orch.checkpoint("hk-ck-2", str(tmp_path / "ck2"), deadline_s=30)
        assert gym.participant.core.report().completed_unacknowledged == 0
        snap = orch.snapshot()
        assert snap.ledger.checkpoints_committed == 2 and snap.ledger.checkpoints_failed == 0
        assert snap.ledger.orphans_acked == 0
    assert agent.runs_of("hk-0") == 1  # 1 agent run for the row in total
