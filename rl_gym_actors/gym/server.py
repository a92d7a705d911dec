"""The Gym server's HTTP app: routes, auth and error mapping, and nothing else (docs/PROTOCOL.md).

:func:`create_app` builds the FastAPI app around a
:class:`~rl_gym_actors.gym.agent_checkpoint.participant.Participant`;
:class:`GymServer` serves it with uvicorn on a socket it binds itself (port 0: a free port, known
before serving starts), from the CLI (``rl-gym-actors gym serve``) or in-process.

Every answer is a model of :mod:`rl_gym_actors.protocol`, sent without its absent (None)
fields. Every error body is ``{"error": {"code", "detail"}}``: 401 ``unauthorized``, 413
``payload_too_large``, 422 ``invalid_request`` for any body or query that fails validation
(integers beyond the store's 64 bits included), 404 and 405 for unknown routes, 409 for the
participant's rejections (a prepare 409 also carries the full status as ``report``; a
``checkpoint_conflict`` names ``active_checkpoint_id`` and its ``phase``), 500 ``agent_failed``,
503 ``unavailable``, ``store_write_failed`` or ``store_unavailable``. Bad input never gets a 500.
``GET /metrics`` serves the counts of :class:`rl_gym_actors.metrics.GymServerMetrics`;
``GET /ready`` answers 200 while the store takes writes, else 503 ``store_unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rl_gym_actors.config import TOKEN_ENV
from rl_gym_actors.errors import GymError, GymRejected, InvalidRequest, Unauthorized
from rl_gym_actors.gym.agent_checkpoint.participant import Participant, StoreUnavailable
from rl_gym_actors.metrics import GymServerMetrics, MetricsMiddleware
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    CAPABILITIES_PATH,
    CONTROL_PREFIX,
    MAX_JSON_DEPTH,
    RECEIPT_HEADER,
    REPLAYED_HEADER,
    ROLLOUT_ID_FIELD,
    WIRE_INT_MAX,
    AckBatchRequest,
    Capabilities,
    CommitRequest,
    CompletionReceipt,
    ExecutionKey,
    PhaseRequest,
    RetireRequest,
    is_valid_attempt_index,
    is_valid_checkpoint_id,
    is_valid_rollout_id,
    too_deep,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 20
JSON = "application/json"
READY_PATH = "/ready"
# what a server of ours does beyond its routes; "completed_result_acknowledgement" is the name
# a real Gym and NeMo RL's checkpoint client use, the others are (ext). The routes it serves are
# listed as features too, read from the app (route_features)
FEATURES = (
    "completed_result_acknowledgement",
    "run-replay",
    "replayed-header",
    "receipt-header",
    "prepare-report",
    "lenient-status-retire",
    "conflict-names-checkpoint",
)


def route_features(app: FastAPI) -> list[str]:
    """The control routes (last path segment) and ``ready`` that ``app`` serves."""
    names = []
    for route in app.routes:
        path = getattr(route, "path", "")
        if path.startswith(CONTROL_PREFIX + "/"):
            names.append(path.rsplit("/", 1)[1])
        elif path == READY_PATH:
            names.append("ready")
    return names


M = TypeVar("M", bound=BaseModel)


class FaultHooks(Protocol):
    """What the server asks a fault injector (see :mod:`rl_gym_actors.testing.faults`)."""

    def observe_run(self, key: ExecutionKey, row: Mapping[str, Any]) -> None:
        """A ``/run`` row of a key the participant does not know yet (its first row)."""

    def drop_reply(self, key: ExecutionKey) -> bool: ...
    def withhold_receipt(self, key: ExecutionKey) -> bool: ...
    def receipt_delay(self, key: ExecutionKey) -> float: ...


# ---------------------------------------------------------------- answers


def _json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    if isinstance(body, BaseModel):
        raw = body.model_dump_json(exclude_none=True).encode()
    elif isinstance(body, bytes):
        raw = body
    else:
        raw = json.dumps(body, separators=(",", ":")).encode()
    return Response(raw, status_code=status, media_type=JSON, headers=headers)


def _error_response(status: int, code: str, detail: str, **extra: Any) -> Response:
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    return _json_response({"error": {"code": code, "detail": detail}, **extra}, status, headers)


class _DroppedReply(Response):
    """Fault ``drop_reply``: announce the whole reply, send half of it, end the response there.
    uvicorn then closes the connection: the caller never gets a complete answer."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = self.body
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
        await send(
            {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
        )


# ---------------------------------------------------------------- request parsing


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise InvalidRequest("invalid Content-Length", status=400)
        if int(length) > limit:
            raise GymRejected(
                f"body of {length} bytes is over the limit of {limit}",
                status=413,
                code="payload_too_large",
            )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GymRejected(
                f"body is over the limit of {limit} bytes", status=413, code="payload_too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _validation_detail(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


def _parse(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise InvalidRequest(_validation_detail(exc), status=422) from exc


def _run_key(row: Any) -> ExecutionKey:
    if not isinstance(row, dict):
        raise InvalidRequest("a /run body must be a JSON object", status=422)
    rollout_id = row.get(ROLLOUT_ID_FIELD)
    attempt = row.get(ATTEMPT_INDEX_FIELD, 0)
    if not is_valid_rollout_id(rollout_id):
        raise InvalidRequest(
            f"{ROLLOUT_ID_FIELD}: required, matching [A-Za-z0-9][A-Za-z0-9._-]* "
            f"and at most 256 characters; got {rollout_id!r}",
            status=422,
        )
    if not is_valid_attempt_index(attempt):
        raise InvalidRequest(
            f"{ATTEMPT_INDEX_FIELD}: must be an integer in 0..{WIRE_INT_MAX}; got {attempt!r}",
            status=422,
        )
    return (rollout_id, attempt)


def _query_key(request: Request) -> ExecutionKey:
    q = request.query_params
    rollout_id, attempt = q.get("rollout_id"), q.get("attempt_index", "")
    if not is_valid_rollout_id(rollout_id):
        raise InvalidRequest(f"rollout_id: invalid {rollout_id!r}", status=422)
    if (
        not attempt.isascii()
        or not attempt.isdigit()
        or len(attempt) > 19
        or int(attempt) > WIRE_INT_MAX
    ):
        raise InvalidRequest(
            f"attempt_index: must be an integer in 0..{WIRE_INT_MAX}; got {attempt!r}", status=422
        )
    return (rollout_id, int(attempt))


# ---------------------------------------------------------------- the app


def create_app(
    participant: Participant,
    *,
    token: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    faults: FaultHooks | None = None,
    metrics: bool = True,
) -> FastAPI:
    """The HTTP app. ``token`` guards every control route; ``faults`` enables fault injection;
    ``metrics`` serves Prometheus text on ``GET /metrics`` (unauthenticated; counts only)."""
    if not token:
        raise ValueError("a control token is required")
    expected = token.encode()
    app = FastAPI(title="rl_gym_actors Gym server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.participant = participant
    if metrics:
        app.add_middleware(MetricsMiddleware, metrics=GymServerMetrics(participant.snapshot))

    def authorize(request: Request) -> None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise Unauthorized("missing or wrong bearer token", status=401)

    async def body(request: Request) -> bytes:
        raw = await _read_body(request, max_body_bytes)
        if too_deep(raw):  # refused before parsing: never a RecursionError, never a run
            raise InvalidRequest(f"body nests deeper than {MAX_JSON_DEPTH} levels", status=422)
        return raw

    # ------------------------------------------------------------ errors

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> Response:
        if exc.code == "agent_prepare_incomplete":
            return _error_response(exc.status or 409, exc.code, exc.detail, report=exc.body)
        error = {"code": exc.code, "detail": exc.detail}
        if isinstance(exc.body, Mapping):  # named fields of the error (ext)
            error.update({k: v for k, v in exc.body.items() if k not in error})
        return _json_response({"error": error}, exc.status or 409)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return _error_response(422, "invalid_request", str(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return _error_response(500, "internal_error", f"{type(exc).__name__}")

    # ------------------------------------------------------------ data plane

    @app.post("/run")
    async def run(request: Request) -> Response:
        try:
            row = json.loads(await body(request), parse_constant=_reject_constant)
        except ValueError as exc:
            raise InvalidRequest(f"body is not JSON: {exc}", status=422) from exc
        key = _run_key(row)
        if faults is not None and participant.core.state_of(key) is None:
            faults.observe_run(key, row)  # only a key's first row plans its faults
        answer = await participant.run(key, row)
        headers = (
            {}
            if faults is not None and faults.withhold_receipt(key)
            else {RECEIPT_HEADER: answer.receipt.decode("ascii")}
        )  # canonical JSON, ASCII
        if answer.replayed:
            headers[REPLAYED_HEADER] = "1"
        elif faults is not None and faults.drop_reply(key):
            return _DroppedReply(answer.reply)
        return _json_response(answer.reply, headers=headers)

    # ------------------------------------------------------------ control plane

    @app.get(READY_PATH)
    async def ready(request: Request) -> Response:
        if not participant.ready:
            raise StoreUnavailable("the store is failing its writes", status=503)
        return _json_response({"ready": True})

    @app.get(CAPABILITIES_PATH)
    async def capabilities(request: Request) -> Response:
        authorize(request)
        return _json_response(Capabilities(features=features(), **participant.capabilities()))

    def features() -> list[str]:
        return [
            *FEATURES,
            *route_features(app),
            *(["durable-store"] if participant.store.durable else []),
            *(["checkpoint-lease"] if participant.core.fence.lease_s is not None else []),
            *(["checkpoint-root"] if participant.checkpoint_root is not None else []),
            *(["faults"] if faults is not None else []),
        ]

    async def receipt(request: Request) -> Response:
        authorize(request)
        key = _query_key(request)
        delay = faults.receipt_delay(key) if faults is not None else 0.0
        if delay > 0:
            await asyncio.sleep(delay)
        return _json_response(await participant.receipt(key))

    # ours, and the name NeMo RL's checkpoint client fetches
    for name in ("/receipt", "/completion-receipt"):
        app.add_api_route(CONTROL_PREFIX + name, receipt, methods=["GET"])

    @app.get(CONTROL_PREFIX + "/status")
    async def status(request: Request) -> Response:
        authorize(request)
        checkpoint_id = request.query_params.get("checkpoint_id")
        if checkpoint_id is not None and not is_valid_checkpoint_id(checkpoint_id):
            raise InvalidRequest(f"checkpoint_id: invalid {checkpoint_id!r}", status=422)
        return _json_response(await participant.status(checkpoint_id))

    @app.post(CONTROL_PREFIX + "/acknowledge")
    async def acknowledge(request: Request) -> Response:
        authorize(request)
        receipt = _parse(CompletionReceipt, await body(request))
        return _json_response(await participant.acknowledge(receipt))

    @app.post(CONTROL_PREFIX + "/acknowledge-completed")
    async def acknowledge_completed(request: Request) -> Response:
        authorize(request)
        batch = _parse(AckBatchRequest, await body(request))
        return _json_response(await participant.acknowledge_batch(batch.executions))

    @app.post(CONTROL_PREFIX + "/retire")
    async def retire(request: Request) -> Response:
        authorize(request)
        req = _parse(RetireRequest, await body(request))
        return _json_response(
            await participant.retire(
                req.checkpoint_id, (req.rollout_id, req.attempt_index), req.deadline_ts
            )
        )

    @app.post(CONTROL_PREFIX + "/prepare")
    async def prepare(request: Request) -> Response:
        authorize(request)
        req = _parse(PhaseRequest, await body(request))
        return _json_response(await participant.prepare(req.checkpoint_id, req.deadline_ts))

    @app.post(CONTROL_PREFIX + "/commit")
    async def commit(request: Request) -> Response:
        authorize(request)
        req = _parse(CommitRequest, await body(request))
        return _json_response(
            await participant.commit(req.checkpoint_id, req.checkpoint_dir, req.deadline_ts)
        )

    @app.post(CONTROL_PREFIX + "/resume")
    async def resume(request: Request) -> Response:
        authorize(request)
        req = _parse(PhaseRequest, await body(request))
        return _json_response(await participant.resume(req.checkpoint_id))

    return app


# ---------------------------------------------------------------- serving


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
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def run_event_loop(main: Awaitable[Any], choice: str = "auto") -> Any:
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
    def capture_signals(self):  # type: ignore[override]
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
        await self._before_shutdown()
        await super().shutdown(sockets)


class GymServer:
    """One participant served over HTTP. Bind happens at construction, so ``url`` is known
    before :meth:`serve`; :meth:`serve` runs until :meth:`stop` (or a signal, with
    ``handle_signals``) and then closes the participant (its store included)."""

    def __init__(
        self,
        participant: Participant,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        faults: FaultHooks | None = None,
        log_level: str = "warning",
        handle_signals: bool = False,
        graceful_s: float = 5.0,
        metrics: bool = True,
        http: str = "auto",
    ) -> None:
        self.participant = participant
        self.token = token
        self.app = create_app(
            participant, token=token, max_body_bytes=max_body_bytes, faults=faults, metrics=metrics
        )
        self.socket = bind_socket(host, port)
        bound_host, bound_port = self.socket.getsockname()[:2]
        self.port = bound_port
        self.url = (
            f"http://[{bound_host}]:{bound_port}"
            if ":" in bound_host
            else f"http://{bound_host}:{bound_port}"
        )
        config = uvicorn.Config(
            self.app,
            log_config=None,
            log_level=log_level.lower(),
            access_log=False,
            lifespan="off",
            http=http_protocol(http),
            loop="asyncio",
            timeout_graceful_shutdown=graceful_s,
            backlog=2048,
        )
        self._handle_signals = handle_signals
        self._config = config
        self._uvicorn: _Uvicorn | None = None

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
        if self._uvicorn is not None:
            self._uvicorn.request_exit()

    def kill(self) -> None:
        """Stop as a crash would: the store stops writing at once, nothing is shut down
        gracefully. For in-process tests of a restart (safe from any thread)."""
        self.participant.store.crash()
        if self._uvicorn is not None:
            self._uvicorn.request_exit(force=True)


async def serve_async(
    participant: Participant,
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


def serve(participant: Participant, **kwargs: Any) -> None:
    """The blocking form of :func:`serve_async`."""
    run_event_loop(serve_async(participant, **kwargs))
