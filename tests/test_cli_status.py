"""`rl-gym-actors status URL`: a real Gym server on loopback, read as a table and as JSON."""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rl_gym_actors.cli_observe import status_command
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.protocol import StatusReport
from rl_gym_actors.testing.polling import soon


@pytest.fixture(scope="module")
async def one_unacked(gym):
    """One completed, un-ACKed run (rS, 0) and one completed and ACKed run (rA, 0)."""
    async with GymClient(gym.endpoint) as client:
        deadline = soon(10)
        await client.run({"reward": 0.5}, rollout_id="rS", attempt_index=0, deadline_ts=deadline)
        await client.run({"reward": 1.0}, rollout_id="rA", attempt_index=0, deadline_ts=deadline)
        answer = await client.receipt("rA", 0, deadline_ts=deadline)
        await client.acknowledge(answer.completion_receipt, deadline_ts=deadline)


def run(url, **kw):
    args = argparse.Namespace(
        **{
            "url": url,
            "token": "test-token",
            "checkpoint_id": "rlga-status",
            "timeout_s": 5.0,
            "limit": 20,
            "json": False,
            **kw,
        }
    )
    out, err = io.StringIO(), io.StringIO()
    code = status_command(args, out, err)
    return code, out.getvalue(), err.getvalue()


def field(text, name):
    line = next(line for line in text.splitlines() if line.split()[:1] == [name])
    return line.split()[-1]


def test_status_table_shows_counts_and_the_unacked_attempt(gym, one_unacked):
    code, out, err = run(gym.url)
    assert code == 0, err
    assert out.startswith(f"Gym {gym.url}")
    assert field(out, "completed_unacknowledged") == "1"
    assert field(out, "acknowledged_completed") == "1"
    assert field(out, "ready_to_commit") == "no"
    row = next(line for line in out.splitlines() if line.startswith("rS "))
    assert row.split() == ["rS", "0", "completed", "r-rS"]
    assert not any(line.startswith("rA ") for line in out.splitlines())


def test_status_json_is_the_status_object(gym, one_unacked):
    code, out, _ = run(gym.url, json=True)
    assert code == 0
    report = StatusReport.model_validate(json.loads(out))
    assert report.completed_unacknowledged == 1
    assert [a.key for a in report.completed_unacknowledged_attempts] == [("rS", 0)]


def test_status_limit_cuts_the_list(gym, one_unacked):
    code, out, _ = run(gym.url, limit=0)
    assert code == 0 and "and 1 more" in out and "rS " not in out


def test_wrong_token_is_refused_with_exit_2(gym):
    code, out, err = run(gym.url, token="wrong")
    assert (code, out) == (2, "") and "refused the control-plane token" in err


def test_unreachable_server_exits_1_within_its_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    started = time.monotonic()
    code, _, err = run(f"http://127.0.0.1:{port}", timeout_s=1.0)
    assert code == 1 and ("could not be reached" in err or "did not answer" in err)
    assert "Connect call failed" in err or "DeadlineExceeded" in err  # the cause, in full
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("kw", [{"url": "ftp://x"}, {"checkpoint_id": "bad id"}])
def test_bad_arguments_exit_2(gym, kw):
    code, _, err = run(kw.pop("url", gym.url), **kw)
    assert code == 2 and err.startswith("rl-gym-actors status: ") and err.count("\n") == 1


@pytest.mark.slow
def test_the_installed_command_line_prints_the_table(gym, one_unacked):
    env = {**os.environ, "RL_GYM_CONTROL_TOKEN": "test-token"}
    proc = subprocess.run(
        [sys.executable, "-m", "rl_gym_actors.cli", "status", gym.url],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert field(proc.stdout, "completed_unacknowledged") == "1"
