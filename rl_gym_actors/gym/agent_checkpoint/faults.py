"""Fault injection for the agent-checkpoint server: an ASGI middleware its routes never see.

``gym serve --allow-faults`` wraps the app in :func:`fault_injection` (a
:class:`~rl_gym_actors.gym.web.Extension`); tests, examples and benchmarks use the same. Such a
server honours two row fields; without it they are ordinary row data that the simulated agent
ignores:

- ``drop_reply`` (bool): the run completes and its reply is stored durably, then that FIRST answer
  is dropped: the connection closes without a complete response. Replays answer normally. This
  is a reply lost after Gym finished the run.
- ``receipt_delay_s`` (float): the first receipt request for the key answers only after that many
  seconds (not at all if its caller hangs up first); later ones at once. This is RL's per-row
  receipt fetch timing out. The key's ``/run`` answers carry no (ext) receipt header, so that the
  caller has to fetch it. On a v2 server (no receipts) the same field holds the key's first
  kept-reply fetch (``/run?replay_only=1``, (ext)), v2's way to fetch a finished run's reply.

A plan is taken from the first row seen for a key; later rows for the key do not change it. The
server shows the injector only a key's first row (a key it does not know yet), so the injector
remembers no key without a plan, and a plan only until it fires: a long run costs it no memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rl_gym_actors.errors import GymError
from rl_gym_actors.gym.agent_checkpoint.routes import query_key, run_key
from rl_gym_actors.gym.asgi import query_params
from rl_gym_actors.gym.web import JSON, Extension, reject_constant
from rl_gym_actors.protocol import (
    CONTROL_PREFIX,
    RECEIPT_HEADER,
    REPLAYED_HEADER,
    ExecutionKey,
    too_deep,
)

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
    """The plans of the fault fields, asked by :class:`FaultMiddleware`.

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


# ---------------------------------------------------------------- the middleware

_RECEIPT_PATHS = (CONTROL_PREFIX + "/receipt", CONTROL_PREFIX + "/completion-receipt")
_RECEIPT_HEADER = RECEIPT_HEADER.lower().encode()
_REPLAY_ONLY_QUERY = b"replay_only=1"  # what the v2 client sends (ext)
_REPLAYED_HEADER = REPLAYED_HEADER.lower().encode()

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]


def _first_row(raw: bytes) -> tuple[ExecutionKey, dict[str, Any]] | None:
    """The key and row of a ``/run`` body, or None for a body the route will refuse."""
    if too_deep(raw):
        return None
    try:
        row = json.loads(raw, parse_constant=reject_constant)
        return run_key(row), row
    except (ValueError, GymError):
        return None


class FaultMiddleware:
    """Plans faults from a key's first ``/run`` row, then: leaves the receipt header out of its
    ``/run`` answers (a receipt delay is planned), ends its first fresh answer half sent
    (``drop_reply``), and holds its first receipt request (``receipt_delay_s``).

    ``known(key)`` says whether the participant knows the key (only its first row plans)."""

    def __init__(
        self, app: Any, *, injector: FaultInjector, known: Callable[[ExecutionKey], bool]
    ) -> None:
        self.app = app
        self.injector = injector
        self.known = known

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if path == "/run" and method == "POST":
            return await self._run(scope, receive, send)
        if path in _RECEIPT_PATHS and method == "GET":
            return await self._delay_receipt(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _delay_receipt(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Hold a key's first receipt request for its planned delay, or until its caller hangs
        up (a caller that gave up gets nothing, and a stopping server waits on nothing)."""
        try:
            key = query_key(query_params(scope))
        except GymError:
            return await self.app(scope, receive, send)  # the route answers 422
        delay = self.injector.receipt_delay(key)
        if delay <= 0:
            return await self.app(scope, receive, send)
        request = await receive()  # a GET's (empty) request; the next message is a disconnect
        if request["type"] == "http.disconnect" or not await _held(receive, delay):
            return None
        return await self.app(scope, _replaying(request, receive), send)

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks, more = [], True
        while more:  # the whole body (the server's body limit holds it), then handed on
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client is gone, or its body was cut at the limit (413 sent)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        replay = _replaying({"type": "http.request", "body": raw, "more_body": False}, receive)
        parsed = _first_row(raw)
        if parsed is None:
            return await self.app(scope, replay, send)
        key, row = parsed
        if not self.known(key):
            self.injector.observe_run(key, row)  # only a key's first row plans its faults
        elif scope.get("query_string", b"") == _REPLAY_ONLY_QUERY:  # v2's kept-reply fetch
            delay = self.injector.receipt_delay(key)
            if delay > 0 and not await _held(receive, delay):
                return None  # the caller hung up meanwhile
        return await self.app(scope, replay, self._answer(key, send))

    def _answer(self, key: ExecutionKey, send: Send) -> Send:
        injector = self.injector
        state: dict[str, Any] = {"drop": False}

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200:
                headers = message["headers"]
                if injector.withhold_receipt(key):
                    headers = [(k, v) for k, v in headers if k.lower() != _RECEIPT_HEADER]
                    message = {**message, "headers": headers}
                replayed = any(k.lower() == _REPLAYED_HEADER for k, _ in headers)
                if not replayed and injector.drop_reply(key):
                    state["drop"] = True
                    return  # sent with the body, announcing the whole of it
            elif message["type"] == "http.response.body" and state["drop"]:
                await _send_half(send, message.get("body", b""))
                state["drop"] = None  # nothing more goes out
                return
            if state["drop"] is None:
                return
            await send(message)

        return answer


async def _held(receive: Receive, delay: float) -> bool:
    """Wait ``delay`` s with the request read: True when held that long, False when the caller
    hung up first (the next message after a whole request is its disconnect)."""
    try:
        await asyncio.wait_for(receive(), delay)
    except TimeoutError:
        return True
    return False


def _replaying(first: Message, receive: Receive) -> Receive:
    """A ``receive`` that hands the app ``first`` (a request already read), then the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return first

    return replay


async def _send_half(send: Send, body: bytes) -> None:
    """Fault ``drop_reply``: announce the whole reply, send half of it, end the response there.
    uvicorn then closes the connection: the caller never gets a complete answer."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", JSON.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})


def fault_injection(injector: FaultInjector, known: Callable[[ExecutionKey], bool]) -> Extension:
    """The extension that makes a server honour the fault fields (``gym serve --allow-faults``);
    ``known`` is the participant's ``knows``."""
    return Extension(FaultMiddleware, {"injector": injector, "known": known}, features=("faults",))
