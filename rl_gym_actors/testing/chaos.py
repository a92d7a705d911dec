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
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.testing.driver import DriverProcess
from rl_gym_actors.testing.gym_process import GymServerProcess, GymServerThread
from rl_gym_actors.testing.polling import wait_for


@dataclass(frozen=True)
class Sizes:
    rows: int = 16
    pool: int = 2
    per_actor: int = 2
    sleep_s: float = 0.5


QUICK = Sizes()
FULL = Sizes(rows=64, pool=4, per_actor=4, sleep_s=1.0)


@dataclass
class ChaosRow:
    scenario: str
    expected: str
    rows: int = 0
    sealed: int = 0
    failed_reason: int = 0
    failed_silent: int = 0
    gym_running: int | None = None
    gym_unacked: int | None = None
    committed: bool | None = None
    recover_s: float | None = None
    rewards_twice: int = 0
    ok: bool = False
    happened: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def count(self, outcomes: Iterable[Outcome]) -> ChaosRow:
        for o in outcomes:
            self.rows += 1
            if o.status == "sealed":
                self.sealed += 1
            elif o.reason:
                self.failed_reason += 1
            else:
                self.failed_silent += 1
        return self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _twice(outcomes: Iterable[Outcome]) -> int:
    sealed = Counter(o.rollout_id for o in outcomes if o.status == "sealed")
    return sum(1 for n in sealed.values() if n > 1)


def _soon(s: float = 5.0) -> float:
    return time.time() + s


async def _gym_counts(endpoint: GymEndpoint) -> tuple[int, int]:
    async with GymClient(endpoint) as client:
        st = await client.status("chaos-probe", deadline_ts=_soon())
        return st.running, st.completed_unacknowledged


def gym_counts(endpoint: GymEndpoint) -> tuple[int, int]:
    """(running, completed un-ACKed) on one server, from its status."""
    return asyncio.run(_gym_counts(endpoint))


def _in_background(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
    """``fn(*args, **kwargs)`` in a thread of its own; its result (or error) from the future."""
    future: Future = Future()

    def go() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to whoever reads the result
            future.set_exception(exc)

    threading.Thread(target=go, daemon=True).start()
    return future


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    wait_for(predicate, timeout_s=timeout_s, interval_s=0.02, what=what)


def _state(endpoint: GymEndpoint) -> str:
    async def read() -> str:
        async with GymClient(endpoint) as client:
            return (await client.status("chaos-probe", deadline_ts=_soon())).state

    return asyncio.run(read())


def _running(endpoint: GymEndpoint) -> int:
    return gym_counts(endpoint)[0]


def _rows(prefix: str, sizes: Sizes, n: int | None = None, sleep_s: float | None = None):
    return [
        {
            "_ng_rollout_id": f"{prefix}-{i}",
            "reward": 0.5,
            "sleep_s": sizes.sleep_s if sleep_s is None else sleep_s,
        }
        for i in range(sizes.rows if n is None else n)
    ]


def _orchestrator(endpoint: GymEndpoint, sizes: Sizes, policy: TryPolicy, **kw: Any):
    from rl_gym_actors.orchestrator import Orchestrator

    return Orchestrator(
        [endpoint],
        policy=policy,
        pool_size=sizes.pool,
        rollouts_per_actor=sizes.per_actor,
        progress=False,
        **kw,
    )


def _after(
    row: ChaosRow,
    orch: Any,
    endpoint: GymEndpoint,
    tmp: Path,
    cid: str,
    fault_at: float,
    outcomes: list[Outcome],
    deadline_s: float = 60.0,
) -> None:
    """The trainer's next step after the fault: a checkpoint; then Gym's counts."""
    try:
        orch.checkpoint(cid, str(tmp / cid), deadline_s=deadline_s)
        row.committed = True
        row.recover_s = time.monotonic() - fault_at
    except CheckpointFailed as exc:
        row.committed = False
        row.happened += f" checkpoint failed: {exc}"[:300]
    row.gym_running, row.gym_unacked = gym_counts(endpoint)
    row.rewards_twice = _twice(outcomes)


def _clean(row: ChaosRow) -> bool:
    return (
        row.failed_silent == 0
        and row.committed is True
        and row.gym_running == 0
        and row.gym_unacked == 0
        and row.rewards_twice == 0
    )


# ---------------------------------------------------------------------- scenarios


def gym_restart(sizes: Sizes, tmp: Path) -> ChaosRow:
    """Gym SIGKILLed mid-batch and restarted on its state dir."""
    row = ChaosRow(
        "Gym SIGKILL + restart mid-batch (state dir)",
        "rows sealed or failed with a reason; the next checkpoint commits; "
        "Gym 0 running / 0 un-ACKed",
    )
    policy = TryPolicy(rollout_s=5.0, receipt_s=2.0, max_tries=3, control_s=5.0)
    server = GymServerProcess(token="chaos", state_dir=tmp / "state").start()
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            batch = _in_background(orch.run_batch, _rows("gr", sizes))
            _wait(lambda: _running(server.endpoint) > 0, 30, "runs on Gym")
            fault = time.monotonic()
            server.kill()
            server.start()
            outcomes = batch.result()
            row.count(outcomes)
            _after(row, orch, server.endpoint, tmp, "gr-after", fault, outcomes)
            again = orch.run_batch(_rows("gr2", sizes, sleep_s=0.0))
            row.extra["next_batch_sealed"] = sum(o.status == "sealed" for o in again)
            row.failed_silent += sum(o.status != "sealed" and not o.reason for o in again)
    finally:
        server.kill()
    row.happened = (
        f"{row.sealed} sealed, {row.failed_reason} failed with a reason; next "
        f"batch {row.extra['next_batch_sealed']}/{sizes.rows} sealed (rows that meet "
        f"the endpoint still marked down fail at once, naming it)" + row.happened
    )
    row.ok = _clean(row)
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
    server = GymServerProcess(token="chaos").start()
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
    server = GymServerProcess(token="chaos").start()
    try:
        with _orchestrator(server.endpoint, sizes, policy) as orch:
            os.kill(server.pid, signal.SIGSTOP)
            fault = time.monotonic()
            try:
                orch.checkpoint("frozen", str(tmp / "frozen"), deadline_s=3.0)
                failed_fast = False
            except CheckpointFailed:
                failed_fast = True
            ckpt_s = time.monotonic() - fault
            outcomes = orch.run_batch(_rows("fz", sizes, n=sizes.pool * sizes.per_actor))
            row.count(outcomes)
            os.kill(server.pid, signal.SIGCONT)
            _after(row, orch, server.endpoint, tmp, "fz-after", fault, outcomes)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
    row.extra["checkpoint_s"] = round(ckpt_s, 2)
    row.happened = (
        f"CheckpointFailed after {ckpt_s:.2f} s; {row.failed_reason} rows failed "
        f"with a reason while frozen" + row.happened
    )
    row.ok = failed_fast and ckpt_s < 3.5 and _clean(row)
    return row


def _ledger_kill(sizes: Sizes, tmp: Path, mid_checkpoint: bool) -> ChaosRow:
    import ray

    where = "mid-checkpoint" if mid_checkpoint else "mid-batch"
    row = ChaosRow(
        f"ledger killed {where} (ray.kill, Ray restarts it)",
        "the batch finishes, the next batch runs, snapshot() holds the invariant, "
        "the checkpoint commits",
    )
    policy = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    server = GymServerThread(token="chaos").start()
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
                agent_runs=server.participant.snapshot()["agent_starts"],
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
    server = GymServerThread(token="chaos").start()
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
    server = GymServerProcess(token="chaos", args=args).start()
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
    server = GymServerThread(token="chaos").start()
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
        runs = server.participant.snapshot()["agent_starts"]
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


def node_loss(sizes: Sizes, tmp: Path) -> ChaosRow:
    """A 3-node cluster on loopback loses a worker node (with rollout actors) mid-batch. Starts
    its own Ray cluster: run it in a process of its own (``ray`` must not be initialized)."""
    import ray
    from ray.cluster_utils import Cluster

    from rl_gym_actors.config import PoolConfig

    row = ChaosRow(
        "3-node cluster loses a node mid-batch",
        "rows on the lost node fail with a reason, the rest seal; the checkpoint "
        "settles the lost owners' attempts and commits",
    )
    loopback = dict(node_ip_address="127.0.0.1")
    cluster = Cluster(
        initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False, **loopback)
    )
    workers = [cluster.add_node(num_cpus=1, **loopback) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    server = GymServerProcess(token="chaos").start()
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
        cluster.remove_node(victim, allow_graceful=False)
        outcomes = batch.result()
        row.count(outcomes)
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
}
OWN_PROCESS = {"node_loss"}  # makes its own Ray cluster


def run(name: str, sizes: Sizes = QUICK, tmp: Path | None = None) -> ChaosRow:
    """One scenario in a fresh scratch directory."""
    with tempfile.TemporaryDirectory(prefix=f"rlga-chaos-{name}-") as scratch:
        return SCENARIOS[name](sizes, Path(tmp or scratch))
