"""A durable store whose writes fail on demand, for tests of a server whose disk fails.

:class:`FaultyStore` is the real :class:`~rl_gym_actors.gym.store.SqliteStore` with one hook: a
write (one transaction) raises :class:`InjectedWriteFault` while faults are planned. Plan them
with :meth:`FaultyStore.fail_next` (the next ``n`` writes) or :meth:`FaultyStore.fail_always`,
and end them with :meth:`FaultyStore.heal`. Thread-safe (the writer thread reads the plan).
"""

from __future__ import annotations

import threading

from rl_gym_actors.gym.store import Record, SqliteStore


class InjectedWriteFault(OSError):
    """The planned failure of one store write."""


class FaultyStore(SqliteStore):
    """A SQLite store with planned write failures (see the module docstring)."""

    def __init__(self, state_dir) -> None:
        self._plan_lock = threading.Lock()
        self._fail_left = 0
        self._fail_always = False
        self.failed_writes = 0
        super().__init__(state_dir)

    def fail_next(self, n: int = 1) -> None:
        with self._plan_lock:
            self._fail_left = n

    def fail_always(self) -> None:
        with self._plan_lock:
            self._fail_always = True

    def heal(self) -> None:
        with self._plan_lock:
            self._fail_left, self._fail_always = 0, False

    def _write(self, records: list[Record]) -> None:
        with self._plan_lock:
            fail = self._fail_always or self._fail_left > 0
            if fail:
                self._fail_left = max(0, self._fail_left - 1)
                self.failed_writes += 1
        if fail:
            raise InjectedWriteFault("injected store write fault")
        super()._write(records)
