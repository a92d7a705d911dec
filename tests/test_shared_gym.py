"""Two training runs (two driver processes, two orchestrators, ``ack="on_seal"``) on one Gym
server, checkpointing at once: neither retires or ACKs the other's attempts (the agent runs once
per row) and both checkpoints commit, the second once the first has resumed."""

from __future__ import annotations

import pytest

from rl_gym_actors.testing import chaos

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_two_runs_on_one_gym_leave_each_other_alone(ray_session, tmp_path):
    row = chaos.two_runs(chaos.Sizes(rows=8, pool=2, per_actor=2, sleep_s=0.5), tmp_path)
    assert (row.rows, row.sealed, row.failed_reason) == (16, 16, 0), row
    assert row.committed is True, row  # both checkpoints
    assert row.extra["touched_other"] == 0  # nothing retired or ACKed as orphan
    assert row.extra["agent_runs"] == row.rows  # no row ran twice
    assert (row.gym_running, row.gym_unacked) == (0, 0)
    assert row.ok
