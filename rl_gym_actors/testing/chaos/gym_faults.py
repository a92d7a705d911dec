"""Chaos on the Gym side: a server restarted, killed for good, frozen; two runs sharing one Gym."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.testing.chaos.common import (
    ChaosRow,
    Sizes,
    _after,
    _clean,
    _in_background,
    _orchestrator,
    _rows,
    _running,
    _wait,
    agent_runs,
    gym_counts,
    process_server,
    thread_server,
)
from rl_gym_actors.testing.driver import DriverProcess


def gym_restart(sizes: Sizes, tmp: Path) -> ChaosRow:
    """Gym SIGKILLed mid-batch and restarted on its state dir. Back within ``control_s``, the
    rows it cut ride the restart out (their steps wait for it and are sent again) and every
    row seals; a slower restart (a loaded machine) may leave rows failed, each with a reason."""
    policy = TryPolicy(rollout_s=5.0, receipt_s=2.0, max_tries=3, control_s=5.0)
    row = ChaosRow(
        "Gym SIGKILL + restart mid-batch (state dir)",
        f"back within control_s ({policy.control_s:.0f} s): every row sealed, else sealed or "
        "failed with a reason; the next checkpoint commits; Gym 0 running / 0 un-ACKed",
    )
    server = process_server(sizes, token="chaos", state_dir=tmp / "state").start()
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            batch = _in_background(orch.run_batch, _rows("gr", sizes))
            _wait(lambda: _running(server.endpoint) > 0, 30, "runs on Gym")
            fault = time.monotonic()
            server.kill()
            server.start()
            restart_s = time.monotonic() - fault
            outcomes = batch.result()
            row.count(outcomes)
            _after(row, orch, server.endpoint, tmp, "gr-after", fault, outcomes)
            again = orch.run_batch(_rows("gr2", sizes, sleep_s=0.0))
            row.extra["next_batch_sealed"] = sum(o.status == "sealed" for o in again)
            row.failed_silent += sum(o.status != "sealed" and not o.reason for o in again)
    finally:
        server.kill()
    # the steps that wait for Gym end control_s after the kill; the probe and a resend need
    # about a second of that
    quick = restart_s <= policy.control_s - 1.5
    row.extra.update(restart_s=round(restart_s, 2), rode_out=quick)
    row.happened = (
        f"{row.sealed} sealed, {row.failed_reason} failed with a reason; Gym back in "
        f"{restart_s:.1f} s (control_s {policy.control_s:.0f} s); next batch "
        f"{row.extra['next_batch_sealed']}/{sizes.rows} sealed" + row.happened
    )
    row.ok = _clean(row) and (row.sealed == row.rows or not quick)
    return row


def gym_dead(sizes: Sizes, tmp: Path) -> ChaosRow:
    """Gym SIGKILLed for good: 60 rows on the pool end within rollout_s x max_tries +
    control_s; a checkpoint fails within its deadline + 0.5 s."""
    row = ChaosRow(
        "Gym dead (SIGKILL, no restart)",
        "60 rows end within rollout_s x max_tries + control_s, each naming the "
        "cause; checkpoint(deadline_s=3) raises CheckpointFailed within 3.5 s",
    )
    policy = TryPolicy(rollout_s=5.0, receipt_s=2.0, max_tries=3, control_s=5.0)
    bound = policy.rollout_s * policy.max_tries + policy.control_s
    server = process_server(sizes, token="chaos").start()
    try:
        with _orchestrator(server.endpoint, Sizes(pool=2, per_actor=2), policy) as orch:
            server.kill()
            fault = time.monotonic()
            outcomes = orch.run_batch([{"reward": 1.0} for _ in range(60)])
            batch_s = time.monotonic() - fault
            row.count(outcomes)
            named = sum("Cannot connect" in (o.reason or "") for o in outcomes)
            start = time.monotonic()
            try:
                orch.checkpoint("dead", str(tmp / "dead"), deadline_s=3.0)
                row.committed = True
            except CheckpointFailed:
                row.committed = False
            ckpt_s = time.monotonic() - start
            row.recover_s = batch_s
    finally:
        server.kill()
    row.extra.update(
        batch_s=round(batch_s, 2), bound_s=bound, checkpoint_s=round(ckpt_s, 2), cause_named=named
    )
    row.happened = (
        f"batch ended in {batch_s:.1f} s (bound {bound:.0f} s), {named}/60 reasons "
        f"name 'Cannot connect'; CheckpointFailed after {ckpt_s:.2f} s"
    )
    row.ok = (
        row.failed_silent == 0
        and batch_s < bound
        and named == 60
        and row.committed is False
        and ckpt_s < 3.5
    )
    return row


def gym_frozen(sizes: Sizes, tmp: Path) -> ChaosRow:
    """Gym SIGSTOPped: a checkpoint fails within its deadline + 0.5 s; after SIGCONT the next
    checkpoint commits."""
    row = ChaosRow(
        "Gym frozen (SIGSTOP), then SIGCONT",
        "checkpoint(deadline_s=3) raises within 3.5 s; rows fail with a reason; "
        "after SIGCONT the next checkpoint commits",
    )
    policy = TryPolicy(rollout_s=2.0, receipt_s=1.0, max_tries=1, control_s=2.0)
    server = process_server(sizes, token="chaos").start()
    pid = server.pid
    assert pid is not None  # started
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            os.kill(pid, signal.SIGSTOP)
            fault = time.monotonic()
            try:
                orch.checkpoint("frozen", str(tmp / "frozen"), deadline_s=3.0)
                failed_fast = False
            except CheckpointFailed:
                failed_fast = True
            ckpt_s = time.monotonic() - fault
            outcomes = orch.run_batch(_rows("fz", sizes, n=sizes.pool * sizes.per_actor))
            row.count(outcomes)
            os.kill(pid, signal.SIGCONT)
            _after(row, orch, server.endpoint, tmp, "fz-after", fault, outcomes)
    finally:
        os.kill(pid, signal.SIGCONT)
        server.kill()
    row.extra["checkpoint_s"] = round(ckpt_s, 2)
    row.happened = (
        f"CheckpointFailed after {ckpt_s:.2f} s; {row.failed_reason} rows failed "
        f"with a reason while frozen" + row.happened
    )
    row.ok = failed_fast and ckpt_s < 3.5 and _clean(row)
    return row


def two_runs(sizes: Sizes, tmp: Path) -> ChaosRow:
    """Two trainers (two driver processes, ack on_seal) on one Gym, checkpointing at once."""
    import ray

    from rl_gym_actors.config import TryPolicy as _Policy

    row = ChaosRow(
        "two runs on one Gym checkpointing at once",
        "neither retires or ACKs the other's attempts (agent runs == rows); both "
        "checkpoints commit",
    )
    address = ray.get_runtime_context().gcs_address
    ack = ["--ack", "on_seal"] if "ack" in _Policy.model_fields else []
    go = tmp / "go"
    server = thread_server(sizes, token="chaos").start()
    assert server.url is not None  # started
    try:
        drivers = [
            DriverProcess(
                [
                    "--url",
                    server.url,
                    "--token",
                    server.token,
                    "--run-id",
                    run,
                    "--rows",
                    str(sizes.rows),
                    "--sleep-s",
                    str(sizes.sleep_s),
                    "--pool",
                    str(sizes.pool),
                    "--checkpoint-id",
                    f"{run}-1",
                    "--checkpoint-dir",
                    str(tmp / run),
                    "--deadline-s",
                    "60",
                    "--go-file",
                    str(go),
                    *ack,
                ],
                ray_address=address,
            )
            for run in ("run-a", "run-b")
        ]
        try:
            for d in drivers:
                d.wait_for("started", 120)
            go.touch()
            fault = time.monotonic()
            batches = [d.wait_for("batch", 180) for d in drivers]
            checkpoints = [d.wait_for("checkpoint", 180) for d in drivers]
            row.recover_s = time.monotonic() - fault
        finally:
            for d in drivers:
                d.kill()
        row.gym_running, row.gym_unacked = gym_counts(server.endpoint)
        runs = agent_runs(server)
    finally:
        server.stop()
    row.rows = sum(b["rows"] for b in batches)
    row.sealed = sum(b["sealed"] for b in batches)
    row.failed_reason = sum(b["failed"] for b in batches)
    row.committed = all(c["committed"] for c in checkpoints)
    touched = sum(c.get("retired", 0) + c.get("orphans_acked", 0) for c in checkpoints)
    row.extra.update(
        agent_runs=runs,
        touched_other=touched,
        checkpoint_s=[round(c["seconds"], 2) for c in checkpoints],
    )
    row.happened = (
        f"agent runs {runs} for {row.rows} rows; retired/orphan-ACKed by the gates "
        f"{touched}; checkpoints took {row.extra['checkpoint_s']} s"
    )
    row.ok = _clean(row) and runs == row.rows and touched == 0
    return row
