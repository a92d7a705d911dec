"""Waiting until a condition holds, with a deadline: the one poll loop that tests, examples and
benchmarks share.

Poll only what gives no signal of its own (a server's status, another process's state, a Ray
actor's snapshot). Both helpers call ``probe`` until it returns something truthy and return that
value, so a test can wait for a status and then assert on the status it got. At the deadline they
raise :class:`TimeoutError` naming ``what`` and the last value seen.

Every deadline a test waits on comes from here, scaled by the machine's load: :func:`scaled`
multiplies a deadline by :func:`load_factor` (the 1-minute load average per CPU, at least 1, at
most :data:`MAX_LOAD_FACTOR`; ``$RLGA_TEST_TIME_SCALE`` sets it outright), and :func:`soon` is
``time.time() + scaled(seconds)`` for the wire's ``deadline_ts``. ``wait_for`` and ``until`` scale
their own ``timeout_s``. A deadline a test *expects to pass* (the failure under test) is never
scaled: only the happy path's.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.01
MAX_LOAD_FACTOR = 8.0
SCALE_ENV = "RLGA_TEST_TIME_SCALE"


def load_factor() -> float:
    """How much slower than a quiet machine this one runs now: ``$RLGA_TEST_TIME_SCALE`` when
    set, else the 1-minute load average per CPU, clamped to [1, MAX_LOAD_FACTOR]."""
    forced = os.environ.get(SCALE_ENV)
    if forced:
        return max(float(forced), 0.01)
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return 1.0
    return min(max(1.0, per_cpu), MAX_LOAD_FACTOR)


def scaled(seconds: float) -> float:
    """A happy-path deadline of ``seconds`` on a quiet machine, stretched by the load."""
    return seconds * load_factor()


def soon(seconds: float = DEFAULT_TIMEOUT_S) -> float:
    """An absolute ``deadline_ts`` (epoch seconds) ``scaled(seconds)`` from now."""
    return time.time() + scaled(seconds)


def wait_for(
    probe: Callable[[], T],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    what: str = "condition",
) -> T:
    """Blocking: call ``probe`` until its result is truthy; return that result."""
    timeout_s = scaled(timeout_s)
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
    timeout_s = scaled(timeout_s)
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
