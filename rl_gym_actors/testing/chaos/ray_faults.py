"""Chaos on the Ray side: the ledger killed (mid-batch, mid-checkpoint), a rollout actor killed,
the driver SIGKILLed, a node lost."""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from rl_gym_actors.actors.runtime import LOCAL_RAY_TRIES, _child_pids, _stop_new_children
from rl_gym_actors.config import TryPolicy
from rl_gym_actors.errors import RayStartFailed
from rl_gym_actors.testing.chaos.common import (
    ChaosRow,
    Sizes,
    _after,
    _clean,
    _in_background,
    _orchestrator,
    _rows,
    _running,
    _state,
    _wait,
    agent_runs,
    process_server,
    thread_server,
)
from rl_gym_actors.testing.driver import DriverProcess


def _ledger_kill(sizes: Sizes, tmp: Path, mid_checkpoint: bool) -> ChaosRow:
    import ray

    where = "mid-checkpoint" if mid_checkpoint else "mid-batch"
    row = ChaosRow(
        f"ledger killed {where} (ray.kill, Ray restarts it)",
        "the batch finishes, the next batch runs, snapshot() holds the invariant, "
        "the checkpoint commits",
    )
    policy = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    server = thread_server(sizes, token="chaos").start()
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            batch = _in_background(
                orch.run_batch, _rows("lk", sizes, sleep_s=max(sizes.sleep_s, 1.0))
            )
            _wait(lambda: _running(server.endpoint) > 0, 30, "runs on Gym")
            during: Future | None = None
            if mid_checkpoint:
                during = _in_background(
                    orch.checkpoint, "lk-during", str(tmp / "lk-during"), deadline_s=60
                )
                _wait(lambda: _state(server.endpoint) == "preparing", 30, "prepare")
            fault = time.monotonic()
            ray.kill(orch.ledger, no_restart=False)
            outcomes = batch.result()
            if during is not None:
                try:
                    during.result()
                    row.committed = True
                except Exception as exc:  # reported in the row
                    row.committed = False
                    row.happened += f" the checkpoint in flight: {type(exc).__name__}: {exc}"
                row.recover_s = time.monotonic() - fault
            row.count(outcomes)
            again = orch.run_batch(_rows("lk2", sizes, sleep_s=0.0))
            _after(row, orch, server.endpoint, tmp, "lk-after", fault, outcomes + again)
            snap = orch.snapshot().ledger
            row.extra.update(
                next_batch_sealed=sum(o.status == "sealed" for o in again),
                invariant_ok=snap.invariant_ok,
                agent_runs=agent_runs(server),
            )
    finally:
        server.stop()
    runs = row.extra["agent_runs"]
    row.happened = (
        f"{row.sealed}/{row.rows} sealed; next batch "
        f"{row.extra['next_batch_sealed']}/{sizes.rows}; invariant "
        f"{'holds' if row.extra['invariant_ok'] else 'BROKEN'}; agent runs {runs} "
        f"for {2 * sizes.rows} rows" + row.happened
    )
    row.ok = (
        _clean(row)
        and row.extra["invariant_ok"]
        and runs == 2 * sizes.rows
        and row.extra["next_batch_sealed"] == sizes.rows
    )
    return row


def ledger_mid_batch(sizes: Sizes, tmp: Path) -> ChaosRow:
    return _ledger_kill(sizes, tmp, mid_checkpoint=False)


def ledger_mid_checkpoint(sizes: Sizes, tmp: Path) -> ChaosRow:
    return _ledger_kill(sizes, tmp, mid_checkpoint=True)


def rollout_actor_killed(sizes: Sizes, tmp: Path) -> ChaosRow:
    import ray

    row = ChaosRow(
        "rollout actor killed mid-batch (ray.kill)",
        "its rows fail with a reason, the others seal; the pool replaces it; the "
        "checkpoint settles what it left and commits",
    )
    policy = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    server = thread_server(sizes, token="chaos").start()
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            victim = orch.snapshot().pool.actors[0]
            batch = _in_background(
                orch.run_batch, _rows("ra", sizes, sleep_s=max(sizes.sleep_s, 1.0))
            )
            _wait(lambda: _running(server.endpoint) > 0, 30, "runs on Gym")
            fault = time.monotonic()
            ray.kill(ray.get_actor(victim, namespace="rl_gym_actors"), no_restart=True)
            outcomes = batch.result()
            row.count(outcomes)
            _after(row, orch, server.endpoint, tmp, "ra-after", fault, outcomes)
            again = orch.run_batch(_rows("ra2", sizes, sleep_s=0.0))
            row.extra["next_batch_sealed"] = sum(o.status == "sealed" for o in again)
            row.extra["replaced"] = orch.snapshot().pool.replaced
    finally:
        server.stop()
    row.happened = (
        f"{row.sealed} sealed, {row.failed_reason} failed with a reason; pool "
        f"replaced {row.extra['replaced']}; next batch "
        f"{row.extra['next_batch_sealed']}/{sizes.rows} sealed" + row.happened
    )
    row.ok = _clean(row) and row.extra["next_batch_sealed"] == sizes.rows
    return row


def driver_killed(sizes: Sizes, tmp: Path, *, use_lease: bool = False) -> ChaosRow:
    """The driver (with its own local Ray) SIGKILLed between prepare and resume; a new driver
    of the same run: ``abort_checkpoint`` at once, or (``use_lease``) nothing at all."""
    how = "the server's lease, no manual step" if use_lease else "abort_checkpoint at once"
    lease_s, dead_deadline_s = 3.0, 4.0
    row = ChaosRow(
        f"driver SIGKILL mid-checkpoint, then a new driver ({how})",
        "the new driver's batch runs and its checkpoint commits within 5 s"
        + (" of the lease's lapse" if use_lease else " of its start"),
    )
    policy = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=3.0)
    args = ["--checkpoint-lease-s", str(lease_s)] if use_lease else []
    server = process_server(sizes, token="chaos", args=args).start()
    assert server.url is not None and server.token is not None  # started, with its token
    try:
        driver = DriverProcess(
            [
                "--url",
                server.url,
                "--token",
                server.token,
                "--run-id",
                "chaos-run",
                "--rows",
                "3",
                "--slow-row-s",
                "60",
                "--checkpoint-id",
                "old-step",
                "--checkpoint-dir",
                str(tmp / "old"),
                "--deadline-s",
                str(dead_deadline_s if use_lease else 120),
            ]
        )
        try:
            driver.wait_for("checkpointing", 180)
            checkpointing = time.monotonic()
            _wait(lambda: _state(server.endpoint) == "preparing", 30, "the driver's prepare")
        finally:
            driver.kill()
        fault = time.monotonic()
        row.extra["held_after_kill"] = _state(server.endpoint)
        lapse = checkpointing + dead_deadline_s + lease_s
        with _orchestrator(server.endpoint, sizes, policy, run_id="chaos-run") as orch:
            ready = time.monotonic()  # starting actors is no part of recovering
            if not use_lease:
                row.extra["aborted"] = orch.abort_checkpoint("old-step").aborted
            outcomes = orch.run_batch(_rows("chaos-run-new", sizes, sleep_s=0.0))
            row.count(outcomes)
            _after(row, orch, server.endpoint, tmp, "new-step", fault, outcomes)
            committed = time.monotonic()
        after = committed - (max(lapse, ready) if use_lease else ready)
        row.extra.update(startup_s=round(ready - fault, 2), after_start_s=round(after, 2))
    finally:
        server.kill()
    since = "the lease lapsed or it started" if use_lease else "it started"
    row.happened = (
        f"Gym {row.extra['held_after_kill']} after the kill; the new driver "
        f"started in {row.extra['startup_s']:.1f} s, and its batch ran and its "
        f"checkpoint committed {after:.1f} s after {since}" + row.happened
    )
    row.ok = _clean(row) and row.sealed == sizes.rows and after < 5.0
    return row


def loopback_cluster(workers: int, tries: int = LOCAL_RAY_TRIES) -> tuple[Any, list[Any]]:
    """A ``ray.cluster_utils.Cluster`` on 127.0.0.1, a head and ``workers`` worker nodes of one
    CPU each, started up to ``tries`` times: Ray gives each raylet a fixed 30 s to register,
    which a loaded machine misses, and a failed start's processes are stopped before the next
    (as :func:`~rl_gym_actors.actors.runtime.start_local_ray` does). Raises
    :class:`RayStartFailed` after the last try."""
    from ray.cluster_utils import Cluster

    for attempt in range(1, tries + 1):
        before = _child_pids()
        cluster = None
        try:
            cluster = Cluster(
                initialize_head=True,
                head_node_args=dict(
                    num_cpus=1, include_dashboard=False, node_ip_address="127.0.0.1"
                ),
            )
            nodes = [
                cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1") for _ in range(workers)
            ]
            return cluster, nodes
        except Exception as exc:  # Ray's start-up timeout is a bare Exception
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.shutdown()
            _stop_new_children(before)
            if attempt == tries:
                raise RayStartFailed(
                    f"a {workers + 1}-node loopback cluster did not start in {tries} tries",
                    tries=tries,
                ) from exc
    raise AssertionError("unreachable")


def _sigkill_raylet(node: Any) -> int:
    """A lost machine: SIGKILL a ``ray.cluster_utils`` node's raylet and, at once, every worker
    process it started (the rollout actors on it), with no graceful shutdown (a worker alone
    outlives its raylet for a while and still answers its owner). The node's other processes
    are reaped by ``Cluster.shutdown``. Returns how many processes were killed."""
    import psutil

    (raylet,) = node.all_processes["raylet"]
    root = psutil.Process(raylet.process.pid)
    doomed = [root, *root.children(recursive=True)]
    for proc in doomed:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    return len(doomed)


def node_loss(sizes: Sizes, tmp: Path) -> ChaosRow:
    """A 3-node cluster on loopback loses a worker node (with rollout actors) mid-batch: its
    raylet SIGKILLed. Starts its own Ray cluster: run it in a process of its own (``ray`` must
    not be initialized). ``extra`` holds what the driver received (``driver_received``, by
    status) beside what ``snapshot()`` said right after the batch (``snapshot_received``, and
    the live actors' own counts, ``live_actors_counted``, which lack the lost node's)."""
    import ray

    from rl_gym_actors.config import PoolConfig

    row = ChaosRow(
        "3-node cluster loses a node mid-batch",
        "rows on the lost node fail with a reason, the rest seal; the checkpoint "
        "settles the lost owners' attempts and commits",
    )
    cluster, workers = loopback_cluster(2)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    server = process_server(sizes, token="chaos").start()
    policy = TryPolicy(rollout_s=5.0, receipt_s=2.0, max_tries=1, control_s=5.0)
    try:
        from rl_gym_actors.orchestrator import Orchestrator

        def node_of(handle: Any) -> str:
            return ray.get(
                handle.__ray_call__.remote(
                    lambda self: __import__("ray").get_runtime_context().get_node_id()
                ),
                timeout=60,
            )

        victim = orch = None
        for _ in range(4):  # SPREAD is a preference: try for a spread pool
            orch = Orchestrator(
                [server.endpoint],
                policy=policy,
                pool=PoolConfig(size=4, rollouts_per_actor=sizes.per_actor, spread=True),
                progress=False,
            )
            names = orch.snapshot().pool.actors
            placed = Counter(node_of(ray.get_actor(n, namespace="rl_gym_actors")) for n in names)
            ledger_node = node_of(orch.ledger)
            victims = [w for w in workers if w.node_id != ledger_node and placed.get(w.node_id)]
            if victims and len(placed) >= 2:
                victim = max(victims, key=lambda w: placed[w.node_id])
                break
            orch.close()
            orch = None
        if orch is None or victim is None:
            raise RuntimeError("SPREAD placed the pool on one node four times")
        batch = _in_background(orch.run_batch, _rows("nl", sizes, sleep_s=2.0))
        _wait(lambda: _running(server.endpoint) > 0, 60, "runs on Gym")
        fault = time.monotonic()
        row.extra["killed_processes"] = _sigkill_raylet(victim)
        outcomes = batch.result()
        row.count(outcomes)
        snap = orch.snapshot()  # what a user prints after the batch
        row.extra["driver_received"] = dict(Counter(o.status for o in outcomes))
        row.extra["snapshot_received"] = {
            "sealed": snap.received.sealed,
            "failed": snap.received.failed,
            "abandoned": snap.received.abandoned,
        }
        row.extra["live_actors_counted"] = (
            snap.actors.sealed + snap.actors.failed + snap.actors.abandoned
        )
        row.extra["snapshot_text"] = str(snap)
        _after(row, orch, server.endpoint, tmp, "nl-after", fault, outcomes, deadline_s=180)
        row.extra["lost_actors"] = placed[victim.node_id]
        orch.close()
    finally:
        server.kill()
        ray.shutdown()
        cluster.shutdown()
    row.happened = (
        f"node with {row.extra['lost_actors']} rollout actors lost; "
        f"{row.sealed} sealed, {row.failed_reason} failed with a reason" + row.happened
    )
    row.ok = _clean(row)
    return row
