"""Checkpoint leases: an id that nobody calls any more lets go of admission by itself, also
across a SIGKILL and restart; `gym abort` resumes it from a shell; a conflict names the id."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time

import pytest

from rl_gym_actors.errors import CheckpointConflict
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerProcess, GymServerThread
from rl_gym_actors.testing.real_gym import RealGymStandIn


async def _until_idle(wire, timeout_s: float) -> dict:
    await wire.until(
        lambda st: st["phase"] == "idle", timeout_s=timeout_s, what="the lease to expire"
    )
    return {**(await wire.status(None)).json, **(await wire.lease()).json}


async def test_an_abandoned_checkpoint_expires_reopens_admission_and_spends_its_id(
    wire_for, caplog
):
    caplog.set_level(logging.WARNING, logger="rl_gym_actors.gym.agent_checkpoint.participant")
    with GymServerThread(args=["--checkpoint-lease-s", "0.3"]) as srv:
        wire = wire_for(srv)
        assert (await wire.prepare("cp-lost", deadline_s=0.2)).status == 200
        assert (await wire.run("blocked")).code == "agent_admission_closed"
        caps = (await wire.capabilities()).json
        assert caps["phase"] == "prepared" and caps["active_checkpoint_id"] == "cp-lost"
        assert "checkpoint-lease" in caps["features"]
        started = time.monotonic()
        st = await _until_idle(wire, timeout_s=5)
        assert time.monotonic() - started < 3
        assert st["state"] == "accepting" and "checkpoint_id" not in st
        assert st["checkpoint_lease"]["last_expired"]["checkpoint_id"] == "cp-lost"
        assert st["checkpoint_lease"]["last_expired"]["phase"] == "prepared"
        assert (await wire.run("blocked")).status == 200  # admission is open
        assert (await wire.prepare("cp-lost")).code == "stale_checkpoint"  # the id is spent
        resumed = await wire.resume("cp-lost")  # abort: idempotent
        assert resumed.json == {"state": "accepting", "released": 0}
        [warning] = [
            r for r in caplog.records if getattr(r, "event", "") == "checkpoint_lease_expired"
        ]
        assert warning.checkpoint_id == "cp-lost" and warning.levelno == logging.WARNING


@pytest.mark.slow  # timing-bound (a 0.5 s lease against call latency)
async def test_calls_for_the_id_renew_its_lease(wire_for, tmp_path):
    with GymServerThread(args=["--checkpoint-lease-s", "0.5"]) as srv:
        wire = wire_for(srv)
        assert (await wire.prepare("cp-live", deadline_s=0.1)).status == 200
        renewed_until = time.monotonic() + 1.5
        while time.monotonic() < renewed_until:  # 3 leases long, renewed by status
            assert (await wire.status("cp-live")).status == 200
            st = (await wire.lease()).json
            assert st["phase"] == "prepared", st
            await asyncio.sleep(0.1)
        committed = await wire.request(  # renews too, from its deadline
            "POST",
            "/ng-control/v1/agent-checkpoint/commit",
            body={
                "checkpoint_id": "cp-live",
                "deadline_ts": time.time() + 0.1,
                "checkpoint_dir": str(tmp_path / "ck"),
            },
        )
        assert committed.status == 200
        await _until_idle(wire, timeout_s=5)  # nobody calls now: it expires


async def test_a_conflict_names_the_checkpoint_in_the_way(wire_for):
    with GymServerThread() as srv:
        wire = wire_for(srv)
        await wire.prepare("cp-a")
        got = await wire.prepare("cp-b")
        assert got.code == "checkpoint_conflict"
        assert (got.json["error"]["active_checkpoint_id"], got.json["error"]["phase"]) == (
            "cp-a",
            "prepared",
        )
        async with GymClient(srv.endpoint) as client:
            with pytest.raises(CheckpointConflict) as info:
                await client.prepare("cp-b", deadline_ts=time.time() + 5)
        assert info.value.active_checkpoint_id == "cp-a"
        await wire.resume("cp-a")


@pytest.mark.slow
async def test_a_server_killed_mid_checkpoint_comes_back_held_and_then_lets_go(tmp_path, wire_for):
    # the lease must outlast a SIGKILL and restart, and is then waited out: it is sized by this
    # machine's own start of the same server, now (4x, at least 4 s), not a fixed 15 s scaled by
    # the load (up to 120 s waited out at load 16 and more)
    srv = GymServerProcess(state_dir=tmp_path / "timing")
    started = time.monotonic()
    with srv:
        start_s = time.monotonic() - started
    lease_s = f"{max(4.0, 4 * start_s):.1f}"
    with GymServerProcess(state_dir=tmp_path, args=["--checkpoint-lease-s", lease_s]) as srv:
        wire = wire_for(srv)
        assert (await wire.run("done")).status == 200
        assert (await wire.prepare("cp-k", deadline_s=0.5)).code == "agent_prepare_incomplete"
        before = (await wire.capabilities()).json
        srv.kill()  # SIGKILL, mid-checkpoint
        await asyncio.to_thread(srv.restart)
        wire = wire_for(srv)
        after = (await wire.capabilities()).json
        assert (after["phase"], after["active_checkpoint_id"]) == ("preparing", "cp-k")
        assert after["deadline_ts"] == pytest.approx(before["deadline_ts"], abs=1.0)
        assert (await wire.run("new")).code == "agent_admission_closed"
        await _until_idle(wire, timeout_s=40)
        assert (await wire.run("new")).status == 200
        assert (await wire.prepare("cp-k")).code == "stale_checkpoint"


def _abort(url: str, checkpoint_id: str, token: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_gym_actors.cli",
            "gym",
            "abort",
            url,
            "--checkpoint-id",
            checkpoint_id,
            "--token",
            token,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow  # runs the command line in a subprocess
@pytest.mark.parametrize("real", [False, True])
async def test_gym_abort_from_a_shell_reopens_admission(wire_for, real):
    with GymServerThread() as srv:
        target = RealGymStandIn(srv.endpoint).__enter__() if real else srv
        try:
            wire = wire_for(target)
            await wire.prepare("cp-stuck")
            assert (await wire.run("x")).code == "agent_admission_closed"
            done = await asyncio.to_thread(_abort, target.url, "cp-stuck", target.token)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["state"] == "accepting"
            assert (await wire.run("x")).status == 200
            wrong = await asyncio.to_thread(_abort, target.url, "cp-other", "wrong-token")
            # a refused token exits 2 (refused or bad input), as `status` does (cli --help)
            assert wrong.returncode == 2 and "unauthorized" in wrong.stderr.lower()
        finally:
            if real:
                target.__exit__(None, None, None)
