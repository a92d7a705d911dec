"""Hold one control call of one checkpoint on a test's Gym server: where a fault campaign's kill
lands (:mod:`rl_gym_actors.testing.campaign`).

:class:`PhaseHold` is an :class:`~rl_gym_actors.gym.web.Extension` for
:class:`~rl_gym_actors.testing.gym_process.GymServerThread` and
:class:`~rl_gym_actors.testing.v2_server.V2ServerThread`. :meth:`PhaseHold.arm` names a call: a
``POST`` path suffix (``"/commit"``), the ``checkpoint_id`` its JSON body names, and ``when``:

- ``"before"``: the call never reaches the server's routes (not performed; after
  :meth:`release` it is answered 503 ``held``);
- ``"after"``: the server performs it, and its answer is never sent (the caller waits; after
  :meth:`release` the connection gets nothing more).

``reached`` is set once the armed call came; one call is held per :meth:`arm`, later ones pass.
Held calls wait until :meth:`release` (for good: a campaign releases them when it is done, so
that a dead trainer's held call is never answered, whatever of it outlived the kill).
Unlike :class:`~rl_gym_actors.testing.hold.HoldCalls` it reads the body, so that a campaign
holds the k-th checkpoint of a trainer and not the resume a restored trainer sends for it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any

from rl_gym_actors.gym.web import Extension

HELD = "held"
WHEN = ("before", "after")


@dataclass(frozen=True)
class Armed:
    suffix: str
    checkpoint_id: str | None  # None: any body (an ACK batch names no checkpoint)
    when: str


class PhaseHold:
    """The armed call (None: every call passes), whether it came, and the release."""

    def __init__(self) -> None:
        self.armed: Armed | None = None
        self.reached = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()

    def arm(self, suffix: str, checkpoint_id: str | None, when: str) -> None:
        """Hold the next ``POST ...suffix`` whose body names ``checkpoint_id`` (None: any
        body; ``when``:
        ``before`` or ``after`` the server performs it). Clears ``reached`` and a release."""
        if when not in WHEN:
            raise ValueError(f"when must be one of {WHEN}, not {when!r}")
        with self._lock:
            self.armed = Armed(suffix, checkpoint_id, when)
            self.reached.clear()

    def disarm(self) -> None:
        with self._lock:
            self.armed = None

    def release(self) -> None:
        """Let the held call go (``before``: answered 503; ``after``: nothing more sent)."""
        self._released.set()

    def _take(self, path: str, body: bytes) -> Armed | None:
        with self._lock:
            armed = self.armed
            if armed is None or not path.endswith(armed.suffix):
                return None
            if armed.checkpoint_id is None:
                self.armed = None
                return armed
            try:
                named = json.loads(body or b"{}").get("checkpoint_id")
            except (ValueError, AttributeError):
                return None
            if named != armed.checkpoint_id:
                return None
            self.armed = None  # one call per arm
            return armed

    async def wait_release(self) -> None:
        while not self._released.is_set():
            await asyncio.sleep(0.05)

    def extension(self) -> Extension:
        return Extension(_PhaseHoldMiddleware, {"hold": self})


class _PhaseHoldMiddleware:
    def __init__(self, app: Any, *, hold: PhaseHold) -> None:
        self.app = app
        self.hold = hold

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        hold = self.hold
        if scope["type"] != "http" or scope["method"] != "POST" or hold.armed is None:
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was in
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        armed = hold._take(scope["path"], body)
        if armed is None:
            return await self.app(scope, replay, send)
        if armed.when == "after":

            async def swallow(message: Any) -> None:
                return None  # performed: the caller never hears of it

            await self.app(scope, replay, swallow)
            hold.reached.set()
            await hold.wait_release()
            return
        hold.reached.set()
        await hold.wait_release()
        answer = json.dumps({"code": HELD, "detail": "held by the campaign"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})
