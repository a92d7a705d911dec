"""The HTTP app of a v2 participant (``gym serve --protocol v2``) and its server.

Routes: ``POST /run`` (the data plane), ``GET /ready``, and the bearer-protected v2 checkpoint
routes under ``/ng-control/v1/checkpoint``. Every error body is ``{"error": {"code", "detail"}}``
(a ``checkpoint_conflict`` also names ``active_checkpoint_id``, (ext)); a body that fails
validation is 422 ``invalid_request``; bad input never gets a 500.

``/run`` names its episode with ``_ng_rollout_id`` (a rollout id, or a capture key
``<rollout_id>-a<N>``) and ``_ng_attempt_index`` (default 0, or the capture key's attempt); a row
without a rollout id is 400 ``rollout_id_required``. Its answer carries ``x-gym-replayed: 1`` when
it is a kept reply (ext), and ``x-ng-checkpoint-restart: 1`` on a restart-only server.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rl_gym_actors.errors import GymError, InvalidRequest, RolloutIdRequired, Unauthorized
from rl_gym_actors.gym.server import GymServer, bind_socket, http_protocol
from rl_gym_actors.gym.v2.participant import V2Participant
from rl_gym_actors.gym.v2.wire import (
    REQUEST_MODELS,
    RESTART_HEADER,
    ROUTE_PREFIX,
    EpisodeId,
)
from rl_gym_actors.gym.web import DEFAULT_MAX_BODY_BYTES
from rl_gym_actors.gym.web import error_response as _error_response
from rl_gym_actors.gym.web import json_response as _json_response
from rl_gym_actors.gym.web import read_body as _read_body
from rl_gym_actors.gym.web import reject_constant as _reject_constant
from rl_gym_actors.gym.web import validation_detail as _validation_detail
from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, REPLAYED_HEADER, ROLLOUT_ID_FIELD

logger = logging.getLogger(__name__)


def episode_of(row: Any) -> EpisodeId:
    """The episode a ``/run`` row names (see the module docstring)."""
    if not isinstance(row, dict):
        raise InvalidRequest("a /run body must be a JSON object", status=422)
    given = row.get(ROLLOUT_ID_FIELD)
    if given is None:
        raise RolloutIdRequired(
            f"checkpointing requires a rollout id on every agent call: send {ROLLOUT_ID_FIELD}",
            status=400,
        )
    if not isinstance(given, str):
        raise InvalidRequest(f"{ROLLOUT_ID_FIELD} must be a string", status=422)
    try:
        from_key = EpisodeId.from_capture_key(given)
        attempt = row.get(ATTEMPT_INDEX_FIELD)
        if attempt is None:
            return from_key
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            raise InvalidRequest(f"{ATTEMPT_INDEX_FIELD} must be an integer", status=422)
        if from_key.attempt not in (0, attempt):
            raise InvalidRequest(
                f"{ROLLOUT_ID_FIELD} {given!r} names attempt {from_key.attempt}, "
                f"{ATTEMPT_INDEX_FIELD} says {attempt}",
                status=422,
            )
        return EpisodeId(rollout_id=from_key.rollout_id, attempt=attempt)
    except ValidationError as exc:
        raise InvalidRequest(_validation_detail(exc), status=422) from exc


def create_v2_app(
    participant: V2Participant, *, token: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> FastAPI:
    if not token:
        raise ValueError("a control token is required")
    expected = f"Bearer {token}".encode()
    app = FastAPI(
        title="rl_gym_actors Gym v2 server", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.participant = participant

    def authorize(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise Unauthorized("missing or invalid checkpoint control bearer token", status=401)

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> Response:
        error = {"code": exc.code, "detail": exc.detail}
        if isinstance(exc.body, dict):
            error.update({k: v for k, v in exc.body.items() if k not in error})
        headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
        return _json_response({"error": error}, exc.status or 409, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return _error_response(500, "internal_error", type(exc).__name__)

    @app.post("/run")
    async def run(request: Request) -> Response:
        try:
            row = json.loads(
                await _read_body(request, max_body_bytes), parse_constant=_reject_constant
            )
        except ValueError as exc:
            raise InvalidRequest(f"body is not JSON: {exc}", status=422) from exc
        outcome = await participant.run(episode_of(row), row)
        headers = {}
        if outcome.replayed:
            headers[REPLAYED_HEADER] = "1"
        if participant.restart_only:
            headers[RESTART_HEADER] = "1"
        return _json_response(outcome.reply, 200, headers)

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        return _json_response({"ready": True})

    @app.get(ROUTE_PREFIX + "/status")
    async def status(request: Request) -> Response:
        authorize(request)
        return _json_response(participant.status())

    def route(operation: str) -> None:
        model = REQUEST_MODELS[operation]
        handler = getattr(participant, operation)

        async def handle(request: Request) -> Response:
            authorize(request)
            raw = await _read_body(request, max_body_bytes)
            try:
                body = model.model_validate_json(raw)
            except ValidationError as exc:
                raise InvalidRequest(_validation_detail(exc), status=422) from exc
            return _json_response(await handler(body))

        app.add_api_route(f"{ROUTE_PREFIX}/{operation}", handle, methods=["POST"], name=operation)

    for operation in REQUEST_MODELS:
        route(operation)
    return app


class V2Server(GymServer):
    """A :class:`V2Participant` served over HTTP; the rest as :class:`GymServer` (bind at
    construction, ``serve``, ``serve_in_thread``, ``stop``; ``kill`` drops everything, as a
    crash would: a v2 participant keeps nothing)."""

    def __init__(
        self,
        participant: V2Participant,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        log_level: str = "warning",
        handle_signals: bool = False,
        graceful_s: float = 5.0,
        http: str = "auto",
    ) -> None:
        import uvicorn

        self.participant = participant  # type: ignore[assignment]
        self.token = token
        self.app = create_v2_app(participant, token=token, max_body_bytes=max_body_bytes)
        self.socket = bind_socket(host, port)
        bound_host, bound_port = self.socket.getsockname()[:2]
        self.port = bound_port
        self.url = f"http://{bound_host}:{bound_port}"
        self._config = uvicorn.Config(
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
        self._uvicorn = None

    def kill(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.request_exit(force=True)


def v2_server_from_args(args: Any, token: str) -> V2Server:
    """The server ``gym serve --protocol v2`` runs (its flags as parsed by the CLI)."""
    from rl_gym_actors.gym.v2.participant import DEFAULT_LEASE_GRACE_S
    from rl_gym_actors.gym.v2.stepped import make_step_agent

    participant = V2Participant(
        make_step_agent(args.agent),
        lease_grace_s=args.checkpoint_lease_s or DEFAULT_LEASE_GRACE_S,
        restart_only=args.restart_only,
    )
    return V2Server(
        participant,
        token=token,
        host=args.host,
        port=args.port,
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level,
        handle_signals=True,
        http=args.http,
    )
