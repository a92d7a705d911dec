"""Waiting until a condition holds, with a deadline: the one poll loop that tests, examples and
benchmarks share.

Poll only what gives no signal of its own (a server's status, another process's state, a Ray
actor's snapshot). Both helpers call ``probe`` until it returns something truthy and return that
value, so a test can wait for a status and then assert on the status it got. At the deadline they
raise :class:`TimeoutError` naming ``what`` and the last value seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.01


def wait_for(
    probe: Callable[[], T],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    what: str = "condition",
) -> T:
    """Blocking: call ``probe`` until its result is truthy; return that result."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, value)
        time.sleep(interval_s)


async def until(
    probe: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    what: str = "condition",
) -> T:
    """In a coroutine: call ``probe`` (plain or async) until its result is truthy; return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, value)
        await asyncio.sleep(interval_s)


def _timed_out(what: str, timeout_s: float, last: Any) -> TimeoutError:
    shown = repr(last)
    if len(shown) > 300:
        shown = shown[:300] + "..."
    return TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}; last saw {shown}")
