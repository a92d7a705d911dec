"""The chaos table's rows as tests (benchmarks/chaos.py renders the same scenarios from
:mod:`rl_gym_actors.testing.chaos`). Rows with a test of their own elsewhere:

- Gym dead, Gym frozen: tests/test_endpoint_down.py
- ledger killed mid-batch / mid-checkpoint: tests/test_ledger_restart.py
- driver SIGKILL mid-checkpoint then a new driver: tests/test_driver_killed.py
- two runs on one Gym checkpointing at once: tests/test_shared_gym.py

Here: the rows that have none, each asserting what the table shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rl_gym_actors.testing import chaos

pytestmark = pytest.mark.ray

SMALL = chaos.Sizes(rows=8, pool=2, per_actor=2, sleep_s=0.5)


def assert_row(row: chaos.ChaosRow) -> None:
    assert row.failed_silent == 0, row
    assert row.committed is True, row
    assert (row.gym_running, row.gym_unacked) == (0, 0), row
    assert row.rewards_twice == 0, row
    assert row.ok, row


@pytest.mark.slow
def test_gym_sigkill_and_restart_mid_batch(ray_session, tmp_path):
    row = chaos.gym_restart(SMALL, tmp_path)
    assert row.rows == SMALL.rows and row.sealed + row.failed_reason == SMALL.rows
    assert_row(row)


@pytest.mark.slow
def test_a_rollout_actor_killed_mid_batch(ray_session, tmp_path):
    row = chaos.rollout_actor_killed(SMALL, tmp_path)
    assert row.failed_reason >= 1 and row.sealed + row.failed_reason == SMALL.rows
    assert row.extra["replaced"] >= 1 and row.extra["next_batch_sealed"] == SMALL.rows
    assert_row(row)


@pytest.mark.slow
def test_a_three_node_cluster_losing_a_node(tmp_path):
    # its own Ray cluster: in a process of its own
    code = (
        "import json; from rl_gym_actors.testing import chaos; "
        "row = chaos.node_loss(chaos.Sizes(rows=12, pool=4, per_actor=2), "
        f"__import__('pathlib').Path({str(tmp_path)!r})); "
        "print('ROW ' + json.dumps(row.as_dict()))"
    )
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
    assert lines, out.stderr[-3000:]
    row = chaos.ChaosRow(**json.loads(lines[-1][4:]))
    assert row.extra["lost_actors"] >= 1
    assert row.sealed + row.failed_reason == row.rows
    assert_row(row)
