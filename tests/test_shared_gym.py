"""Two training runs (two driver processes, two orchestrators) on one Gym server, checkpointing at
about the same time: neither retires or ACKs the other's attempts (the agent runs once per row)
and both checkpoints commit, the second once the first has resumed."""

from __future__ import annotations

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.testing.driver import DriverProcess
from rl_gym_actors.testing.gym_process import GymServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = 8


def test_two_runs_on_one_gym_leave_each_other_alone(ray_session, tmp_path):
    address = ray_session.get_runtime_context().gcs_address
    ack = ["--ack", "on_seal"] if "ack" in TryPolicy.model_fields else []
    go = tmp_path / "go"
    with GymServerThread(token="test-token") as server:
        drivers = [DriverProcess(["--url", server.url, "--token", server.token, "--run-id", run,
                                  "--rows", str(ROWS), "--sleep-s", "0.5", "--pool", "2",
                                  "--checkpoint-id", f"{run}-step-1", "--checkpoint-dir",
                                  str(tmp_path / run), "--deadline-s", "60",
                                  "--go-file", str(go), *ack], ray_address=address)
                   for run in ("grpo-a", "grpo-b")]
        try:
            for d in drivers:
                d.wait_for("started", 120)
            go.touch()
            batches = [d.wait_for("batch", 120) for d in drivers]
            checkpoints = [d.wait_for("checkpoint", 120) for d in drivers]
        finally:
            for d in drivers:
                d.kill()
        assert [b["sealed"] for b in batches] == [ROWS, ROWS], batches
        assert all(c["committed"] for c in checkpoints), checkpoints
        # neither checkpoint took the other's attempts for its own forgotten ones
        assert [c["retired"] for c in checkpoints] == [0, 0]
        assert [c["orphans_acked"] for c in checkpoints] == [0, 0]
        snap = server.participant.snapshot()
        assert snap["agent_starts"] == 2 * ROWS           # no row ran twice
        assert snap["running"] == 0 and snap["completed_unacknowledged"] == 0
