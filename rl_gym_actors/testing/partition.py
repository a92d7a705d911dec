"""A TCP proxy that can partition the network between a client and one server, and heal it.

:class:`PartitionProxy` forwards bytes both ways between its own loopback port and ``upstream``
(a base URL). :meth:`~PartitionProxy.partition` starts swallowing traffic: whatever either side
sends is read and dropped, and new connections are accepted but never reach the server (so a
caller sees no refusal, only silence until its own timeout, as behind a dropped route).
:meth:`~PartitionProxy.heal` ends it: every connection that lived through the partition is closed
(its stream lost bytes; a real one would end in a reset), and new ones are forwarded again.

It runs in a thread with its own event loop; use it as a context manager, with ``.url`` and
``.endpoint(token)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.testing.loop_thread import LoopThread

HOST = "127.0.0.1"
CHUNK = 1 << 16


class _Link:
    """One client connection and its upstream twin."""

    def __init__(self, writers: list[asyncio.StreamWriter]) -> None:
        self.writers = writers
        self.partitioned = False  # it lived through a partition

    def close(self) -> None:
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()


class PartitionProxy(LoopThread):
    """A forwarding TCP proxy with a switch that swallows all traffic (see the module doc)."""

    _thread_name = "partition-proxy"
    _what = "the proxy"

    def __init__(self, upstream: str, *, start_timeout_s: float = 10.0) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        super().__init__(start_timeout_s=start_timeout_s)
        self.upstream = (parts.hostname, parts.port)
        self.swallowed_bytes = 0
        self._partitioned = False
        self._links: set[_Link] = set()

    def endpoint(self, token: str | None) -> GymEndpoint:
        if self.url is None:
            raise RuntimeError("the proxy is not started")
        return GymEndpoint(url=self.url, token=token)

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def partition(self) -> None:
        """From now on, swallow every byte both ways; connections stay open and silent."""
        self._call(self._set, True)

    def heal(self) -> None:
        """Forward again; connections that lived through the partition are closed."""
        self._call(self._set, False)

    def _set(self, partitioned: bool) -> None:
        self._partitioned = partitioned
        for link in list(self._links):
            if partitioned:
                link.partitioned = True
            elif link.partitioned:
                link.close()
                self._links.discard(link)

    def _call(self, fn, *args) -> None:
        if self._loop is None:
            raise RuntimeError("the proxy is not started")
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        if not done.wait(self._start_timeout_s):
            raise RuntimeError("the proxy's loop did not answer")

    # ------------------------------------------------------------ serving

    async def _main(self, ready: threading.Event) -> None:
        server = await asyncio.start_server(self._accept, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://{HOST}:{port}"
        ready.set()
        try:
            await self._stopped()
        finally:
            server.close()
            for link in list(self._links):
                link.close()
            self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link([writer])
        link.partitioned = self._partitioned
        self._links.add(link)
        try:
            while self._partitioned and not reader.at_eof():  # nobody answers: swallow
                data = await reader.read(CHUNK)
                self.swallowed_bytes += len(data)
                if not data:
                    return
            if link.partitioned:
                return  # it lived through a partition: closed by the heal
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            link.writers.append(up_writer)
            await asyncio.gather(
                self._pipe(reader, up_writer, link), self._pipe(up_reader, writer, link)
            )
        finally:
            link.close()
            self._links.discard(link)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link
    ) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if self._partitioned or link.partitioned:
                    self.swallowed_bytes += len(data)
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.close()
