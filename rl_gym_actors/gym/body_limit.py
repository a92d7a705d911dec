"""The request body limit of every route, checked in front of the whole app (extensions, metrics,
hot routes and framework alike), before anything reads a byte of the body.

:class:`BodyLimit` answers 413 ``payload_too_large`` to a request whose ``Content-Length`` is over
the limit without calling the app (the body is never read: the connection then closes, see
:mod:`rl_gym_actors.gym.connections`), and 400 ``invalid_request`` to an unreadable one. A body
without a length (``Transfer-Encoding: chunked``) is counted as the app reads it: past the limit
the 413 goes out at once (unless the app answered already), the app's next read says the client
is gone, and nothing more is read. A body with a length is held to it by the HTTP parser, so it
passes unwrapped.

The routes keep their own check (:func:`rl_gym_actors.gym.web.read_limited`, the same limit):
this one is what makes it hold for every route and extension, whatever reads the body first.
"""

from __future__ import annotations

from typing import Any

from rl_gym_actors.errors import GymError, GymRejected, InvalidRequest
from rl_gym_actors.gym.web import gym_error_parts

Scope = dict[str, Any]
Message = dict[str, Any]

PAYLOAD_TOO_LARGE = "payload_too_large"
_DISCONNECT: Message = {"type": "http.disconnect"}


def too_large(limit: int, length: int | None = None) -> GymRejected:
    said = "body" if length is None else f"body of {length} bytes"
    return GymRejected(
        f"{said} is over the limit of {limit} bytes", status=413, code=PAYLOAD_TOO_LARGE
    )


def declared_length(scope: Scope) -> tuple[int | None, bool]:
    """The request's ``Content-Length`` (None: none) and whether it says chunked; raises
    :class:`InvalidRequest` (400) for a length that is no plain decimal number."""
    length: int | None = None
    chunked = False
    for key, value in scope["headers"]:
        if key == b"content-length":
            if not (value.isdigit() and len(value) <= 19) or (
                length is not None and length != int(value)
            ):
                raise InvalidRequest("invalid Content-Length", status=400)
            length = int(value)
        elif key == b"transfer-encoding":
            chunked = True
    return length, chunked


async def send_error(send: Any, exc: GymError) -> None:
    """``exc`` answered as every route of ours answers it."""
    status, body, headers = gym_error_parts(exc)
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    raw += [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: no request body over ``max_body_bytes`` reaches ``app`` (see the module
    docstring)."""

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            length, chunked = declared_length(scope)
            if length is not None and length > self.limit:
                raise too_large(self.limit, length)
        except GymError as exc:
            await send_error(send, exc)  # before anything reads the body
            return
        if not chunked:  # no body, or one the parser holds to its declared length
            await self.app(scope, receive, send)
            return
        await self._counted(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Any, send: Any) -> None:
        limit = self.limit
        read = 0
        cut = started = answered = False  # answered: the 413 went out in the app's place

        async def counted_receive() -> Message:
            nonlocal read, cut, answered
            if cut:
                return _DISCONNECT
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > limit:  # cut here: nothing more is read, the app is told it is over
                    cut = True
                    if not started:
                        answered = True
                        await send_error(send, too_large(limit))
                    return _DISCONNECT
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted_receive, guarded_send)
