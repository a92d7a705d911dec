"""Fault injection for the Gym server, shared by tests, examples and benchmarks.

A server started with ``--allow-faults`` (or given a :class:`FaultInjector`) honours two row
fields; without it they are ordinary row data that the simulated agent ignores:

- ``drop_reply`` (bool): the run completes and its reply is stored durably, then that FIRST answer
  is dropped: the connection closes without a complete response. Replays answer normally. This
  is a reply lost after Gym finished the run.
- ``receipt_delay_s`` (float): the first receipt request for the key answers only after that many
  seconds; later ones at once. This is RL's per-row receipt fetch timing out. The key's ``/run``
  answers carry no (ext) receipt header, so that the caller has to fetch it.

A plan is taken from the first row seen for a key; later rows for the key do not change it. The
server shows the injector only a key's first row (a key it does not know yet), so the injector
remembers no key without a plan, and a plan only until it fires: a long run costs it no memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from rl_gym_actors.protocol import ExecutionKey

DROP_REPLY = "drop_reply"
RECEIPT_DELAY_S = "receipt_delay_s"
FAULT_FIELDS = (DROP_REPLY, RECEIPT_DELAY_S)

# what uvicorn logs when an app ends a response early, as a dropped reply does on purpose
_INCOMPLETE_MESSAGE = "ASGI callable returned without completing response."


def with_faults(
    row: Mapping[str, Any], *, drop_reply: bool = False, receipt_delay_s: float | None = None
) -> dict[str, Any]:
    """A copy of ``row`` carrying the given fault fields."""
    out = dict(row)
    if drop_reply:
        out[DROP_REPLY] = True
    if receipt_delay_s is not None:
        out[RECEIPT_DELAY_S] = float(receipt_delay_s)
    return out


def without_faults(row: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``row`` without the fault fields (e.g. for a rollout's later tries)."""
    return {k: v for k, v in row.items() if k not in FAULT_FIELDS}


class _DropIncompleteLog(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _INCOMPLETE_MESSAGE


_QUIET_DROPS = _DropIncompleteLog()


class FaultInjector:
    """The server's fault hooks (see :class:`rl_gym_actors.gym.server.FaultHooks`).

    Thread-safe, since test servers may run in a thread of their own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drop: set[ExecutionKey] = set()
        self._delay: dict[ExecutionKey, float] = {}
        self.dropped = 0
        self.delayed = 0
        logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)  # added once only

    def observe_run(self, key: ExecutionKey, row: Mapping[str, Any]) -> None:
        """Called with the first ``/run`` row of a key (one the server does not know yet),
        before it is decided."""
        with self._lock:
            if row.get(DROP_REPLY) is True:
                self._drop.add(key)
            delay = row.get(RECEIPT_DELAY_S)
            if isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay > 0:
                self._delay[key] = float(delay)

    @property
    def planned(self) -> int:
        """How many keys hold a fault that has not fired yet (all the injector remembers)."""
        with self._lock:
            return len(self._drop) + len(self._delay)

    def drop_reply(self, key: ExecutionKey) -> bool:
        """True once, for the first (not replayed) answer of a key planned to drop."""
        with self._lock:
            if key in self._drop:
                self._drop.discard(key)
                self.dropped += 1
                return True
            return False

    def withhold_receipt(self, key: ExecutionKey) -> bool:
        """Whether the key's /run answers leave the receipt header out (a receipt delay is
        planned for it: the caller must fetch)."""
        with self._lock:
            return key in self._delay

    def receipt_delay(self, key: ExecutionKey) -> float:
        """The delay of the key's first receipt request, then 0."""
        with self._lock:
            delay = self._delay.pop(key, 0.0)
            self.delayed += delay > 0
            return delay
