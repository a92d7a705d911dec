"""Issue 17, the seed's failure through the drop-in: NeMo RL main's rows carry no rollout id, so
the drop-in derives one (run id + call counter + _rowidx + row digest) and keeps run id and
counter in its part of the checkpoint. A trainer killed mid-batch and restored from its last
checkpoint sends the same rows again: the results its dead instance left on Gym are adopted
(0 agent reruns), the next checkpoint commits and nothing stays un-ACKed on Gym. Read with NeMo
RL main's consumer (3-tuples, the default shape without NeMo RL installed)."""

from __future__ import annotations

import time

import pytest
from test_nemo_rl_dropin import stand_in_tokenizer

from rl_gym_actors.integrations.nemo_rl import use_in_nemo_rl
from rl_gym_actors.testing import nemo_rl_stand_in
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture
def nemo_gym_module(monkeypatch):
    monkeypatch.setattr(nemo_rl_stand_in, "NemoGym", nemo_rl_stand_in.NemoGym)
    use_in_nemo_rl(nemo_rl_stand_in)
    return nemo_rl_stand_in


def batch(step: int) -> list[dict]:
    rows = [{"reward": 0.25 * (i % 4), "sleep_s": 0.1, "step": step} for i in range(8)]
    return nemo_rl_stand_in.prepare_rows(rows)


def checkpoint(ray, actor, cid: str, where) -> None:
    deadline = time.time() + 60
    ray.get(actor.prepare_checkpoint.remote(cid, deadline))
    ray.get(actor.commit_checkpoint.remote(cid, deadline, str(where)))
    ray.get(actor.resume_checkpoint.remote(cid, deadline))


def test_a_killed_trainer_restored_gets_its_finished_rows_without_a_rerun(
    ray_session, nemo_gym_module, tmp_path
):
    agent = CountingAgent()
    with GymServerThread(agent=agent, token="t", state_dir=tmp_path / "gym") as gym:
        env_configs = {
            "nemo_gym": {
                "rl_gym_actors": {
                    "endpoints": [{"url": gym.url, "token": gym.token, "name": "math"}],
                    "pool": {"size": 1, "rollouts_per_actor": 8},
                    "policy": {"rollout_s": 30, "receipt_s": 5, "max_tries": 1},
                    "untrained_replies": "tokenize",
                    "run_id": "trainer",
                }
            }
        }

        def spinup():
            return nemo_gym_module.spinup_nemo_gym_actor(
                env_configs, ["http://127.0.0.1:9/v1"], "policy", tokenizer=stand_in_tokenizer()
            )

        dead = spinup()
        checkpoint(ray_session, dead, "step-0", tmp_path / "step-0")
        rows = batch(1)
        stream = dead.run_rollouts.options(num_returns="streaming").remote(rows, "gym")
        got = nemo_gym_module.consume(ray_session, stream, rows=8, limit=5)
        assert len(got) == 5
        wait_for(lambda: len(agent.finished) == 8, timeout_s=30, what="all 8 runs finished")
        ray_session.kill(dead)  # the trainer dies before its next checkpoint
        runs = sum(agent.starts.values())
        assert runs == 8

        alive = spinup()
        try:
            deadline = time.time() + 60
            ray_session.get(
                alive.restore_checkpoint.remote("restore-1", deadline, str(tmp_path / "step-0"))
            )
            ray_session.get(alive.resume_checkpoint.remote("restore-1", deadline))
            again = batch(1)
            stream = alive.run_rollouts.options(num_returns="streaming").remote(again, "gym")
            got = nemo_gym_module.consume(ray_session, stream, rows=8)
            assert sorted(got) == list(range(8))
            assert sum(agent.starts.values()) == runs  # 0 finished rows rerun
            checkpoint(ray_session, alive, "step-1", tmp_path / "step-1")  # commits
            assert gym.participant.snapshot()["completed_unacknowledged"] == 0
        finally:
            ray_session.get(alive.shutdown.remote())
            ray_session.kill(alive)
