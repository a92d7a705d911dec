"""The HTTP routes of a v2 participant (``gym serve --protocol v2``), served by
:class:`~rl_gym_actors.gym.server.GymServer` with :func:`create_app` as its app factory.

Routes: ``POST /run`` (the data plane), ``GET /ready``, and the v2 checkpoint routes under
``/ng-control/v1/checkpoint``, each behind the one bearer dependency
(:func:`rl_gym_actors.gym.web.bearer_auth`), with (ext) ``GET .../kept`` (the kept replies'
capture keys). Error bodies are :mod:`rl_gym_actors.gym.web`'s
(``{"error": {"code", "detail"}}``; a ``checkpoint_conflict`` also names
``active_checkpoint_id``, (ext)); a body that fails validation is 422 ``invalid_request``; bad
input never gets a 500.

``/run`` names its episode with ``_ng_rollout_id`` (a rollout id, or a capture key
``<rollout_id>-a<N>``) and ``_ng_attempt_index`` (default 0, or the capture key's attempt); a row
without a rollout id is 400 ``rollout_id_required``. Its answer carries ``x-gym-replayed: 1`` when
it is a kept reply (ext), and ``x-ng-checkpoint-restart: 1`` on a restart-only server.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from rl_gym_actors.errors import ConfigError, InvalidRequest, RolloutIdRequired
from rl_gym_actors.gym.server import GymServer
from rl_gym_actors.gym.v2.participant import V2Participant
from rl_gym_actors.gym.v2.wire import (
    KEPT_ROUTE,
    MAX_KEPT_LISTED,
    REPLAY_ONLY_PARAM,
    REQUEST_MODELS,
    RESTART_HEADER,
    ROUTE_PREFIX,
    EpisodeId,
)
from rl_gym_actors.gym.web import (
    DEFAULT_MAX_BODY_BYTES,
    Extension,
    add_extensions,
    bearer_auth,
    install_error_handlers,
    json_response,
    new_app,
    parse,
    read_body,
    reject_constant,
    validation_detail,
)
from rl_gym_actors.metrics import GymServerMetrics, MetricsMiddleware
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    MAX_JSON_DEPTH,
    REPLAYED_HEADER,
    ROLLOUT_ID_FIELD,
    WIRE_INT_MAX,
    is_valid_attempt_index,
    too_deep,
)


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
        if not is_valid_attempt_index(attempt):  # the agent-checkpoint side's bounds
            raise InvalidRequest(
                f"{ATTEMPT_INDEX_FIELD} must be an integer in 0..{WIRE_INT_MAX}; got {attempt!r}",
                status=422,
            )
        if from_key.attempt not in (0, attempt):
            raise InvalidRequest(
                f"{ROLLOUT_ID_FIELD} {given!r} names attempt {from_key.attempt}, "
                f"{ATTEMPT_INDEX_FIELD} says {attempt}",
                status=422,
            )
        return EpisodeId(rollout_id=from_key.rollout_id, attempt=attempt)
    except ValidationError as exc:
        raise InvalidRequest(validation_detail(exc), status=422) from exc


async def read_row(request: Request, max_body_bytes: int) -> dict[str, Any]:
    """A ``/run`` body: a JSON object within the size limit and nesting depth, else 413 or
    422."""
    raw = await read_body(request, max_body_bytes)
    if too_deep(raw):  # refused before parsing: never a RecursionError
        raise InvalidRequest(f"body nests deeper than {MAX_JSON_DEPTH} levels", status=422)
    try:
        row = json.loads(raw, parse_constant=reject_constant)
    except ValueError as exc:
        raise InvalidRequest(f"body is not JSON: {exc}", status=422) from exc
    if not isinstance(row, dict):
        raise InvalidRequest("a /run body must be a JSON object", status=422)
    return row


def install_control_routes(
    app: FastAPI, participant: V2Participant, *, token: str, max_body_bytes: int
) -> None:
    """The v2 checkpoint routes of ``participant`` on ``app``, each behind the bearer
    dependency."""
    guarded = [Depends(bearer_auth(token))]

    @app.get(ROUTE_PREFIX + "/status", dependencies=guarded)
    async def status(request: Request) -> Response:
        return json_response(participant.status())

    @app.get(ROUTE_PREFIX + KEPT_ROUTE, dependencies=guarded)
    async def kept(request: Request) -> Response:  # (ext)
        raw = request.query_params.get("limit", str(MAX_KEPT_LISTED))
        # ASCII digits only ("²".isdigit() is true, int("²") raises), and few of them
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not (
            0 < int(raw) <= MAX_KEPT_LISTED
        ):
            raise InvalidRequest(f"limit must be 1..{MAX_KEPT_LISTED}, got {raw!r}", status=422)
        return json_response(participant.kept_keys(int(raw)))

    def route(operation: str, model: type[BaseModel]) -> None:
        handler: Callable[[Any], Awaitable[dict[str, Any]]] = getattr(participant, operation)

        async def handle(request: Request) -> Response:
            body = parse(model, await read_body(request, max_body_bytes), strict=False)
            return json_response(await handler(body))

        app.add_api_route(
            f"{ROUTE_PREFIX}/{operation}",
            handle,
            methods=["POST"],
            name=f"v2_{operation}",
            dependencies=guarded,
        )

    for operation, model in REQUEST_MODELS.items():
        route(operation, model)


def create_app(
    participant: V2Participant,
    *,
    token: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    extensions: Sequence[Extension] = (),
) -> FastAPI:
    """The v2 participant's app (the :class:`~rl_gym_actors.gym.server.AppFactory` of
    ``--protocol v2``), with ``GET /metrics`` (runs started and completed, runs in progress,
    request latency)."""
    app = new_app("rl_gym_actors Gym v2 server")
    app.state.participant = participant
    # GET /metrics as on every server (unauthenticated, counts only), inside the extensions
    app.add_middleware(MetricsMiddleware, metrics=GymServerMetrics(participant.snapshot))
    add_extensions(app, extensions)
    install_error_handlers(app)

    @app.post("/run")
    async def run(request: Request) -> Response:
        row = await read_row(request, max_body_bytes)
        replay_only = request.query_params.get(REPLAY_ONLY_PARAM, "0")
        if replay_only not in ("0", "1"):
            raise InvalidRequest(
                f"{REPLAY_ONLY_PARAM} must be 0 or 1, got {replay_only!r}", status=422
            )
        if replay_only == "1":  # (ext): never starts anything
            outcome = participant.kept_reply(episode_of(row))
        else:
            outcome = await participant.run(episode_of(row), row)
        headers = dict(outcome.headers)
        if outcome.replayed:
            headers[REPLAYED_HEADER] = "1"
        if participant.restart_only:
            headers[RESTART_HEADER] = "1"
        return json_response(outcome.reply, 200, headers)

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        return json_response({"ready": True})

    install_control_routes(app, participant, token=token, max_body_bytes=max_body_bytes)
    return app


def v2_server_from_args(args: Any, token: str) -> GymServer:
    """The server ``gym serve --protocol v2`` runs (its flags as parsed by the CLI)."""
    import os

    from rl_gym_actors.gym.clock import fault_clock
    from rl_gym_actors.gym.connections import limits_from_args
    from rl_gym_actors.gym.v2.participant import DEFAULT_LEASE_GRACE_S
    from rl_gym_actors.gym.v2.state import V2State
    from rl_gym_actors.gym.v2.stepped import make_step_agent

    try:  # test-only skew (chaos: Gym's clock off the trainer's), with --allow-faults only
        clock = fault_clock(bool(getattr(args, "allow_faults", False)), os.environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    participant = V2Participant(
        make_step_agent(args.agent),
        lease_grace_s=args.checkpoint_lease_s or DEFAULT_LEASE_GRACE_S,
        restart_only=args.restart_only,
        export_every_session=bool(getattr(args, "export_every_session", False)),
        hide_restored_pending=bool(getattr(args, "hide_restored_pending", False)),
        state=None if args.state_dir is None else V2State(args.state_dir),
        clock=clock,
    )
    return GymServer(
        participant,
        token=token,
        app_factory=create_app,
        host=args.host,
        port=args.port,
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level,
        handle_signals=True,
        http=args.http,
        limits=limits_from_args(args),
    )
