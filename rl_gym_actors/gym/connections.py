"""What one connection may hold of the server: read timeouts, an idle limit and a connection cap,
kept by the HTTP protocol itself (uvicorn has a keep-alive timeout and a concurrency limit, but
no read timeout, no limit on a connection that never sent a byte, and an unnamed plain-text 503).

:class:`ConnectionLimits` are the knobs (``gym serve --header-timeout-s``, ``--body-timeout-s``,
``--idle-timeout-s``, ``--max-connections``; ``GymServer(limits=...)``). :func:`guarded_protocol`
is uvicorn's HTTP protocol (httptools or h11) with them kept:

- **idle**: a connection with no request under way (a fresh one, or one whose answer went out) is
  closed after ``idle_timeout_s``;
- **headers**: from a request's first byte, its headers must be in within ``header_timeout_s``
  (and within :data:`MAX_HEADER_BYTES`), else 408 ``request_header_timeout`` (431
  ``request_header_too_large``) and the connection closes;
- **body**: from the headers, the whole body must be in within ``body_timeout_s``, else 408
  ``request_body_timeout``, the app's next read says the client is gone, and the connection
  closes;
- a request read in full has no timeout at all: a ``/run`` whose agent works for minutes holds
  its connection for as long as it works;
- **cap**: a connection accepted while ``max_connections`` are open is answered 503
  ``too_many_connections`` to its first request and closed (the header timeout still holds it).

A request answered before its body was all read (a 413, a refusal, a timeout) is not kept alive:
the answer goes out, the write side closes, nothing more is read, and the connection closes
:data:`LINGER_S` later, so that the client reads its answer before the reset that closing on
unread bytes sends.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

TOO_MANY_CONNECTIONS = "too_many_connections"
HEADER_TIMEOUT = "request_header_timeout"
BODY_TIMEOUT = "request_body_timeout"
HEADER_TOO_LARGE = "request_header_too_large"

MAX_HEADER_BYTES = 64 * 1024  # a request line and headers larger than this are refused (431)
LINGER_S = 1.0  # after an answer to a request whose body was not read: drop input this long

_IDLE, _HEADERS, _BODY, _APP = "idle", "headers", "body", "app"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The connection knobs of a :class:`~rl_gym_actors.gym.server.GymServer` (see the module
    docstring). The defaults serve thousands of rollouts in flight: each holds one ``/run``
    connection for as long as its agent works, which no timeout here cuts."""

    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 5.0  # uvicorn's keep-alive default; our clients reuse for 2 s
    max_connections: int = 10_000

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if isinstance(self.max_connections, bool) or not (
            isinstance(self.max_connections, int) and self.max_connections > 0
        ):
            raise ValueError(
                f"max_connections must be a positive integer, not {self.max_connections!r}"
            )


def _error_bytes(status: int, reason: str, code: str, detail: str) -> bytes:
    body = json.dumps({"error": {"code": code, "detail": detail}}, separators=(",", ":")).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


async def refuse_connection(scope: Any, receive: Any, send: Any) -> None:
    """The app of a connection over the cap: 503 ``too_many_connections``, the body unread."""
    body = json.dumps(
        {
            "error": {
                "code": TOO_MANY_CONNECTIONS,
                "detail": "the server holds as many connections as it takes; try again later",
            }
        },
        separators=(",", ":"),
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Guard:
    """The limits, over either of uvicorn's HTTP/1.1 protocols (the attributes used here,
    ``transport``, ``flow``, ``cycle``, ``connections``, ``app``, are common to both)."""

    limits: ConnectionLimits
    transport: Any
    flow: Any
    cycle: Any
    connections: Any
    app: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._phase = _IDLE
        self._header_bytes = 0
        self._lingering = False
        self._refused = False

    # ------------------------------------------------------------ the connection

    def connection_made(self, transport: Any) -> None:
        if len(self.connections) >= self.limits.max_connections:
            self._refused = True
            self.app = refuse_connection  # its first request gets the named refusal
        super().connection_made(transport)  # type: ignore[misc]
        self._enter(_IDLE)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is out: what still comes is dropped
        if self._phase == _IDLE:
            self._enter(_HEADERS)
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing() or self._lingering:
            return
        if self._phase == _HEADERS:
            if self.cycle is not before and self.cycle is not None:
                self._enter(_BODY if self.cycle.more_body else _APP)
            else:
                self._header_bytes += len(data)
                if self._header_bytes > MAX_HEADER_BYTES:
                    self._close_with(
                        431,
                        "Request Header Fields Too Large",
                        HEADER_TOO_LARGE,
                        f"the request line and headers are over {MAX_HEADER_BYTES} bytes",
                    )
        elif self._phase == _BODY and self.cycle is not None and not self.cycle.more_body:
            self._enter(_APP)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if (
            self._refused or (cycle is not None and cycle.more_body)
        ) and not self.transport.is_closing():
            self._linger()
            return
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        cycle = self.cycle  # a pipelined request may have started meanwhile
        if cycle is not None and not cycle.response_complete:
            self._enter(_BODY if cycle.more_body else _APP)
        else:
            self._enter(_IDLE)

    # ------------------------------------------------------------ timers

    def _enter(self, phase: str) -> None:
        self._cancel()
        self._phase = phase
        self._header_bytes = 0
        limits = self.limits
        after = {
            _IDLE: limits.idle_timeout_s,
            _HEADERS: limits.header_timeout_s,
            _BODY: limits.body_timeout_s,
        }.get(phase)
        if after is not None:
            self._timer = self._loop.call_later(after, self._expired, phase)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, phase: str) -> None:
        self._timer = None
        if self.transport.is_closing() or phase != self._phase:
            return
        if phase == _IDLE:
            self.transport.close()
        elif phase == _HEADERS:
            self._close_with(
                408,
                "Request Timeout",
                HEADER_TIMEOUT,
                f"the request headers took over {self.limits.header_timeout_s:g} s",
            )
        elif phase == _BODY:
            cycle = self.cycle
            if cycle is not None and cycle.response_started:
                self.transport.close()
                return
            self._close_with(
                408,
                "Request Timeout",
                BODY_TIMEOUT,
                f"the request body took over {self.limits.body_timeout_s:g} s",
            )

    def _close_with(self, status: int, reason: str, code: str, detail: str) -> None:
        """Answer ``status`` in the app's place (the app's next read: the client is gone;
        anything it sends after is dropped), then close."""
        self._cancel()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.write(_error_bytes(status, reason, code, detail))
        self._linger()

    def _linger(self) -> None:
        """Close the write side once the answer is out, stop reading, and close after
        LINGER_S: the client has that long to read its answer before the reset that closing
        on unread bytes sends. Nothing more is read (what came in meanwhile is dropped)."""
        self._cancel()
        self._lingering = True
        self.flow.pause_reading()
        try:
            if self.transport.can_write_eof():
                self.transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            # the transport refused the half-close (already closing, or a socket error): there
            # is nothing to linger for, so it is closed now (the answer was written before)
            self.transport.close()
            return
        self._timer = self._loop.call_later(LINGER_S, self.transport.close)


class GuardedHttpTools(_Guard, HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ConnectionLimits` kept."""


class GuardedH11(_Guard, H11Protocol):
    """uvicorn's h11 protocol with :class:`ConnectionLimits` kept."""


def guarded_protocol(http: str, limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's ``http`` protocol class (``httptools`` or ``h11``) keeping ``limits``."""
    base = {"httptools": GuardedHttpTools, "h11": GuardedH11}[http]
    return type(base.__name__, (base,), {"limits": limits})


def limits_from_args(args: Any) -> ConnectionLimits:
    """The :class:`ConnectionLimits` that ``gym serve``'s flags set (its parsed arguments)."""
    return ConnectionLimits(
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        idle_timeout_s=args.idle_timeout_s,
        max_connections=args.max_connections,
    )
