"""Awaiting Ray call results on the orchestrator's loop with fewer cross-thread wake-ups.

``await ref`` costs, per result, a ``concurrent.futures.Future`` (its lock and condition), a
chained asyncio future and a ``call_soon_threadsafe``, each of which writes the loop's self-pipe:
one loop wake-up per result. With one rollout per actor every rollout is its own call, so that is
paid per rollout. :class:`Completions` registers a callback on the ref instead
(``ObjectRef._on_completed``, run on Ray's thread once the value is fetched); results that end
while the loop is busy queue up and are set by one wake-up. An error comes back exactly as
``await ref`` raises it: a task's error as an instance of its cause's class, Ray's own errors
(the actor died) as themselves. Without ``_on_completed`` (another Ray) it falls back to
awaiting the ref.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import deque
from typing import Any

from ray.exceptions import RayError, RayTaskError


class Completions:
    """Futures for Ray refs, set on one event loop (the first one that calls :meth:`wait`)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: deque[tuple[asyncio.Future[Any], Any]] = deque()
        self._armed = False  # a drain is scheduled on the loop
        self._lock = threading.Lock()

    def wait(self, ref: Any) -> asyncio.Future[Any]:
        """A future of ``ref``'s value on the running loop (must be this object's one loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        on_completed = getattr(ref, "_on_completed", None)
        if on_completed is None or loop is not self._loop:
            return asyncio.ensure_future(ref)
        future: asyncio.Future[Any] = loop.create_future()
        # the callback holds the ref: a ref dropped before its result would never call back
        on_completed(functools.partial(self._done, future, ref))
        return future

    def _done(self, future: asyncio.Future[Any], ref: Any, result: Any) -> None:
        """On Ray's thread: queue the result; wake the loop unless a wake-up is on its way."""
        with self._lock:
            self._ready.append((future, result))
            if self._armed:
                return
            self._armed = True
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, deque()
            self._armed = False
        for future, result in ready:
            if future.done():  # its waiter was cancelled
                continue
            if isinstance(result, RayTaskError):
                future.set_exception(result.as_instanceof_cause())
            elif isinstance(result, RayError):
                future.set_exception(result)
            else:
                future.set_result(result)
