"""Every `rl-gym-actors` error is one line naming the fix, with the exit code every command
shares (rl_gym_actors.cli_support): 1 no answer, 2 refused or bad input; never a traceback."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rl_gym_actors import GymEndpoint
from rl_gym_actors.cli import main
from rl_gym_actors.config import TOKEN_ENV
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.polling import scaled, soon


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``rl-gym-actors ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own exits (--help, --version, a bad flag)
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, prefix: str) -> str:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(prefix) and "Traceback" not in err, err
    return err


@pytest.fixture(autouse=True)
def no_env_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


# ---------------------------------------------------------------- gym serve


def test_a_port_out_of_range_is_one_line(capsys):
    code, _, err = cli(capsys, "gym", "serve", "--port", "99999")
    assert code == 2
    assert "--port: must be 0-65535" in one_line(err, "rl-gym-actors gym serve: ")


def test_a_state_dir_that_is_a_file_says_to_give_a_directory(capsys, tmp_path):
    path = tmp_path / "state"
    path.write_text("not a directory")
    code, _, err = cli(capsys, "gym", "serve", "--state-dir", str(path))
    assert code == 2
    assert "is a file, not a directory: give a directory" in one_line(
        err, "rl-gym-actors gym serve"
    )


def _read_only_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        path = tmp_path / "ro"
        path.mkdir()
        path.chmod(0o555)
        return path
    # root writes through permission bits; sysfs refuses new files even to root
    path = Path("/sys/kernel")
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError:
        return path
    pytest.skip("no read-only directory for this user")


def test_a_read_only_state_dir_names_the_fix(capsys, tmp_path):
    path = _read_only_dir(tmp_path)
    code, _, err = cli(capsys, "gym", "serve", "--state-dir", str(path))
    assert code == 2
    line = one_line(err, "rl-gym-actors gym serve: ")
    assert f"--state-dir {path} is not usable" in line and "leave --state-dir out" in line


def test_a_port_in_use_names_the_fix(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = cli(capsys, "gym", "serve", "--port", str(port))
    assert code == 2
    assert "pick another --port" in one_line(
        err, f"rl-gym-actors gym serve: cannot bind 127.0.0.1:{port}"
    )


# ---------------------------------------------------------------- status and abort


def test_a_url_without_a_scheme_is_a_config_error_naming_the_fix(capsys):
    with pytest.raises(ConfigError, match=re.escape("write http://127.0.0.1:8000")):
        GymEndpoint(url="127.0.0.1:8000")
    code, _, err = cli(capsys, "status", "notaurl", "--token", "t")
    assert code == 2
    assert "has no scheme: write http://notaurl" in one_line(err, "rl-gym-actors status: ")


def test_no_token_is_worded_the_same_by_status_and_abort(capsys, gym):
    code, _, status_err = cli(capsys, "status", gym.url)
    abort_code, _, abort_err = cli(capsys, "gym", "abort", gym.url, "--checkpoint-id", "c")
    assert code == abort_code == 2
    status_line = one_line(status_err, "rl-gym-actors status: ")
    abort_line = one_line(abort_err, "rl-gym-actors gym abort: ")
    assert status_line.split(": ", 1)[1] == abort_line.split(": ", 1)[1]
    assert f"pass --token T or set ${TOKEN_ENV}" in status_line


def test_a_wrong_token_exits_2_for_status_and_abort_alike(capsys, gym):
    for argv in (["status", gym.url], ["gym", "abort", gym.url, "--checkpoint-id", "c"]):
        code, out, err = cli(capsys, *argv, "--token", "wrong")
        assert (code, out) == (2, "")
        assert "refused the control-plane token" in one_line(err, "rl-gym-actors ")


def test_abort_of_a_checkpoint_that_does_not_hold_the_server_is_refused_and_spends_nothing(
    capsys, gym
):
    """A mistyped id: exit 2, one line naming the checkpoint that holds the server (or none),
    and nothing sent: the id is not spent (it can still prepare) and the holder still holds."""
    token = ("--token", "test-token")
    code, out, err = cli(capsys, "gym", "abort", gym.url, *token, "--checkpoint-id", "cp-typo")
    assert (code, out) == (2, "")
    line = one_line(err, "rl-gym-actors gym abort: checkpoint_not_held: ")
    assert "none does" in line and "cp-typo is not spent" in line

    async def prepare(checkpoint_id: str) -> None:
        async with GymClient(gym.endpoint) as client:
            await client.prepare(checkpoint_id, deadline_ts=soon())

    async def held() -> str | None:
        async with GymClient(gym.endpoint) as client:
            caps = await client.capabilities(deadline_ts=soon())
            return None if caps is None else caps.active_checkpoint_id

    asyncio.run(prepare("cp-held"))
    try:
        code, _, err = cli(capsys, "gym", "abort", gym.url, *token, "--checkpoint-id", "cp-typo")
        assert code == 2
        assert "cp-held does (gym abort --checkpoint-id cp-held)" in one_line(err, "rl-gym")
        assert asyncio.run(held()) == "cp-held"  # still held: nothing was resumed
    finally:
        code, _, err = cli(capsys, "gym", "abort", gym.url, *token, "--checkpoint-id", "cp-held")
    assert code == 0, err
    asyncio.run(prepare("cp-typo"))  # never spent: it prepares (a spent id is stale)
    code, _, err = cli(capsys, "gym", "abort", gym.url, *token, "--checkpoint-id", "cp-typo")
    assert code == 0, err


def test_no_server_exits_1_for_status_and_abort_alike_with_either_timeout_flag(capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    for argv in (["status", url], ["gym", "abort", url, "--checkpoint-id", "c"]):
        for flag in ("--timeout-s", "--timeout"):  # --timeout: the older name, kept hidden
            code, _, err = cli(capsys, *argv, "--token", "t", flag, "0.2")
            assert code == 1
            line = one_line(err, "rl-gym-actors ")
            # refused: the cause in full, not a wait it did not do; else the deadline it did
            assert (
                "could not be reached" in line and "Connect call failed" in line
            ) or "did not answer within 0.2s" in line, line


def test_rlga_debug_adds_the_traceback_of_the_cause_above_the_one_line(capsys, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}"
    code, _, plain = cli(capsys, "status", url, "--token", "t", "--timeout-s", "2")
    assert code == 1 and "Traceback" not in plain
    monkeypatch.setenv("RLGA_DEBUG", "1")
    code, _, debug = cli(capsys, "status", url, "--token", "t", "--timeout-s", "2")
    assert code == 1
    assert debug.startswith("Traceback (most recent call last):"), debug
    assert "rl_gym_actors.errors.ConnectionLost" in debug or "DeadlineExceeded" in debug
    assert debug.splitlines()[-1] == plain.strip()  # the same one line, last


def test_help_documents_timeout_s_defaults_and_exit_codes_and_hides_the_alias(capsys):
    for argv in (["status"], ["gym", "abort"], ["ledger"]):
        code, out, _ = cli(capsys, *argv, "--help")
        assert code == 0
        out = " ".join(out.split())  # argparse wraps to the terminal's width
        assert "--timeout-s S" in out and "(default: 10)" in out
        assert "--timeout " not in out
    code, out, _ = cli(capsys, "--help")
    out = " ".join(out.split())
    assert code == 0 and "exit codes" in out and "1 no answer" in out
    code, out, _ = cli(capsys, "gym", "serve", "--help")
    out = " ".join(out.split())
    assert "(default: 0" in out and "(default: 127.0.0.1)" in out


def test_version(capsys):
    from rl_gym_actors import __version__

    code, out, _ = cli(capsys, "--version")
    assert (code, out) == (0, f"rl-gym-actors {__version__}\n")


def test_status_names_the_checkpoint_that_holds_the_server(capsys):
    from rl_gym_actors.testing.gym_process import GymServerThread

    with GymServerThread(token="t") as server:

        async def hold() -> None:
            async with GymClient(server.endpoint) as client:
                await client.prepare("dead-driver-ck", deadline_ts=soon(5))

        asyncio.run(hold())
        code, out, err = cli(capsys, "status", server.url, "--token", "t")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"Gym {server.url}"  # not the probe's own id
    held = next(line for line in lines if line.startswith("held by checkpoint"))
    assert "dead-driver-ck" in held


@pytest.mark.slow  # a subprocess
def test_a_closed_pipe_ends_quietly(gym):
    """`rl-gym-actors status URL --json | head -1`: the reader goes away before the output."""
    env = {**os.environ, TOKEN_ENV: gym.token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_gym_actors.cli", "status", gym.url, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=scaled(60)) == 0
    assert err == ""


def test_ledger_against_nothing_is_one_line_exit_1():
    # a process of its own: in the suite's process Ray is already up, and ledger would use it
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_gym_actors.cli",
            "ledger",
            "--address",
            f"127.0.0.1:{closed_port()}",
            "--timeout-s",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    code, err = done.returncode, done.stderr
    assert code == 1, err
    assert "start it (`ray start --head" in one_line(err, "rl-gym-actors ledger: nothing answers")


def test_ledger_without_an_address_picks_no_ray_by_itself():
    """Neither --address nor $RAY_ADDRESS: Ray's ``auto`` would attach to whatever Ray this
    machine runs, another user's on a shared one; ledger refuses instead, in one line, naming
    both ways to say which (a process of its own, so that no Ray of the suite's is in it)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-m", "rl_gym_actors.cli", "ledger", "--timeout-s", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(60),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr, "rl-gym-actors ledger: no Ray cluster named")
    assert "--address host:port" in line and "RAY_ADDRESS" in line


def test_require_address_is_typed_and_takes_the_environment(monkeypatch):
    from rl_gym_actors.ray_attach import NO_ADDRESS, RayAttachFailed, require_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RayAttachFailed) as caught:
        require_address(None)
    assert caught.value.reason == NO_ADDRESS
    assert require_address("127.0.0.1:7") == "127.0.0.1:7"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:8")
    assert require_address(None) == "127.0.0.1:8"
    assert require_address("127.0.0.1:7") == "127.0.0.1:7"


@pytest.mark.slow  # a Ray of its own, with token authentication on
def test_ledger_against_a_ray_with_another_token_is_one_line(tmp_path):
    from rl_gym_actors.testing.token_ray import token_ray_head

    with token_ray_head("a" * 64) as address:
        if address is None:  # Ray's own start-up timed out (a machine at load 20+): not under test
            pytest.skip("the token-authenticated Ray head did not start")
        client_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        client_env.pop("RAY_ADDRESS", None)
        client_env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        client_env["RAY_AUTH_TOKEN"] = "b" * 64
        client_env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token of this machine's
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "rl_gym_actors.cli",
                "ledger",
                "--address",
                address,
                "--timeout-s",
                str(scaled(10)),
            ],
            capture_output=True,
            text=True,
            env=client_env,
            timeout=scaled(120),
        )
        assert done.returncode == 2
        assert "refused this client's token" in one_line(
            done.stderr, "rl-gym-actors ledger: Ray at"
        )
        assert "RAY_AUTH_TOKEN" in done.stderr


def test_status_refuses_a_negative_limit_in_one_line(capsys):
    code, _, err = cli(capsys, "status", "http://127.0.0.1:1", "--limit", "-3")
    assert code == 2 and "--limit" in err and "must be >= 0, got -3" in err


def test_serving_beyond_loopback_warns_that_run_and_metrics_take_no_token(capsys):
    from rl_gym_actors.cli import warn_if_exposed

    assert warn_if_exposed("127.0.0.1") is None and warn_if_exposed("::1") is None
    text = warn_if_exposed("0.0.0.0")
    assert text is not None and "/run and GET /metrics take no token" in text
    assert capsys.readouterr().err.strip() == text
