"""Chaos of issue 16 (nothing released before it is durable): Gym restarted on an empty state
dir with held results, a partition during a checkpoint that heals, a trainer SIGKILLed between a
checkpoint's ACKs and its commit and restored from the checkpoint's part, Gym's clock off ours."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.errors import CheckpointFailed, GymStateLost
from rl_gym_actors.testing.chaos.common import (
    ChaosRow,
    Sizes,
    _in_background,
    _orchestrator,
    _rows,
    _state,
    _twice,
    _wait,
    gym_counts,
    process_server,
)
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.driver import DriverProcess
from rl_gym_actors.testing.gym_process import GymServerThread


def gym_state_lost(sizes: Sizes, tmp: Path) -> ChaosRow:
    """Gym restarted on an empty state dir while it held sealed results."""
    row = ChaosRow(
        "Gym restarted on an empty state dir, results held",
        "GymStateLost names the loss (nothing ACKed); re-sent rows never run again; "
        "the next checkpoint commits",
    )
    policy = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    agent = CountingAgent()
    server = GymServerThread(agent=agent, token="chaos", state_dir=tmp / "s1").start()
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            done = orch.run_batch(_rows("sl-a", sizes, sleep_s=0.0))
            orch.checkpoint("sl-1", str(tmp / "sl-1"), deadline_s=30)
            held = orch.run_batch(_rows("sl-b", sizes, sleep_s=0.0))
            server.stop()
            server.state_dir = str(tmp / "s2")  # empty
            server.start()
            fault = time.monotonic()
            try:
                orch.checkpoint("sl-2", str(tmp / "sl-2"), deadline_s=30)
                lost = None
            except GymStateLost as exc:
                lost = sum(exc.lost.values())
            again = orch.run_batch(_rows("sl-a", sizes, sleep_s=0.0))
            again += orch.run_batch(_rows("sl-b", sizes, sleep_s=0.0))
            outcomes = done + held + again
            row.count(outcomes)
            orch.checkpoint("sl-3", str(tmp / "sl-3"), deadline_s=30)
            row.committed, row.recover_s = True, time.monotonic() - fault
            row.gym_running, row.gym_unacked = gym_counts(server.endpoint)
    finally:
        server.stop()
    runs = sum(agent.starts.values())
    row.rewards_twice = _twice(o for o in outcomes if not o.repeated)
    row.extra.update(lost=lost, agent_runs=runs)
    row.happened = (
        f"GymStateLost({lost}) with {sizes.rows} held; re-sent {2 * sizes.rows} rows: "
        f"{sum(o.repeated for o in again)} repeated, "
        f"{sum(o.status == 'failed' for o in again)} forgotten; agent runs {runs} "
        f"for {2 * sizes.rows} ids"
    )
    # forgotten rows fail with a reason on purpose: nothing is counted twice, nothing reruns
    row.ok = lost == sizes.rows and runs == 2 * sizes.rows and row.rewards_twice == 0
    return row


def partition_heals(sizes: Sizes, tmp: Path, lease_s: float = 0.0) -> ChaosRow:
    """Gym frozen (every call unanswered) during a checkpoint that closed admission, then
    thawed: the ledger resumes in the background."""
    row = ChaosRow(
        f"partition during a checkpoint, then healed ({'no lease' if not lease_s else 'lease'})",
        "Gym accepting and the next checkpoint committed within 15 s of the heal, no person",
    )
    policy = TryPolicy(rollout_s=60.0, receipt_s=2.0, max_tries=1, control_s=2.0)
    lease = ["--checkpoint-lease-s", str(lease_s)]
    server = process_server(sizes, token="chaos", args=lease).start()
    pid = server.pid
    assert pid is not None  # started
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            slow = _in_background(orch.run_batch, _rows("ph", sizes, n=1, sleep_s=3.0))
            _wait(lambda: gym_counts(server.endpoint)[0] > 0, 30, "the slow run")
            ckpt = _in_background(orch.checkpoint, "ph-1", str(tmp / "ph-1"), deadline_s=4.0)
            _wait(lambda: _state(server.endpoint) != "accepting", 30, "admission closed")
            os.kill(pid, signal.SIGSTOP)
            try:
                ckpt.result(timeout=120)
                failed = False
            except CheckpointFailed:
                failed = True
            os.kill(pid, signal.SIGCONT)
            healed = time.monotonic()
            _wait(lambda: _state(server.endpoint) == "accepting", 60, "admission reopened")
            open_s = time.monotonic() - healed
            outcomes = slow.result(timeout=120)
            row.count(outcomes)
            orch.checkpoint("ph-2", str(tmp / "ph-2"), deadline_s=30)
            row.committed, row.recover_s = True, time.monotonic() - healed
            row.gym_running, row.gym_unacked = gym_counts(server.endpoint)
    finally:
        os.kill(pid, signal.SIGCONT)
        server.kill()
    row.extra.update(open_s=round(open_s, 2), first_failed=failed)
    row.happened = (
        f"the checkpoint in the partition failed; Gym accepting {open_s:.1f} s after the "
        f"heal; next checkpoint committed {row.recover_s:.1f} s after it"
    )
    row.ok = failed and row.recover_s < 15.0 and row.gym_running == 0 and row.gym_unacked == 0
    return row


def ack_crash_restore(sizes: Sizes, tmp: Path) -> ChaosRow:
    """A trainer SIGKILLed between its checkpoint's ACKs and a commit (Gym refused the commit:
    its dir is outside the server's --checkpoint-root), restarted with ``restore_from=``."""
    row = ChaosRow(
        "trainer SIGKILLed between the ACKs and the commit, restore_from",
        "same rows again: 0 failed or missing, all repeated, 0 agent reruns; next commit",
    )
    root = tmp / "root"
    root.mkdir()
    agent = CountingAgent()
    outside = tmp / "trainer" / "step-1"
    with GymServerThread(agent=agent, token="chaos", args=["--checkpoint-root", str(root)]) as gym:

        def driver(cid: str, cdir: Path, *extra: str) -> DriverProcess:
            args = ["--url", gym.url, "--token", "chaos", "--run-id", "ar", "--rows"]
            args += [str(sizes.rows), "--checkpoint-id", cid, "--checkpoint-dir", str(cdir)]
            return DriverProcess([*args, *extra])

        first = driver("ar-1", outside, "--hold-after-s", "600")
        try:
            before = first.wait_for("batch", 240)
            first.wait_for("holding", 240)
        finally:
            first.kill()
        fault = time.monotonic()
        second = driver("ar-2", root / "step-2", "--restore-from", str(outside))
        try:
            after = second.wait_for("batch", 240)
            done = second.wait_for("checkpoint", 240)
        finally:
            second.kill()
    row.rows = before["rows"] + after["rows"]
    row.sealed = before["sealed"] + after["sealed"]
    row.failed_reason = before["failed"] + after["failed"]
    row.committed = done["committed"]
    row.recover_s = time.monotonic() - fault
    runs = sum(agent.starts.values())
    row.rewards_twice = after["sealed"] - after["repeated"]
    row.extra.update(repeated=after["repeated"], agent_runs=runs)
    row.happened = (
        f"restored run: {after['sealed']}/{after['rows']} sealed, {after['repeated']} "
        f"repeated, {after['failed']} failed; agent runs {runs} for {sizes.rows} ids"
    )
    row.ok = (
        after["failed"] == 0
        and after["repeated"] == sizes.rows
        and runs == sizes.rows
        and row.committed is True
    )
    return row


def clock_skew(sizes: Sizes, tmp: Path, offset_s: float) -> ChaosRow:
    """Gym's clock ``offset_s`` off ours: a checkpoint taken while rollouts still run commits
    as on an unskewed server (deadlines are sent in the server's time)."""
    row = ChaosRow(
        f"Gym's clock {offset_s:+.0f} s off the trainer's",
        "checkpoints commit as with no skew; every row sealed; nothing left on Gym",
    )
    policy = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    server = process_server(sizes, token="chaos", clock_offset_s=offset_s).start()
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            batch = _in_background(orch.run_batch, _rows("cs", sizes, sleep_s=0.5))
            _wait(lambda: gym_counts(server.endpoint)[0] > 0, 30, "runs in flight")
            started = time.monotonic()
            orch.checkpoint("cs-1", str(tmp / "cs-1"), deadline_s=30)
            first_s = time.monotonic() - started
            outcomes = batch.result(timeout=120)
            row.count(outcomes)
            started = time.monotonic()
            orch.checkpoint("cs-2", str(tmp / "cs-2"), deadline_s=30)
            row.committed, row.recover_s = True, time.monotonic() - started
            row.gym_running, row.gym_unacked = gym_counts(server.endpoint)
    finally:
        server.kill()
    row.rewards_twice = _twice(outcomes)
    row.extra.update(first_checkpoint_s=round(first_s, 2))
    row.happened = (
        f"a checkpoint with {sizes.rows} rows in flight committed in {first_s:.1f} s, "
        f"the next in {row.recover_s:.1f} s; {row.sealed} of {row.rows} sealed"
    )
    row.ok = (
        row.sealed == row.rows
        and first_s < 15.0
        and row.gym_running == 0
        and row.gym_unacked == 0
        and row.rewards_twice == 0
    )
    return row
