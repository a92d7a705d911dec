"""A stand-in server on its own asyncio loop in a daemon thread: :class:`LoopThread`.

The base of the test proxies (:mod:`.partition`, :mod:`.real_gym`): entering the context starts
the thread and waits until the server listens, leaving it stops the loop and joins the thread.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from typing import Self


class LoopThread(abc.ABC):
    """A server served by its own event loop on a daemon thread, as a context manager.

    A subclass writes :meth:`_main`: listen on a loopback port, set ``url``, call
    ``ready.set()``, await :meth:`_stopped`, then clean up. A failure before ``ready`` is raised
    by ``__enter__`` (``RuntimeError``, naming ``_what``).
    """

    _thread_name = "loop-thread"
    _what = "the server"  # how the start error names it

    def __init__(self, *, start_timeout_s: float) -> None:
        self.url: str | None = None
        self._start_timeout_s = start_timeout_s
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> Self:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), daemon=True, name=self._thread_name
        )
        self._thread.start()
        if not ready.wait(self._start_timeout_s) or self.url is None:
            raise RuntimeError(f"{self._what} did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(self._start_timeout_s)

    def _serve(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._run(ready))
        except BaseException as exc:  # surfaced by __enter__
            self._error = exc
        finally:
            ready.set()

    async def _run(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self._main(ready)

    async def _stopped(self) -> None:
        """Until ``__exit__`` asks the loop to stop."""
        assert self._stop is not None
        await self._stop.wait()

    @abc.abstractmethod
    async def _main(self, ready: threading.Event) -> None:
        """Serve until :meth:`_stopped`; set ``ready`` once listening."""
