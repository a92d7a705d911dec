"""One server per ``--state-dir``: an exclusive ``flock`` on ``<state_dir>/server.lock``.

Two servers on one state dir would both write its SQLite store and fence: each would answer for
keys the other changed. ``gym serve`` takes the lock before it opens the store and holds it for
the life of the process (the kernel drops it when the process dies, SIGKILL included, so a
crashed server never leaves a stale lock). The file holds the holder's pid, which a refused
second server names.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rl_gym_actors.errors import ConfigError

LOCK_NAME = "server.lock"


class StateDirHeld(ConfigError):
    """Another live process holds the state dir's lock; ``pid`` names it (None: unreadable)."""

    def __init__(self, state_dir: str, pid: int | None) -> None:
        self.state_dir = state_dir
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"state dir {state_dir} is held by {holder}")


class StateDirLock:
    """The held lock; :meth:`release` (or process exit) lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def lock_state_dir(state_dir: str | os.PathLike[str]) -> StateDirLock:
    """Take the state dir's lock or raise :class:`StateDirHeld` at once (never waits)."""
    directory = Path(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise StateDirHeld(str(directory), holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    os.fsync(fd)
    return StateDirLock(path, fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
