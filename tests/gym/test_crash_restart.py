"""A real kill -9 of ``rl-gym-actors gym serve`` and a restart on the same state dir; and the CLI's
start line and clean shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest

from rl_gym_actors.testing.gym_process import GymServerProcess

pytestmark = pytest.mark.slow


async def test_kill_9_and_restart_keeps_every_promise(tmp_path, wire_for):
    server = GymServerProcess(state_dir=tmp_path / "state")
    with server:
        wire = wire_for(server)
        # before the crash: completed un-ACKed, ACKed, retired, failed, running, a spent checkpoint
        first = await wire.run("rC", reward=0.5)
        receipt_c = await wire.receipt("rC")
        await wire.ack(await wire.complete("rA"))
        assert (await wire.retire("rT")).status == 200
        assert (await wire.run("rF", fail=True)).code == "agent_data_failed"
        await wire.ack(await wire.complete("rP"))
        assert (await wire.prepare("c1")).status == 409  # rC blocks; no matter
        assert (await wire.resume("c1")).status == 200
        running = asyncio.create_task(wire.run("rS", sleep_s=60))
        await wire.until(lambda st: st["running"] == 1, what="rS running")
        url = server.url

        server.kill()
        assert server.returncode == -signal.SIGKILL
        with pytest.raises(aiohttp.ClientError):
            await running  # its caller lost the connection

        server.restart()
        assert server.url == url  # the same port, when it is free
        wire = wire_for(server)
        # the completed reply replays byte for byte, and its receipt too
        replay = await wire.run("rC", reward=0.9)
        assert replay.status == 200 and replay.replayed and replay.raw == first.raw
        assert (await wire.receipt("rC")).raw == receipt_c.raw
        assert (await wire.ack(receipt_c.json["completion_receipt"])).json == {
            "acknowledged": True,
            "idempotent": False,
        }
        # ACKed, retired and failed keys stay stale
        for rollout in ("rA", "rT", "rF", "rP"):
            assert (await wire.run(rollout)).code == "stale_attempt"
        assert (await wire.receipt("rA")).json["state"] == "acknowledged"
        # the run that was running at the crash is tombstoned
        assert (await wire.retire("rS")).json == {
            "retired": False,
            "tombstoned": True,
            "completed_unacknowledged": False,
        }
        assert (await wire.run("rS")).code == "stale_attempt"
        assert (await wire.receipt("rS")).code == "stale_attempt"
        # the spent checkpoint id stays spent
        assert (await wire.prepare("c1")).code == "stale_checkpoint"
        st = (await wire.status()).json
        assert (st["running"], st["completed_unacknowledged"], st["ready_to_commit"]) == (
            0,
            0,
            True,
        )
        assert "durable-store" in (await wire.capabilities()).json["features"]
        assert (await wire.run("rNew")).status == 200  # and it serves new work
    assert server.returncode == 0


async def test_cli_prints_one_json_line_and_a_generated_token_works(tmp_path, wire_for):
    env = {k: v for k, v in os.environ.items() if k != "RL_GYM_CONTROL_TOKEN"}
    server = GymServerProcess(token=None, allow_faults=False, env=env)
    with server:
        assert set(server.info) == {"url", "pid", "token_source", "token"}
        assert server.info["token_source"] == "generated"
        assert server.url.startswith("http://127.0.0.1:")
        assert server.pid == server._proc.pid
        assert len(server.token) >= 32
        wire = wire_for(server)
        assert (await wire.status()).status == 200
        assert (await wire.status(token="guess")).code == "unauthorized"
        assert "faults" not in (await wire.capabilities()).json["features"]
        server._proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert await asyncio.to_thread(server._proc.wait, 10) == 0


async def test_cli_reads_the_token_from_the_environment(wire_for):
    env = {**os.environ, "RL_GYM_CONTROL_TOKEN": "from-env"}
    with GymServerProcess(token=None, env=env) as server:
        assert server.info == {"url": server.url, "pid": server.pid, "token_source": "env"}
        assert server.token == "from-env"
        assert (await wire_for(server).status()).status == 200


async def test_sigterm_with_a_run_in_flight_exits_cleanly_and_promptly(tmp_path, wire_for):
    server = GymServerProcess(state_dir=tmp_path)
    server.start()
    wire = wire_for(server)
    running = asyncio.create_task(wire.run("rS", sleep_s=60))
    await wire.until(lambda st: st["running"] == 1, what="rS running")
    started = time.monotonic()
    assert await asyncio.to_thread(server.stop) == 0
    assert time.monotonic() - started < 5
    cut = await running
    assert (cut.status, cut.code) == (503, "unavailable")
    server.restart()
    try:
        assert (await wire_for(server).run("rS")).code == "stale_attempt"
    finally:
        server.stop()


def test_cli_refuses_a_bad_agent_and_a_taken_port():
    import subprocess
    import sys

    bad = subprocess.run(
        [sys.executable, "-m", "rl_gym_actors.cli", "gym", "serve", "--agent", "no_such_module:fn"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no_such_module" in bad.stderr and bad.stdout == ""
    with GymServerProcess() as server:
        port = server.url.rsplit(":", 1)[1]
        taken = subprocess.run(
            [sys.executable, "-m", "rl_gym_actors.cli", "gym", "serve", "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert taken.returncode == 2 and "cannot bind" in taken.stderr
    json.dumps(server.info)
