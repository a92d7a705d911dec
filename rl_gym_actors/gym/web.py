"""The HTTP conventions every Gym server of ours keeps, whatever its protocol: for FastAPI
routes, and framework-free for the plain-ASGI hot routes (:mod:`rl_gym_actors.gym.asgi`).

- Answers: :func:`json_response` (a wire model without its absent fields, or raw bytes) and
  :func:`error_response` (``{"error": {"code", "detail"}}``; a 401 adds ``WWW-Authenticate``).
- Errors: :func:`install_error_handlers` maps every :class:`~rl_gym_actors.errors.GymError` to
  its status and code (:func:`gym_error_parts`; its ``body`` fields join the error object,
  (ext)), FastAPI's validation errors to 422 ``invalid_request``, unknown routes to 404/405,
  and anything else to a 500 ``internal_error`` naming only the exception's type.
- Authentication: :func:`bearer_auth`, ONE FastAPI dependency that a protocol puts on each
  control route (``dependencies=[Depends(bearer_auth(token))]``); :func:`check_bearer` is its
  check.
- Request bodies: :func:`read_body` / :func:`read_limited` (413 ``payload_too_large`` past the
  limit, checked on the declared length and while streaming) and :func:`parse` (strict
  pydantic, 422 on failure).
- Extensions: :class:`Extension`, an ASGI middleware wrapped around the app (e.g.
  :func:`rl_gym_actors.gym.agent_checkpoint.faults.fault_injection`), which the routes never
  see; :func:`add_extensions` wraps them.
"""

from __future__ import annotations

import hmac
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from rl_gym_actors.errors import GymError, GymRejected, InvalidRequest, Unauthorized

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

DEFAULT_MAX_BODY_BYTES = 1 << 20
JSON = "application/json"


@dataclass(frozen=True)
class Extension:
    """An ASGI middleware class and its options, wrapped around a server's app (outside its
    routes, which never see it), and the capability names it adds."""

    middleware: Callable[..., Any]  # a class called with the app and the options
    options: Mapping[str, Any] = field(default_factory=dict)
    features: tuple[str, ...] = ()


# FastAPI's own OpenTelemetry hooks (FastAPI 0.16x on), off: ours are Prometheus
# (rl_gym_actors.metrics), and with them on every request asks OpenTelemetry whether a
# provider is configured
NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def new_app(title: str) -> FastAPI:
    """A protocol's FastAPI app: no docs, no OpenAPI, no FastAPI telemetry."""
    return FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None, **NO_TELEMETRY)


def add_extensions(app: FastAPI, extensions: Sequence[Extension]) -> None:
    """Wrap ``app`` in ``extensions``' middleware, the first outermost."""
    for extension in reversed(extensions):  # the last added is the outermost
        app.add_middleware(extension.middleware, **extension.options)


# ---------------------------------------------------------------- answers


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    if isinstance(body, BaseModel):
        raw = dumped(body)
    elif isinstance(body, bytes):
        raw = body
    else:
        raw = json.dumps(body, separators=(",", ":")).encode()
    return Response(raw, status_code=status, media_type=JSON, headers=headers)


def dumped(model: BaseModel) -> bytes:
    """A wire model's JSON without its absent (None) fields."""
    return model.model_dump_json(exclude_none=True).encode()


def error_response(status: int, code: str, detail: str, **extra: Any) -> Response:
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    return json_response({"error": {"code": code, "detail": detail}, **extra}, status, headers)


# ---------------------------------------------------------------- errors


def gym_error_parts(exc: GymError) -> tuple[int, bytes, dict[str, str] | None]:
    """A :class:`GymError`'s answer: status, body and headers (a 401 adds
    ``WWW-Authenticate``); its ``body`` fields join the error object (ext)."""
    error = {"code": exc.code, "detail": exc.detail}
    if isinstance(exc.body, Mapping):  # named fields of the error (ext)
        error.update({k: v for k, v in exc.body.items() if k not in error})
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
    return exc.status or 409, json.dumps({"error": error}, separators=(",", ":")).encode(), headers


def install_error_handlers(app: FastAPI) -> None:
    """The error bodies of every server of ours (see the module docstring)."""

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> Response:
        status, raw, headers = gym_error_parts(exc)
        return json_response(raw, status, headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(422, "invalid_request", str(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        # the client left mid-body (or a body limit or read timeout cut it): no one to answer,
        # nothing to log
        return error_response(400, "client_disconnected", "the client left before its body was in")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"{type(exc).__name__}")


# ---------------------------------------------------------------- authentication


def bearer_auth(token: str) -> Callable[[Request], None]:
    """The dependency that guards control routes: 401 ``unauthorized`` unless the request
    carries ``Authorization: Bearer <token>`` (scheme in any case; compared in constant time)."""
    if not token:
        raise ValueError("a control token is required")
    expected = token.encode()

    # sync, so FastAPI runs it on a worker thread: the async form (83c1631) left a v2 server
    # thawed after SIGSTOP unanswered to the ledger (test_chaos's v2 partition heal failed)
    def require_bearer(request: Request) -> None:
        check_bearer(request.headers.get("authorization"), expected)

    return require_bearer


def check_bearer(authorization: str | None, expected: bytes) -> None:
    """401 ``unauthorized`` unless ``authorization`` is ``Bearer <expected>``."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise Unauthorized("missing or wrong bearer token", status=401)


# ---------------------------------------------------------------- request bodies


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_body(request: Request, limit: int) -> bytes:
    return await read_limited(request.headers.get("content-length"), request.stream(), limit)


async def read_limited(length: str | None, chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """A request body of at most ``limit`` bytes: 413 ``payload_too_large`` past it, checked on
    the declared ``length`` (400 when unreadable) and while ``chunks`` stream in."""
    if length is not None:
        if not length.isdigit():
            raise InvalidRequest("invalid Content-Length", status=400)
        if int(length) > limit:
            raise GymRejected(
                f"body of {length} bytes is over the limit of {limit}",
                status=413,
                code="payload_too_large",
            )
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise GymRejected(
                f"body is over the limit of {limit} bytes", status=413, code="payload_too_large"
            )
        parts.append(chunk)
    return b"".join(parts)


def validation_detail(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


def parse(model: type[M], raw: bytes, *, strict: bool = True) -> M:
    """``raw`` as ``model``; 422 ``invalid_request`` naming each field that fails."""
    try:
        return model.model_validate_json(raw, strict=strict)
    except ValidationError as exc:
        raise InvalidRequest(validation_detail(exc), status=422) from exc
