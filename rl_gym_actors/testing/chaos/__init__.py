"""Chaos scenarios: one fault each, on real processes, and what came of it as one row.

Shared by ``benchmarks/chaos.py`` (the table in RESULTS.md) and the tests (``tests/test_chaos.py``
and the issue-9 tests), so that the table and the tests say the same thing. Every scenario takes
a :class:`Sizes` and a scratch directory, needs a local Ray already connected (except
:func:`node_loss`, which makes its own 3-node cluster and so runs in a process of its own), and
returns a :class:`ChaosRow`:

- rows sealed / failed with a reason / failed without one (the last must be 0);
- Gym's running and un-ACKed attempts after the scenario's last checkpoint (both must be 0
  where a checkpoint committed);
- whether the checkpoint that follows the fault committed (``None``: not expected to);
- the time from the fault to recovery (the first committed checkpoint after it, or, where none
  can commit, to the typed failure);
- rewards counted twice: rollout ids handed to the trainer sealed more than once.

``expected`` says what a user expects; ``ok`` whether the row shows it.

Here: :mod:`.common` (sizes, the row, the helpers every scenario uses), :mod:`.gym_faults` (Gym
restarted, dead, frozen; two runs on one Gym), :mod:`.ray_faults` (ledger, rollout actor, driver,
node), :mod:`.durable_faults` (issue 16: Gym's state lost, a partition that heals, a trainer
killed between ACK and commit), and :data:`SCENARIOS` / :func:`run` below.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rl_gym_actors.testing.chaos.common import FULL, QUICK, ChaosRow, Sizes, gym_counts
from rl_gym_actors.testing.chaos.durable_faults import (
    ack_crash_restore,
    clock_skew,
    gym_state_lost,
    partition_heals,
)
from rl_gym_actors.testing.chaos.gym_faults import gym_dead, gym_frozen, gym_restart, two_runs
from rl_gym_actors.testing.chaos.ray_faults import (
    driver_killed,
    ledger_mid_batch,
    ledger_mid_checkpoint,
    node_loss,
    rollout_actor_killed,
)

__all__ = [
    "FULL",
    "NOT_ON_V2",
    "OWN_PROCESS",
    "QUICK",
    "SCENARIOS",
    "ChaosRow",
    "Sizes",
    "ack_crash_restore",
    "clock_skew",
    "driver_killed",
    "gym_counts",
    "gym_dead",
    "gym_frozen",
    "gym_restart",
    "gym_state_lost",
    "ledger_mid_batch",
    "ledger_mid_checkpoint",
    "node_loss",
    "partition_heals",
    "rollout_actor_killed",
    "run",
    "server_has_leases",
    "two_runs",
]


def server_has_leases() -> bool:
    """Whether ``gym serve`` takes ``--checkpoint-lease-s`` (the server side of issue 9)."""
    import contextlib
    import io

    from rl_gym_actors.cli import build_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(["gym", "serve", "--checkpoint-lease-s", "1"])
    except SystemExit:
        return False
    return True


SCENARIOS: dict[str, Callable[[Sizes, Path], ChaosRow]] = {
    "gym_restart": gym_restart,
    "gym_dead": gym_dead,
    "gym_frozen": gym_frozen,
    "ledger_mid_batch": ledger_mid_batch,
    "ledger_mid_checkpoint": ledger_mid_checkpoint,
    "rollout_actor_killed": rollout_actor_killed,
    "driver_killed": driver_killed,
    "driver_killed_lease": lambda sizes, tmp: driver_killed(sizes, tmp, use_lease=True),
    "two_runs": two_runs,
    "node_loss": node_loss,
    "gym_state_lost": gym_state_lost,
    "partition_heals": partition_heals,
    "partition_heals_lease": lambda sizes, tmp: partition_heals(sizes, tmp, lease_s=60.0),
    "ack_crash_restore": ack_crash_restore,
    "clock_ahead_12s": lambda sizes, tmp: clock_skew(sizes, tmp, 12.0),
    "clock_behind_60s": lambda sizes, tmp: clock_skew(sizes, tmp, -60.0),
}
# issue 18: the scenarios that apply to Gym v2, run against ``gym serve --protocol v2`` as well
# (named ``v2_<name>``); the others, and why not
NOT_ON_V2 = {
    "gym_state_lost": "the agent-checkpoint store epoch (GymStateLost) and held receipts; v2 "
    "has no receipts, and its state dir keeps kept replies and marks only",
    "ack_crash_restore": "v2 has no ACK (the crash falls between a checkpoint's ACKs and commit)",
}


def _on_v2(scenario: Callable[[Sizes, Path], ChaosRow]) -> Callable[[Sizes, Path], ChaosRow]:
    def run_on_v2(sizes: Sizes, tmp: Path) -> ChaosRow:
        row = scenario(replace(sizes, protocol="v2"), tmp)
        row.scenario = f"v2: {row.scenario}"
        return row

    return run_on_v2


SCENARIOS.update({f"v2_{n}": _on_v2(f) for n, f in list(SCENARIOS.items()) if n not in NOT_ON_V2})
OWN_PROCESS = {"node_loss", "v2_node_loss"}  # makes its own Ray cluster


def run(name: str, sizes: Sizes = QUICK, tmp: Path | None = None) -> ChaosRow:
    """One scenario in a fresh scratch directory."""
    with tempfile.TemporaryDirectory(prefix=f"rlga-chaos-{name}-") as scratch:
        return SCENARIOS[name](sizes, Path(tmp or scratch))
