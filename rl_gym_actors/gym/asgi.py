"""Hot routes: the few routes every cycle calls, served as plain ASGI in front of the framework.

A :class:`HotRoute` answers one (method, path) from the raw request: the bearer check of a
control route, the body read under the server's limit (a POST's), then its ``handler`` on the
scope and the body bytes, and the answer sent as JSON; a
:class:`~rl_gym_actors.errors.GymError` is answered as every route of ours answers it
(:func:`~rl_gym_actors.gym.web.gym_error_parts`). Anything else raised goes up to the app's own
500 handling, as it would from a framework route.

:class:`HotRoutes` is the middleware that serves them, placed inside the app's extensions and
metrics (added as the app's first middleware), so a hot request skips the framework's routing,
request objects and dependencies but nothing its wrappers see. The same routes are also in the
app's route table (:func:`mount`), where only a request in the wrong method ever meets them (a
405 as for any route) and from which the capabilities list the routes served.

The conventions (auth, body limits, error bodies, query parsing) are
:mod:`rl_gym_actors.gym.web`'s, shared with the framework's routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from rl_gym_actors.errors import GymError
from rl_gym_actors.gym.web import check_bearer, gym_error_parts, read_limited

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# what a handler answers: the JSON body's bytes and the extra headers (None: none)
Answer = tuple[bytes, Mapping[str, str] | None]
Handler = Callable[[Scope, bytes], Awaitable[Answer]]

_JSON_HEADER = (b"content-type", b"application/json")


class ClientGone(Exception):
    """The caller hung up before its request body was read: nothing is answered."""


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lowercase bytes), as Starlette reads it."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def query_params(scope: Scope) -> dict[str, str]:
    """The query parameters, a repeated name's last value winning (as Starlette's ``get``)."""
    raw = scope.get("query_string", b"")
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True)) if raw else {}


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            raise ClientGone
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def send_json(
    send: Send, status: int, body: bytes, headers: Mapping[str, str] | None = None
) -> None:
    """A JSON answer with the headers a framework response carries, in its order."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    raw.append((b"content-length", str(len(body)).encode()))
    raw.append(_JSON_HEADER)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True, slots=True)
class HotRoute:
    """One route as plain ASGI. ``token``: the bearer token it requires (None: open);
    ``path`` is also what the metrics label it by (they read ``scope["route"].path``)."""

    method: str
    path: str
    handler: Handler
    token: bytes | None
    max_body_bytes: int

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self
        try:
            if self.token is not None:
                check_bearer(header(scope, b"authorization"), self.token)
            raw = b""
            if self.method == "POST":
                raw = await read_limited(
                    header(scope, b"content-length"), _chunks(receive), self.max_body_bytes
                )
            body, headers = await self.handler(scope, raw)
            status = 200
        except GymError as exc:
            status, body, headers = gym_error_parts(exc)
        except ClientGone:
            return
        await send_json(send, status, body, headers)


class HotRoutes:
    """ASGI middleware: serves ``routes`` by (method, path); every other request goes on to
    ``app``."""

    def __init__(self, app: Any, routes: Sequence[HotRoute]) -> None:
        self.app = app
        self._routes = {(r.method, r.path): r for r in routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._routes.get((scope.get("method", ""), scope.get("path", "")))
        if route is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await route(scope, receive, send)


def mount(app: Any, routes: Sequence[HotRoute]) -> None:
    """Serve ``routes`` first (``app``'s innermost middleware: add it before any other) and
    list them in ``app``'s route table."""
    from starlette.routing import Route

    app.add_middleware(HotRoutes, routes=routes)
    for route in routes:  # an ASGI app as endpoint: served as it is
        listed = Route(route.path, endpoint=route, methods=[route.method])
        listed.methods = {route.method}  # as the framework's own routes: no implied HEAD
        app.router.routes.append(listed)
