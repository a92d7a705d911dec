"""A trainer's driver SIGKILLed mid-batch, no checkpoint since, restarted with the same rows: with
``ack="at_checkpoint"`` (the default) every run that finished is replayed by Gym, the runs still
going are waited for, nothing runs twice, and every row is sealed once.

The dead driver is a real process (a subprocess joined to the suite's Ray as its own job) killed
with SIGKILL; its rollout actors learn that their driver is gone and dispatch nothing more."""

from __future__ import annotations

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.driver import DriverProcess
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RUN = "dk"
ROWS = 24
SLEEP_S = 1.0
POOL = 3  # the driver runs 2 rollouts per actor: 6 at once
SLOTS = 2 * POOL
ROLLOUT_S = 20.0


def rows() -> list[dict]:
    """The driver's rows (rl_gym_actors.testing.driver), as the trainer sends them again."""
    return [
        {"_ng_rollout_id": f"{RUN}-row-{i}", "reward": 0.5, "sleep_s": SLEEP_S} for i in range(ROWS)
    ]


def test_a_driver_killed_mid_batch_then_restarted_runs_every_row_once(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    agent = CountingAgent()
    with GymServerThread(agent=agent, token="test-token") as gym:
        driver = DriverProcess(
            [
                "--url",
                gym.url,
                "--token",
                gym.token,
                "--run-id",
                RUN,
                "--rows",
                str(ROWS),
                "--sleep-s",
                str(SLEEP_S),
                "--pool",
                str(POOL),
                "--rollout-s",
                str(ROLLOUT_S),
                "--checkpoint-id",
                "never-reached",
                "--checkpoint-dir",
                str(tmp_path / "dead"),
            ],
            ray_address=ray_session.get_runtime_context().gcs_address,
        )
        try:
            driver.wait_for("started")
            # mid-batch: some rows finished on Gym, some still run, the rest never started
            # (past the first wave, whose results ack="on_seal" would have released by now)
            wait_for(
                lambda: len(agent.finished) > SLOTS,
                timeout_s=60,
                what="a second wave of rows to finish",
            )
        finally:
            driver.kill()
        finished_at_kill = len(agent.finished)
        assert 0 < finished_at_kill < ROWS
        status = gym.participant.snapshot()
        assert status["acknowledged"] == 0  # nothing was released with the driver

        policy = TryPolicy(rollout_s=ROLLOUT_S, receipt_s=5.0, max_tries=2, control_s=5.0)
        with Orchestrator(
            [GymEndpoint(url=gym.url, token=gym.token)],
            policy=policy,
            pool_size=POOL,
            rollouts_per_actor=2,
            run_id=RUN,
            progress=False,
        ) as orch:
            outcomes = orch.run_batch(rows())
            assert [o.status for o in outcomes] == ["sealed"] * ROWS
            assert all(
                o.attempt_index == 0 and o.receipt.execution_generation == 1 for o in outcomes
            )
            # the agent ran each row once, across both drivers: finished runs were replayed,
            # the ones still running were waited for, none was rerun
            assert sum(agent.starts.values()) == ROWS
            assert set(agent.starts) == {(f"{RUN}-row-{i}", 0) for i in range(ROWS)}
            assert sum(o.adopted for o in outcomes) >= finished_at_kill
            report = orch.checkpoint("after-restart", str(tmp_path / "ck"), deadline_s=30)
            assert report.sealed_acked == ROWS and report.orphans_acked == 0
        status = gym.participant.snapshot()
        assert status["completed_unacknowledged"] == 0 and status["acknowledged"] == ROWS
