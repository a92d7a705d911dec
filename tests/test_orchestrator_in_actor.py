"""The orchestrator's async API from inside another Ray actor (a trainer that is an actor)."""

from __future__ import annotations

import pytest

from rl_gym_actors.testing.gym_process import GymServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_an_async_ray_actor_runs_a_batch_and_a_checkpoint(ray_session, tmp_path):
    ray = ray_session

    # defined here so that Ray ships the class by value (tests/ is not importable in workers)
    @ray.remote(num_cpus=0)
    class Trainer:
        async def train_step(self, url: str, token: str, ckpt_dir: str):
            from rl_gym_actors import GymEndpoint, Orchestrator, TryPolicy

            policy = TryPolicy(rollout_s=5.0, receipt_s=1.0, max_tries=2, control_s=5.0)
            async with Orchestrator(
                [GymEndpoint(url=url, token=token)],
                policy=policy,
                pool_size=1,
                progress=False,
                start=False,
            ) as orch:
                outs = await orch.arun_batch(
                    [
                        {"_ng_rollout_id": "in-actor-lost", "drop_reply": True, "reward": 0.5},
                        {"_ng_rollout_id": "in-actor-ok", "reward": 0.25},
                    ]
                )
                report = await orch.acheckpoint("in-actor-ck", ckpt_dir, deadline_s=30.0)
                snap = await orch.asnapshot()
            return (
                [(o.status, o.adopted, o.reward) for o in outs],
                report.endpoints[0].commit.records,
                snap.ledger.invariant_ok,
            )

    with GymServerThread() as gym:
        trainer = Trainer.remote()
        try:
            outs, records, balanced = ray.get(
                trainer.train_step.remote(gym.url, gym.token, str(tmp_path)), timeout=120
            )
        finally:
            ray.kill(trainer)
        assert outs == [("sealed", True, 0.5), ("sealed", False, 0.25)]
        assert records == 2 and balanced
        snap = gym.participant.snapshot()
        assert snap["running"] == 0 and snap["completed_unacknowledged"] == 0
