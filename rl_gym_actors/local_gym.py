"""A Gym server of your own on this machine, for trying the package and for small setups.

:func:`local_gym_server` starts ``rl-gym-actors gym serve`` in a child process on a free
loopback port and stops it on exit::

    from rl_gym_actors import Orchestrator, local_gym_server

    with local_gym_server(agent="simulated") as gym:
        with Orchestrator([gym.endpoint]) as orch:
            outcomes = orch.run_batch([{"reward": 1.0}])

It is the same server as the command (``rl-gym-actors gym serve --host 127.0.0.1 --port 0``):
it prints its URL as one JSON line once it accepts requests, which is what the helper waits
for. The token is the one given, else ``$RL_GYM_CONTROL_TOKEN``, else one the server generates
(read from that line). Nothing here is needed against a Gym server you run yourself: pass its
``GymEndpoint(url=..., token=...)`` to the orchestrator.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rl_gym_actors.config import TOKEN_ENV, GymEndpoint
from rl_gym_actors.errors import ConfigError

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class LocalGymError(ConfigError):
    """The local Gym server did not start (its log's last lines are in the message)."""


@dataclass(frozen=True)
class LocalGym:
    """A running local Gym server: its URL, control token, process id and log file."""

    url: str
    token: str
    pid: int
    log_path: Path  # the server's stderr (removed when the block ends)

    @property
    def endpoint(self) -> GymEndpoint:
        return GymEndpoint(url=self.url, token=self.token)


@contextmanager
def local_gym_server(
    agent: str = "simulated",
    *,
    token: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    args: Sequence[str] = (),
    start_timeout_s: float = START_TIMEOUT_S,
) -> Iterator[LocalGym]:
    """Run ``rl-gym-actors gym serve --agent AGENT`` on 127.0.0.1 (a free port) while the block
    runs. ``agent``: ``simulated``, a Python ``module:function`` or an upstream ``http(s)://``
    agent. ``state_dir`` keeps replies across restarts (SQLite); ``args`` are further
    ``gym serve`` flags. Raises :class:`LocalGymError` when the server does not start."""
    cmd = [sys.executable, "-m", "rl_gym_actors.cli", "gym", "serve"]
    cmd += ["--host", "127.0.0.1", "--port", "0", "--agent", agent]
    if token:
        cmd += ["--token", token]
    if state_dir is not None:
        cmd += ["--state-dir", os.fspath(state_dir)]
    cmd += list(args)
    fd, log_name = tempfile.mkstemp(prefix="rlga-gym-", suffix=".log")
    log_path = Path(log_name)
    with open(fd, "w") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True
        )
    try:
        info = _first_line(proc, start_timeout_s, log_path)
        gym = LocalGym(
            url=info["url"],
            token=token or info.get("token") or os.environ.get(TOKEN_ENV, ""),
            pid=proc.pid,
            log_path=log_path,
        )
        yield gym
    finally:
        _stop(proc)
        log_path.unlink(missing_ok=True)


def first_line(proc: subprocess.Popen[str], timeout_s: float) -> str | None:
    """The first line ``proc`` prints (``gym serve`` prints one JSON line once it serves), read
    in a thread so that the wait has a deadline; None when it exits first. ``TimeoutError``
    when nothing came within ``timeout_s``."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name=f"gym-stdout-{proc.pid}", daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        raise TimeoutError(f"no line within {timeout_s:g}s") from None


def _first_line(proc: subprocess.Popen[str], timeout_s: float, log: Path) -> dict[str, str]:
    try:
        line = first_line(proc, timeout_s)
    except TimeoutError:
        raise LocalGymError(
            f"the local Gym server printed no URL within {timeout_s:g}s; log {log}: {_tail(log)}"
        ) from None
    if line is None:
        raise LocalGymError(
            f"the local Gym server exited ({proc.wait()}) before it was ready: {_tail(log)}"
        )
    info: dict[str, str] = json.loads(line)
    return info


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text().strip().splitlines()[-3:])
    except OSError:
        return "<no log>"


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
