"""A trainer SIGKILLed inside its own checkpoint costs the next one nothing (both protocols).

A driver process (with its own local Ray) checkpoints ``step-1`` and is killed in it: during
prepare (a slow row holds it) or between its ACK / prepare and its commit (the server holds the
commit call, :mod:`rl_gym_actors.testing.hold`). Gym is left holding ``step-1``: admission
closed, on a server with no lease (agent-checkpoint, as a real Gym) or a 600 s one (v2). A new
trainer restored from that checkpoint's directory (whose part names ``step-1``) resumes it at
start: Gym takes work within 5 s of the start, the rows sent again come back from the part
(none rerun), and its first checkpoint commits at once. A trainer of another run leaves
``step-1`` alone, and its checkpoint fails naming it."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.checkpoint_part import own_open_ids, write_part
from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.hold import HoldCalls
from rl_gym_actors.testing.polling import scaled, until
from rl_gym_actors.testing.v2_server import V2ServerThread

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


async def reopened(client: GymClient, v2: bool, since: float) -> float | None:
    """Seconds since ``since`` once Gym takes work (else None)."""
    return None if await held(client, v2) else max(time.monotonic() - since, 1e-6)


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
    opened = asyncio.ensure_future(
        until(lambda: reopened(client, v2, started), interval_s=0.05, what="Gym to reopen")
    )
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
        assert await opened < scaled(5.0)  # seconds from the start: no lease waited out
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


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("at", ["prepare", "commit"])
async def test_agent_checkpoint_a_trainer_killed_in_its_checkpoint(
    ray_session, tmp_path, monkeypatch, at
):
    hold = HoldCalls("/commit", armed=at == "commit", limit=1)  # the dead one's, never done
    with GymServerThread(token="test-token", extensions=[hold.extension()]) as server:
        server.hold = hold
        endpoint = GymEndpoint(url=server.url, token=server.token)
        try:
            async with GymClient(endpoint) as client:
                await kill_in_checkpoint(server, client, str(tmp_path / "step-1"), v2=False, at=at)
                if at == "prepare":
                    await another_run_leaves_it(endpoint, tmp_path)
                await restart_and_check(server, client, endpoint, tmp_path, monkeypatch, v2=False)
                status = await client.status("probe-end", deadline_ts=soon())
                assert status.running == 0 and status.completed_unacknowledged == 0
        finally:
            hold.release()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("at", ["prepare", "commit"])
async def test_v2_a_trainer_killed_in_its_checkpoint(ray_session, tmp_path, monkeypatch, at):
    hold = HoldCalls("/commit", armed=at == "commit", limit=1)  # the dead one's, never done
    with V2ServerThread(extensions=[hold.extension()]) as server:
        server.hold = hold
        endpoint = GymEndpoint(url=server.url, token=server.token)
        try:
            async with GymClient(endpoint) as client:
                await kill_in_checkpoint(server, client, str(tmp_path / "step-1"), v2=True, at=at)
                await restart_and_check(server, client, endpoint, tmp_path, monkeypatch, v2=True)
                status = await V2Client(client).status(deadline_ts=soon())
                assert status.report.counts["episodes"] == 0  # the dead slow row was retired
        finally:
            hold.release()


async def another_run_leaves_it(endpoint: GymEndpoint, tmp_path) -> None:
    """A trainer of another run does not resume ``step-1``: its checkpoint fails naming it."""
    from rl_gym_actors.orchestrator import Orchestrator

    async with Orchestrator(
        [endpoint], policy=POLICY, pool_size=1, run_id="other-run", progress=False, start=False
    ) as other:
        await other.astart()
        with pytest.raises(CheckpointFailed) as failed:
            await other.acheckpoint("other-1", str(tmp_path / "other-1"), deadline_s=2.0)
    (entry,) = failed.value.blockers.values()
    assert isinstance(entry, dict) and entry.get("active_checkpoint_id") == "step-1", entry


def test_own_open_ids_names_newer_parts_of_the_run_beside_the_restored_one(tmp_path):
    """A trainer restoring from its last committed checkpoint (``step-1``) learns the id of the
    one it was killed in (``step-2``, whose part was written later beside it); another run's
    part and an older one of its own are not named."""
    import os

    def part(name: str, run_id: str, mtime: float) -> str:
        d = tmp_path / name
        write_part(
            d, run_id=run_id, checkpoint_id=name, handed=[], undelivered=[], sealed=SealedIds()
        )
        os.utime(d / "rl_gym_actors" / "part.json", (mtime, mtime))
        return str(d)

    now = time.time()
    part("step-0", RUN, now - 30)
    restored = part("step-1", RUN, now - 20)
    part("step-2", RUN, now - 10)
    part("theirs-9", "other-run", now - 5)
    (tmp_path / "junk").mkdir()
    assert own_open_ids(restored, RUN, "step-1") == ["step-1", "step-2"]
