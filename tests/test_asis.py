"""The as-is baseline (rl_gym_actors.testing.asis) on a real server shows why it is only a baseline:
one lost reply leaves an un-ACKed attempt that blocks every later prepare."""

from __future__ import annotations

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.testing.asis import AsIsRunner
from rl_gym_actors.testing.gym_process import GymServerThread

POLICY = TryPolicy(rollout_s=5.0, receipt_s=0.3, max_tries=2, control_s=5.0)


@pytest.fixture()
def gym():
    with GymServerThread(token="test-token", allow_faults=True) as server:
        yield server


async def test_one_dropped_reply_blocks_every_checkpoint(gym, tmp_path):
    async with AsIsRunner([gym.endpoint], POLICY, concurrency=4) as runner:
        rows = [
            {"_ng_rollout_id": "rD", "reward": 0.5, "drop_reply": True},
            {"_ng_rollout_id": "rOK", "reward": 1.0},
        ]
        outcomes = await runner.run_batch(rows)

        dropped, ok = outcomes
        # the as-is loop got its reward one try late: try 0's reply was lost, try 1 reran it
        assert (dropped.status, dropped.attempt_index, dropped.reward) == ("sealed", 1, 0.5)
        assert (ok.status, ok.attempt_index, ok.acked) == ("sealed", 0, True)
        assert runner.stats.tries_given_up["run"] == 1

        for n in range(2):  # not once: every later checkpoint is blocked by the same try
            ckpt = await runner.checkpoint(f"c{n}", str(tmp_path / f"c{n}"), prepare_s=0.3)
            assert ckpt.blocked
            report = ckpt.reports[gym.endpoint.url]
            assert report.completed_unacknowledged == 1
            assert [a.key for a in report.completed_unacknowledged_attempts] == [("rD", 0)]
        assert runner.stats.checkpoints_committed == 0

    truth = gym.participant.snapshot()
    assert truth["agent_starts"] == 3  # rD twice (finished work rerun), rOK once
    assert truth["completed_unacknowledged"] == 1
    assert truth["acknowledged"] == 2


async def test_receipt_timeout_leaves_try_behind_and_prepare_409(gym, tmp_path):
    async with AsIsRunner([gym.endpoint], POLICY, concurrency=4) as runner:
        [out] = await runner.run_batch([{"_ng_rollout_id": "rR", "receipt_delay_s": 1.0}])
        assert (out.status, out.attempt_index) == ("sealed", 1)
        assert runner.stats.tries_given_up["receipt"] == 1
        ckpt = await runner.checkpoint("c-r", str(tmp_path / "c"), prepare_s=0.3)
        assert ckpt.blocked
        assert ckpt.reports[gym.endpoint.url].completed_unacknowledged_attempts[0].key == ("rR", 0)
