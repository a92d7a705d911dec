"""Hold a control call on a test's Gym server: the moment a test kills a trainer inside it.

:class:`HoldCalls` is an :class:`~rl_gym_actors.gym.web.Extension` for
:class:`~rl_gym_actors.testing.gym_process.GymServerThread` and
:class:`~rl_gym_actors.testing.v2_server.V2ServerThread` (``extensions=[hold.extension()]``).
A ``POST`` whose path ends with one of its suffixes (``"/commit"``: both protocols' commit route)
never reaches the server's routes: ``reached`` is set and the call waits until
:meth:`HoldCalls.release`, then answers 503 ``held`` (it is never performed); calls after the
release pass, and so do those past ``limit``. So a trainer that
sent its commit sits between its ACK (agent-checkpoint) or its prepare (v2) and the commit, for
as long as the test likes, with Gym holding the checkpoint as it would then.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from rl_gym_actors.gym.web import Extension

HELD = "held"


class HoldCalls:
    """Which calls to hold, whether one came (``reached``, ``held``), and the release."""

    def __init__(self, *suffixes: str, armed: bool = True, limit: int | None = None) -> None:
        self.suffixes = tuple(suffixes)
        self.limit = limit  # hold at most this many calls (None: every one); the rest pass
        self.reached = threading.Event()
        self.held = 0
        self._armed = threading.Event()
        self._released = threading.Event()
        if armed:
            self._armed.set()

    def arm(self) -> None:
        """Hold from now on (a hold made with ``armed=False`` lets every call pass until then)."""
        self._armed.set()

    def release(self) -> None:
        self._released.set()

    def extension(self) -> Extension:
        return Extension(_HoldMiddleware, {"hold": self})


class _HoldMiddleware:
    def __init__(self, app: Any, *, hold: HoldCalls) -> None:
        self.app = app
        self.hold = hold

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        hold = self.hold
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not scope["path"].endswith(hold.suffixes)
            or not hold._armed.is_set()
            or hold._released.is_set()
            or (hold.limit is not None and hold.held >= hold.limit)
        ):
            return await self.app(scope, receive, send)
        hold.held += 1
        hold.reached.set()
        while not hold._released.is_set():
            await asyncio.sleep(0.05)
        body = json.dumps({"code": HELD, "detail": "held by the test"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
