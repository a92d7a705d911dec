"""Local Gym servers for tests, examples and benchmarks, with one interface:

- :class:`GymServerProcess` runs ``rl-gym-actors gym serve`` in a subprocess (a real kill -9);
- :class:`GymServerThread` runs the same server in a background thread of this process (fast;
  what most tests use), and exposes its ``participant`` for in-process inspection.

Both: ``.start()`` (waits, with a deadline, until the server accepts requests), ``.url``,
``.token``, ``.endpoint`` (a :class:`~rl_gym_actors.config.GymEndpoint`), ``.kill()`` (crash),
``.stop()`` (clean shutdown), ``.restart()`` and use as a context manager. They bind 127.0.0.1,
port 0 at first; a restart asks for the same port again (so endpoints held elsewhere stay valid)
and takes a free one only if that port is gone, so read ``.url`` after a restart.
"""

from __future__ import annotations

import abc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import rl_gym_actors
from rl_gym_actors.config import TOKEN_ENV, GymEndpoint
from rl_gym_actors.gym.clock import CLOCK_OFFSET_ENV
from rl_gym_actors.local_gym import first_line
from rl_gym_actors.testing.polling import scaled

HOST = "127.0.0.1"
_PACKAGE_ROOT = str(Path(rl_gym_actors.__file__).resolve().parents[1])
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class GymServerError(RuntimeError):
    """A test server did not start or stop in time."""


class _Base(abc.ABC):
    url: str | None
    token: str | None

    @property
    def endpoint(self) -> GymEndpoint:
        if self.url is None:
            raise GymServerError("the server is not started")
        return GymEndpoint(url=self.url, token=self.token)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @abc.abstractmethod
    def start(self, timeout_s: float = START_TIMEOUT_S):
        """Start, and return once the server accepts requests (or raise GymServerError)."""

    @abc.abstractmethod
    def stop(self) -> int | None:
        """Shut down cleanly."""

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """Whether the server is up."""

    def restart(self, timeout_s: float = START_TIMEOUT_S):
        """Stop if still running (cleanly), then start again on the same state dir."""
        if self.running:
            self.stop()
        return self.start(timeout_s)


class GymServerProcess(_Base):
    """``rl-gym-actors gym serve`` in a subprocess. ``args`` are extra CLI arguments; the
    server's stderr goes to ``log_path``. ``token=None`` lets the server pick (env or generated).
    ``clock_offset_s``: the server's clock runs that far off ours (through the test-only
    ``RL_GYM_FAULT_CLOCK_OFFSET_S``, honoured with ``--allow-faults`` only).
    """

    def __init__(
        self,
        agent: str = "simulated",
        token: str | None = "test-token",
        state_dir: str | os.PathLike[str] | None = None,
        allow_faults: bool = True,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        clock_offset_s: float = 0.0,
    ) -> None:
        if clock_offset_s and not allow_faults:
            raise ValueError("a clock offset needs allow_faults (it is a fault)")
        self.agent = agent
        self.clock_offset_s = clock_offset_s  # the server's clock runs this far off (skew tests)
        self.token = token
        self.state_dir = None if state_dir is None else str(state_dir)
        self.allow_faults = allow_faults
        self.args = list(args)
        self.env = env
        self.url: str | None = None
        self.pid: int | None = None
        self.info: dict[str, Any] = {}
        self.returncode: int | None = None
        self._port = 0
        self._proc: subprocess.Popen | None = None
        # the server's stderr across restarts, for this object's life (_tail reads it back)
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="gym-server-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)

    def command(self, port: int) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "rl_gym_actors.cli",
            "gym",
            "serve",
            "--host",
            HOST,
            "--port",
            str(port),
            "--agent",
            self.agent,
        ]
        if self.token is not None:
            cmd += ["--token", self.token]
        if self.state_dir is not None:
            cmd += ["--state-dir", self.state_dir]
        if self.allow_faults:
            cmd.append("--allow-faults")
        return cmd + self.args

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> GymServerProcess:
        if self.running:
            raise GymServerError("already running")
        try:
            self._launch(self._port, timeout_s)
        except GymServerError:
            if self._port == 0:
                raise
            self._launch(0, timeout_s)  # the old port is taken: take a free one
        return self

    def _launch(self, port: int, timeout_s: float) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        if self.clock_offset_s:
            env[CLOCK_OFFSET_ENV] = repr(float(self.clock_offset_s))
        # the package as this process imports it, whether installed or not
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            self.command(port),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )
        proc = self._proc
        try:
            line = first_line(proc, scaled(timeout_s))  # stretched by the machine's load
        except TimeoutError:
            self.kill()
            raise GymServerError(f"no JSON line within {timeout_s}s; log: {self._tail()}") from None
        if line is None:
            self.returncode = proc.wait()
            raise GymServerError(
                f"server exited ({self.returncode}) before it was ready; log: {self._tail()}"
            )
        self.info = json.loads(line)
        self.url, self.pid = self.info["url"], self.info["pid"]
        self._port = int(self.url.rsplit(":", 1)[1])
        if self.token is None:
            self.token = self.info.get("token") or env.get(TOKEN_ENV)

    def _tail(self) -> str:
        try:
            return self.log_path.read_text()[-2000:]
        except OSError:
            return "<no log>"

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed or shut down."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self.returncode = self._proc.wait()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait for a clean exit (SIGKILL after ``timeout_s``). The exit status."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(scaled(timeout_s))
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self.returncode = self._proc.returncode
        return self.returncode


class InProcessServer(_Base):
    """A server of this process, served in a background thread with its own event loop by the
    ``GymServer`` that :meth:`_build` makes (``server``)."""

    server: Any
    _port: int
    _thread: threading.Thread | None

    @abc.abstractmethod
    def _build(self, port: int) -> None:
        """Make ``server`` (and set ``url``, ``_port``) on ``port`` (0: any free one)."""

    @property
    def participant(self) -> Any:
        return None if self.server is None else self.server.participant

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        if self.running:
            raise GymServerError("already running")
        try:
            self._build(self._port)
        except OSError:
            self._build(0)  # the old port is taken: take a free one
        try:
            self._thread = self.server.serve_in_thread(scaled(timeout_s))
        except RuntimeError as exc:
            raise GymServerError(str(exc)) from exc
        return self

    def _join(self, timeout_s: float) -> None:
        if self._thread is None:
            return
        self._thread.join(scaled(timeout_s))
        if self._thread.is_alive():
            raise GymServerError(f"server thread did not stop within {timeout_s}s")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Clean shutdown: runs cancelled, the store (if any) flushed and closed."""
        if self.server is not None and self.running:
            self.server.stop()
            self._join(timeout_s)

    def kill(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """As a crash: what is not durable yet is lost, and no shutdown step writes anything."""
        if self.server is not None and self.running:
            self.server.kill()
            self._join(timeout_s)


class GymServerThread(InProcessServer):
    """The server in a background thread with its own event loop. ``agent`` may also be an
    async callable. ``kill()`` stops the store as a crash would (nothing more is written) and
    drops the server without a graceful shutdown."""

    token: str  # always given (a thread has no environment of its own to pick one from)

    def __init__(
        self,
        agent: Any = "simulated",
        token: str = "test-token",
        state_dir: str | os.PathLike[str] | None = None,
        allow_faults: bool = True,
        args: Sequence[str] = (),
        max_body_bytes: int | None = None,
        store_factory: Any = None,
        clock_offset_s: float = 0.0,
        extensions: Sequence[Any] = (),
    ) -> None:
        self.agent = agent
        self.extensions = list(extensions)  # more gym.web.Extension (e.g. testing.hold)
        self.clock_offset_s = clock_offset_s  # the server's clock runs this far off (skew tests)
        self.token = token
        self.state_dir = None if state_dir is None else str(state_dir)
        self.allow_faults = allow_faults
        self.args = list(args)  # `gym serve` arguments (all but host/port/agent)
        self.max_body_bytes = max_body_bytes
        self.store_factory = store_factory  # state_dir -> a store (e.g. testing.store_faults)
        self.url: str | None = None
        self.server: Any = None
        self.faults: Any = None
        self._port = 0
        self._thread: threading.Thread | None = None

    def _build(self, port: int) -> None:
        from rl_gym_actors.cli import build_parser, participant_options
        from rl_gym_actors.gym.agent_checkpoint.faults import FaultInjector, fault_injection
        from rl_gym_actors.gym.agent_checkpoint.participant import Participant
        from rl_gym_actors.gym.agents import make_agent
        from rl_gym_actors.gym.clock import shifted
        from rl_gym_actors.gym.connections import limits_from_args
        from rl_gym_actors.gym.server import GymServer
        from rl_gym_actors.gym.store import open_store

        cli = build_parser().parse_args(["gym", "serve", *self.args])
        self.faults = FaultInjector() if self.allow_faults else None
        store = (self.store_factory or open_store)(self.state_dir)
        try:
            clock = shifted(self.clock_offset_s)
            participant = Participant(
                make_agent(self.agent), store, clock=clock, **participant_options(cli)
            )
            faults = (
                [] if self.faults is None else [fault_injection(self.faults, participant.knows)]
            )
            self.server = GymServer(
                participant,
                token=self.token,
                host=HOST,
                port=port,
                extensions=[*faults, *self.extensions],
                max_body_bytes=self.max_body_bytes or cli.max_body_bytes,
                graceful_s=2.0,
                clock=clock,
                http=cli.http,
                limits=limits_from_args(cli),
            )
        except OSError:
            store.close()
            raise
        self.url = self.server.url
        self._port = self.server.port
