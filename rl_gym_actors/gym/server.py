"""Serving a Gym participant over HTTP: uvicorn on a socket bound first, clean shutdown.

:class:`GymServer` is the one server class of every protocol: it serves ``app_factory(participant,
token=..., max_body_bytes=..., extensions=...)`` (the protocol's app; by default the
agent-checkpoint one, :func:`rl_gym_actors.gym.agent_checkpoint.routes.create_app`; v2's is
:func:`rl_gym_actors.gym.v2.routes.create_app`) on a socket it binds itself (port 0: a free port,
known before serving starts), from the CLI (``rl-gym-actors gym serve``) or in-process. The
participant is anything :class:`Served`. ``extensions`` (:class:`~rl_gym_actors.gym.web.Extension`)
wrap the app in middleware its routes never see. :func:`bind_socket`, :func:`http_protocol`,
:func:`resolve_token` and :func:`run_event_loop` are the serving parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

import uvicorn
from fastapi import FastAPI

from rl_gym_actors.config import TOKEN_ENV
from rl_gym_actors.gym.agent_checkpoint.routes import create_app
from rl_gym_actors.gym.body_limit import BodyLimit
from rl_gym_actors.gym.clock import Clock, ServerTimeHeaders
from rl_gym_actors.gym.connections import ConnectionLimits, guarded_protocol
from rl_gym_actors.gym.web import DEFAULT_MAX_BODY_BYTES, Extension

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "AppFactory",
    "ConnectionLimits",
    "GymServer",
    "Served",
    "bind_socket",
    "create_app",
    "http_protocol",
    "resolve_token",
    "run_event_loop",
    "serve",
    "serve_async",
]


class Served(Protocol):
    """What :class:`GymServer` needs of a participant: its lifecycle."""

    async def start(self) -> None:
        """In the serving loop, before the first request."""

    async def stop_runs(self) -> None:
        """First thing in shutdown: cancel running work, answer its callers."""

    async def aclose(self) -> None:
        """After serving: close what it holds (its store included)."""

    def crash(self) -> None:
        """Stop writing at once, as a crash would (for in-process restart tests)."""


class AppFactory(Protocol):
    """A protocol's app: its routes around ``participant``, guarded by ``token``."""

    def __call__(
        self,
        participant: Any,
        *,
        token: str,
        max_body_bytes: int,
        extensions: Sequence[Extension],
    ) -> FastAPI: ...


def resolve_token(token: str | None) -> tuple[str, str]:
    """The control token and where it came from: ``flag``, ``env`` or ``generated``."""
    if token:
        return token, "flag"
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV], "env"
    return secrets.token_urlsafe(32), "generated"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(
        family, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # IPPROTO_TCP: asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def http_protocol(choice: str = "auto") -> str:
    """uvicorn's HTTP/1.1 implementation: ``httptools`` (faster) when installed, else ``h11``."""
    if choice != "auto":
        return choice
    try:
        import httptools  # noqa: F401  (only whether it imports)
    except ImportError:
        return "h11"
    return "httptools"


def run_event_loop(main: Coroutine[Any, Any, Any], choice: str = "auto") -> Any:
    """Run ``main`` to completion on uvloop (when installed and ``choice`` allows), else on
    asyncio's own loop."""
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.run(main)
    return asyncio.run(main)


_log = logging.getLogger(__name__)
_SHUTDOWN_POLL_S = 0.005  # how often a stopping server looks whether its connections are gone


class _Uvicorn(uvicorn.Server):
    """uvicorn with hooks: ``on_ready`` once it accepts requests, ``before_shutdown`` first thing
    in shutdown (so runs are cancelled and their callers answered instead of awaited), and its
    own signal handling (exit status 0 on SIGTERM and Ctrl-C, instead of re-raising the signal)."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        handle_signals: bool,
        on_ready: Callable[[], None] | None,
        before_shutdown: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(config)
        self._handle_signals = handle_signals
        self._on_ready = on_ready
        self._before_shutdown = before_shutdown
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        """uvicorn's tick loop (every 0.1 s), except that :meth:`request_exit` wakes it at once
        instead of at the next tick."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    def request_exit(self, *, force: bool = False) -> None:
        """Stop serving (safe from any thread); ``force``: without waiting for connections."""
        if force:
            self.force_exit = True
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake.set)

    @contextlib.contextmanager
    def capture_signals(self):
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        # a second signal: stop waiting for connections
        self.request_exit(force=self.should_exit)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_ready is not None:
            self._on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Runs stopped first (``before_shutdown``); then as uvicorn's own shutdown, but waiting
        on what is left by short polls instead of a fixed 0.1 s pause first (a server stopped
        with nothing in flight is gone in milliseconds; tests stop hundreds): stop listening,
        ask every connection to close once its answer is out, wait up to the graceful timeout
        for the connections and their requests, then cancel the requests still running."""
        await self._before_shutdown()
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        graceful = self.config.timeout_graceful_shutdown
        loop = asyncio.get_running_loop()
        deadline = None if graceful is None else loop.time() + graceful
        while (state.connections or state.tasks) and not self.force_exit:
            if deadline is not None and loop.time() >= deadline:
                _log.warning(
                    "graceful shutdown timed out: %d request(s) cancelled", len(state.tasks)
                )
                for task in list(state.tasks):
                    task.cancel(msg="graceful shutdown timed out")
                break
            await asyncio.sleep(_SHUTDOWN_POLL_S)
        if not self.force_exit:
            await self.lifespan.shutdown()


class GymServer:
    """One participant served over HTTP by its protocol's ``app_factory``. Bind happens at
    construction, so ``url`` is known before :meth:`serve`; :meth:`serve` runs until
    :meth:`stop` (or a signal, with ``handle_signals``) and then closes the participant (its
    store included). Every answer carries the server's time from ``clock`` (the participant's;
    see :mod:`rl_gym_actors.gym.clock`). No request body over ``max_body_bytes`` reaches
    the app (:mod:`rl_gym_actors.gym.body_limit`); ``limits`` are each connection's timeouts
    and the connection cap (:class:`~rl_gym_actors.gym.connections.ConnectionLimits`; its
    defaults when None)."""

    def __init__(
        self,
        participant: Any,
        *,
        token: str,
        app_factory: AppFactory = create_app,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        extensions: Sequence[Extension] = (),
        log_level: str = "warning",
        handle_signals: bool = False,
        graceful_s: float = 5.0,
        http: str = "auto",
        clock: Clock = time.time,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.participant = participant
        self.token = token
        self.app = app_factory(
            participant, token=token, max_body_bytes=max_body_bytes, extensions=extensions
        )
        self.socket = bind_socket(host, port)
        bound_host, bound_port = self.socket.getsockname()[:2]
        self.port = bound_port
        self.url = (
            f"http://[{bound_host}]:{bound_port}"
            if ":" in bound_host
            else f"http://{bound_host}:{bound_port}"
        )
        self.limits = limits = ConnectionLimits() if limits is None else limits
        config = uvicorn.Config(
            # x-gym-time and Date from the server's clock, on every answer; inside them, no body
            # over the limit reaches anything of the app (extensions included)
            ServerTimeHeaders(BodyLimit(self.app, max_body_bytes), clock),
            date_header=False,
            log_config=None,
            log_level=log_level.lower(),
            access_log=False,
            lifespan="off",
            proxy_headers=False,  # nothing here reads the client's address or scheme
            # uvicorn's protocol with read timeouts, an idle limit and a connection cap
            http=guarded_protocol(http_protocol(http), limits),
            # (annotated int; uvicorn hands it to call_later, which takes a float)
            timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
            loop="asyncio",
            # annotated int, but uvicorn only hands it to asyncio.wait_for, which takes a float
            timeout_graceful_shutdown=graceful_s,  # type: ignore[arg-type]
            backlog=2048,
        )
        self._handle_signals = handle_signals
        self._config = config
        self._uvicorn: _Uvicorn | None = None
        self._asked_to_stop = False  # stop() or kill(): a thread that ends then is no failure

    async def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        self._uvicorn = _Uvicorn(
            self._config,
            handle_signals=self._handle_signals,
            on_ready=on_ready,
            before_shutdown=self.participant.stop_runs,
        )
        await self.participant.start()
        try:
            await self._uvicorn.serve(sockets=[self.socket])
        finally:
            self.socket.close()
            await self.participant.aclose()

    def serve_in_thread(self, timeout_s: float, *, name: str | None = None) -> threading.Thread:
        """Serve in a daemon thread with an event loop of its own; return once requests are
        accepted. Raises RuntimeError (from what failed) when it does not start in time."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                asyncio.run(self.serve(on_ready=ready.set))
            except BaseException as exc:  # surfaced below, or by the caller's join
                failed.append(exc)
                if ready.is_set():  # it served, then failed: nobody joins a daemon thread
                    _log.error("the Gym server on %s failed", self.url, exc_info=exc)
            else:
                if ready.is_set() and not self._asked_to_stop:
                    _log.error("the Gym server on %s stopped serving unasked", self.url)
            finally:
                ready.set()

        thread = threading.Thread(target=serve, name=name or f"gym-server-{self.port}", daemon=True)
        thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"Gym server thread not ready within {timeout_s}s")
        if failed or not thread.is_alive():
            raise RuntimeError(
                f"Gym server thread failed to start: {failed[0] if failed else 'exited'!r}"
            ) from (failed[0] if failed else None)
        return thread

    def stop(self) -> None:
        """Ask the server to shut down (safe from any thread)."""
        self._asked_to_stop = True
        if self._uvicorn is not None:
            self._uvicorn.request_exit()

    def kill(self) -> None:
        """Stop as a crash would: the store stops writing at once, nothing is shut down
        gracefully. For in-process tests of a restart (safe from any thread)."""
        self._asked_to_stop = True
        self.participant.crash()
        if self._uvicorn is not None:
            self._uvicorn.request_exit(force=True)


async def serve_async(
    participant: Served,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    on_ready: Callable[[str], None] | None = None,
    **options: Any,
) -> None:
    """Serve ``participant`` until stopped (SIGTERM or Ctrl-C when in the main thread);
    ``on_ready(url)`` is called once requests are accepted. ``options`` as for
    :class:`GymServer`."""
    server = GymServer(
        participant,
        token=token,
        host=host,
        port=port,
        handle_signals=options.pop("handle_signals", True),
        **options,
    )
    await server.serve(on_ready=None if on_ready is None else lambda: on_ready(server.url))


def serve(participant: Served, **kwargs: Any) -> None:
    """The blocking form of :func:`serve_async`."""
    run_event_loop(serve_async(participant, **kwargs))
