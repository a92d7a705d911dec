"""The layer's part of a checkpoint and ``restore_from`` (issue 16), on real processes.

A trainer (a driver subprocess with its own local Ray) runs 12 rows, then checkpoints: the gate
ACKs every result (Gym releases them), then Gym refuses the commit (its dir is outside the
server's --checkpoint-root): the window between the ACKs and a commit. The trainer is SIGKILLed
there, with its Ray. Restarted (a new driver, on the suite's Ray) with ``restore_from=`` that dir
(its part was written before any ACK) and sent the same 12 rows: 0 failed or missing, all 12
``repeated`` with their rewards, 0 agent reruns, and the next checkpoint commits. Before: 12 of
12 ``forgotten_rollout``. With ``ack="on_seal"`` (Gym released each result at its seal) the
same."""

from __future__ import annotations

import pytest

from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.inspect_gym import key_state_sync
from rl_gym_actors.testing.polling import scaled, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = 12


def _driver(
    gym, run_id: str, checkpoint_id: str, checkpoint_dir, *extra: str, ray_address=None
) -> DriverProcess:
    return DriverProcess(
        [
            "--url",
            gym.url,
            "--token",
            gym.token,
            "--run-id",
            run_id,
            "--rows",
            str(ROWS),
            "--checkpoint-id",
            checkpoint_id,
            "--checkpoint-dir",
            str(checkpoint_dir),
            "--deadline-s",
            "30",
            *extra,
        ],
        ray_address=ray_address,
    )


@pytest.mark.parametrize("ack", ["at_checkpoint", "on_seal"])
def test_a_trainer_killed_between_the_acks_and_the_commit_restores_every_row(
    ray_session, tmp_path, ack
):
    root = tmp_path / "gym-root"
    root.mkdir()
    agent = CountingAgent()
    outside = tmp_path / "trainer" / "step-1"  # the trainer's dir: Gym may not commit there
    run = f"rs-{ack.replace('_', '')}"
    with GymServerThread(agent=agent, args=["--checkpoint-root", str(root)]) as gym:
        first = _driver(gym, run, "ck-1", outside, "--ack", ack, "--hold-after-s", "600")
        try:
            batch = first.wait_for("batch", 180)
            assert (batch["sealed"], batch["failed"]) == (ROWS, 0)
            done = first.wait_for("checkpoint", 120)
            assert done["committed"] is False and "commit failed" in done["error"], done
            first.wait_for("holding", 30)
            # Gym released every result: ACKed, never committed
            ids = [f"{run}-row-{i}" for i in range(ROWS)]
            assert {key_state_sync(gym.endpoint, r, 0) for r in ids} == {"acknowledged"}
        finally:
            pids = first.kill()
        wait_for(lambda: not any(alive(p) for p in pids), timeout_s=30, what="trainer gone")
        assert (outside / "rl_gym_actors" / "part.json").is_file()

        # the new trainer joins the suite's Ray (one Ray start fewer: ~10-20 s at load); the
        # killed one had a Ray of its own, killed with it
        second = _driver(
            gym,
            run,
            "ck-2",
            root / "step-2",
            "--ack",
            ack,
            "--restore-from",
            str(outside),
            ray_address=ray_session.get_runtime_context().gcs_address,
        )
        try:
            again = second.wait_for("batch", 180)
            done = second.wait_for("checkpoint", 120)
            second.wait(scaled(60))  # its orchestrator closed: nothing of it left in the Ray
        finally:
            second.kill()
        assert (again["sealed"], again["failed"]) == (ROWS, 0), again
        assert again["repeated"] == ROWS and again["rewards"] == batch["rewards"]
        assert done["committed"] is True, done
        assert all(agent.runs_of(r) == 1 for r in ids)  # 0 agent reruns
