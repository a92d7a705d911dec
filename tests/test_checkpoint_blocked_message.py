"""A checkpoint blocked by what another run left un-ACKed names the cause in its message (from
``e.blockers``): how many attempts, in which state, whose, and the way out."""

from __future__ import annotations

import pickle

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.testing.gym_process import GymServerThread

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)


def test_the_message_says_what_the_blockers_say_and_survives_pickling():
    err = CheckpointFailed(
        "checkpoint c failed on 1 of 1 endpoint(s): http://g: DeadlineExceeded: ...",
        checkpoint_id="c",
        blockers={
            "http://g": {
                "endpoint": "http://g",
                "active_checkpoint_id": "dead-ck",
                "attempts": [
                    {
                        "rollout_id": "a-1",
                        "attempt_index": 0,
                        "state": "completed",
                        "foreign": True,
                    },
                    {
                        "rollout_id": "a-2",
                        "attempt_index": 0,
                        "state": "completed",
                        "foreign": True,
                    },
                    {"rollout_id": "mine", "attempt_index": 0, "state": "running"},
                ],
            }
        },
    )
    text = str(err)
    assert "checkpoint dead-ck holds the server" in text
    assert "3 attempts (2 completed, 1 running, 2 of them another run's)" in text
    assert "sweep_foreign=True" in text
    assert str(pickle.loads(pickle.dumps(err))) == text
    assert str(CheckpointFailed("plain", blockers={"x": {"endpoint": "x"}})) == "plain"


@pytest.mark.slow  # Ray end to end: `make test` runs it
@pytest.mark.ray
def test_a_checkpoint_blocked_by_another_runs_held_results_says_so(ray_session, tmp_path):
    with GymServerThread(token="t") as gym:
        with Orchestrator([gym.endpoint], policy=POLICY, pool_size=1, run_id="holder",
                          progress=False) as a:  # fmt: skip
            assert [o.status for o in a.run_batch([{"reward": 1.0}] * 3)] == ["sealed"] * 3
        # "holder" closed with its 3 results held un-ACKed (ack="at_checkpoint")
        other = Orchestrator(
            [gym.endpoint], policy=POLICY, pool_size=1, run_id="other", progress=False
        )
        with other as b, pytest.raises(CheckpointFailed) as info:
            b.checkpoint("other-ck", str(tmp_path / "ck"), deadline_s=3.0)
    text = str(info.value)
    assert "3 attempts (3 completed, 3 of them another run's)" in text, text
    assert "sweep_foreign=True" in text and gym.url in text
