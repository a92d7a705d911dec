"""The steps of tests/test_killed_checkpoint.py and tests/test_killed_checkpoint_v2.py (a file a
protocol, so that ``make test``'s workers run them side by side): a driver of run ``grpo-7``
SIGKILLed, with its Ray, inside its checkpoint ``step-1``, and a new trainer restored from that
checkpoint's directory that must free Gym at once, get the rows sent again from its part and
commit its first checkpoint."""

from __future__ import annotations

import asyncio
import threading
import time

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.polling import scaled, until

__all__ = [
    "POLICY",
    "ROWS",
    "RUN",
    "kill_in_checkpoint",
    "restart_and_check",
    "soon",
]

POLICY = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=3.0)
ROWS = 3
RUN = "grpo-7"


def soon(seconds: float = 5.0) -> float:
    return time.time() + scaled(seconds)


async def held(client: GymClient, v2: bool) -> str | None:
    """The checkpoint id holding the server (None: it takes work)."""
    if v2:
        status = await V2Client(client).status(deadline_ts=soon())
        return None if status.phase == "idle" else status.checkpoint_id
    status = await client.status("probe", deadline_ts=soon())
    return None if status.state == "accepting" else "step-1"


async def kill_in_checkpoint(server, client, old_dir: str, *, v2: bool, at: str) -> None:
    """Start a driver of run ``grpo-7``: its batch of ROWS seals, it checkpoints ``step-1``
    into ``old_dir`` and is SIGKILLed (with its Ray) ``at`` ``prepare`` (its slow row runs)
    or ``commit`` (its commit call is held). Returns once Gym holds ``step-1`` and the
    processes are gone."""
    args = ["--url", server.url, "--token", server.token, "--run-id", RUN]
    args += ["--rows", str(ROWS), "--checkpoint-id", "step-1", "--checkpoint-dir", old_dir]
    args += ["--pool", "1", "--deadline-s", "120"]
    if at == "prepare":
        args += ["--slow-row-s", "60"]
    driver = DriverProcess(args)
    try:
        batch = driver.wait_for("batch", 180)
        assert batch["sealed"] == ROWS
        if at == "prepare":
            await until(lambda: held(client, v2), timeout_s=30, what="the driver to prepare")
        else:
            await until(server.hold.reached.is_set, timeout_s=60, what="the driver's commit")
    finally:
        pids = driver.kill()
    for pid in pids:
        await until(lambda pid=pid: not alive(pid), interval_s=0.05, what=f"pid {pid} to die")
    assert await held(client, v2) == "step-1"  # the bug's state: Gym is held by a dead id


async def restart_and_check(server, client, endpoint, tmp_path, monkeypatch, *, v2: bool) -> None:
    from rl_gym_actors import orchestrator as orchestrator_module
    from rl_gym_actors.orchestrator import Orchestrator

    # Gym is free before the first Ray actor starts (an actor's start took 10-20 s at load 30,
    # and Gym refused all work that long): what holds Gym when the ledger actor is started
    real_start = orchestrator_module.LedgerClient.start
    at_ledger_start: list[str | None] = []  # "closed": Gym's admission still closed then

    def closed() -> bool:  # read in the server's own object: the spy runs on the layer's loop
        if v2:
            return not server.participant.status()["accepting"]
        return server.participant.core.report(listed=False).state != "accepting"

    async def spied_start(*args, **kwargs):
        at_ledger_start.append("closed" if closed() else None)
        return await real_start(*args, **kwargs)

    monkeypatch.setattr(orchestrator_module.LedgerClient, "start", spied_start)
    old_dir = str(tmp_path / "step-1")
    started = time.monotonic()  # the new trainer's start, before its orchestrator exists
    # watched from a thread of its own, in the server's object: a poller on this loop is late
    # by as long as the orchestrator's start keeps the loop busy (seen > 5 s at load)
    first_open: list[float] = []

    def watch() -> None:
        deadline = started + scaled(60.0)
        while time.monotonic() < deadline:
            if not closed():
                first_open.append(time.monotonic() - started)
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    async with Orchestrator(
        [endpoint],
        policy=POLICY,
        pool_size=2,
        run_id=RUN,
        progress=False,
        restore_from=old_dir,
    ) as orch:
        assert at_ledger_start == [None]  # resumed by the driver, before any actor
        assert await held(client, v2) is None  # open again once the trainer has started
        await asyncio.to_thread(watcher.join, scaled(60.0))
        assert first_open and first_open[0] < scaled(5.0)  # no lease waited out
        assert [(e.checkpoint_id, e.resumed) for e in orch.cleared] == [("step-1", True)]
        rows = [{"_ng_rollout_id": f"{RUN}-row-{i}", "reward": 0.5} for i in range(ROWS)]
        again = await orch.arun_batch(rows)
        assert [(o.status, o.repeated) for o in again] == [("sealed", True)] * ROWS  # no rerun
        fresh = await orch.arun_batch([{"reward": 0.25} for _ in range(2)])
        assert [o.status for o in fresh] == ["sealed"] * 2
        t0 = time.monotonic()
        try:
            report = await orch.acheckpoint("step-2", str(tmp_path / "step-2"), deadline_s=30)
        except CheckpointFailed as exc:
            raise AssertionError(f"the first checkpoint failed: {exc.blockers}") from exc
        assert time.monotonic() - t0 < scaled(10.0)  # at once: no dead checkpoint in the way
        assert report.endpoints[0].commit is not None
    assert await held(client, v2) is None
