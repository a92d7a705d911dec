"""The agent-checkpoint protocol's HTTP routes: ``/run``, ``/ready``, the (ext) capabilities and
the control routes under ``/ng-control/v1/agent-checkpoint`` (docs/PROTOCOL.md).

:func:`create_app` builds the FastAPI app around a
:class:`~rl_gym_actors.gym.agent_checkpoint.participant.Participant`; the conventions it shares
with every server of ours (error bodies, the bearer dependency, body limits, extensions) are
:mod:`rl_gym_actors.gym.web`'s, the serving is :mod:`rl_gym_actors.gym.server`'s.

Every answer is a model of :mod:`rl_gym_actors.protocol`, sent without its absent (None)
fields. Every error body is ``{"error": {"code", "detail"}}``: 401 ``unauthorized``, 413
``payload_too_large``, 422 ``invalid_request`` for any body or query that fails validation
(integers beyond the store's 64 bits included), 404 and 405 for unknown routes, 409 for the
participant's rejections (a prepare 409 also carries the full status as ``report``; a
``checkpoint_conflict`` names ``active_checkpoint_id`` and its ``phase``), 422
``agent_data_failed`` and 500 ``agent_failed`` (an agent that failed its row as data or
transiently: :mod:`rl_gym_actors.gym.agent_failure`), 503 ``unavailable``,
``store_write_failed`` or ``store_unavailable``. Bad input never gets a 500.
``GET /metrics`` serves the counts of :class:`rl_gym_actors.metrics.GymServerMetrics`;
``GET /ready`` answers 200 while the store takes writes, else 503 ``store_unavailable``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from rl_gym_actors.errors import AckRejected, GymRejected, InvalidRequest
from rl_gym_actors.gym.agent_checkpoint.bulk import retire_batch_keys, retired_body, status_body
from rl_gym_actors.gym.agent_checkpoint.core import PrepareIncomplete
from rl_gym_actors.gym.agent_checkpoint.participant import (
    Participant,
    RunAnswer,
    StoreUnavailable,
)
from rl_gym_actors.gym.asgi import Answer, HotRoute, Scope, mount, query_params
from rl_gym_actors.gym.web import (
    DEFAULT_MAX_BODY_BYTES,
    Extension,
    add_extensions,
    bearer_auth,
    dumped,
    install_error_handlers,
    json_response,
    new_app,
    parse,
    read_body,
    reject_constant,
)
from rl_gym_actors.listing import (
    ACK_COUNT_FEATURE,
    ACK_COUNT_PARAM,
    COMPACT_FEATURE,
    COMPACT_PARAM,
    KEYS_LISTING,
    TEXT_FEATURE,
    TEXT_LISTING,
)
from rl_gym_actors.metrics import GymServerMetrics, MetricsMiddleware
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    CAPABILITIES_PATH,
    CONTINUATION_INDEX_FEATURE,
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
    RetireBatchRequest,
    RetireRequest,
    StatusReport,
    is_valid_attempt_index,
    is_valid_checkpoint_id,
    is_valid_rollout_id,
    too_deep,
)

READY_PATH = "/ready"
LISTINGS = (COMPACT_PARAM[1], KEYS_LISTING, TEXT_LISTING)
# what a server of ours does beyond its routes; "completed_result_acknowledgement" is the name
# a real Gym and NeMo RL's checkpoint client use, the others are (ext). The routes it serves are
# listed as features too, read from the app (route_features)
FEATURES = (
    "completed_result_acknowledgement",
    COMPACT_FEATURE,
    TEXT_FEATURE,
    ACK_COUNT_FEATURE,
    "run-replay",
    "replayed-header",
    "receipt-header",
    "prepare-report",
    "lenient-status",
    "conflict-names-checkpoint",
    CONTINUATION_INDEX_FEATURE,
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


# ---------------------------------------------------------------- keys


def run_key(row: Any) -> ExecutionKey:
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


def query_key(q: Mapping[str, str]) -> ExecutionKey:
    """The key a receipt request names in its query (``asgi.query_params``)."""
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


def listing_of(request: Request) -> str | None:
    """The (ext) listing a status or prepare asks for: ``compact``, ``keys`` (compact without
    the receipts), ``text`` (compact, the receipts as JSON text) or None (the full shape)."""
    listing = request.query_params.get(COMPACT_PARAM[0])
    if listing not in (None, *LISTINGS):
        raise InvalidRequest(f"listing: one of {LISTINGS}; got {listing!r}", status=422)
    return listing


def unnested(raw: bytes) -> bytes:
    """``raw``, unless it nests too deep: refused before parsing (never a RecursionError,
    never a run)."""
    if too_deep(raw):
        raise InvalidRequest(f"body nests deeper than {MAX_JSON_DEPTH} levels", status=422)
    return raw


def run_headers(answer: RunAnswer) -> dict[str, str]:
    """The headers of a ``/run`` answer: the receipt (canonical JSON, ASCII), and
    ``x-gym-replayed`` on a stored reply."""
    headers = {RECEIPT_HEADER: answer.receipt.decode("ascii")}
    if answer.replayed:
        headers[REPLAYED_HEADER] = "1"
    return headers


# ---------------------------------------------------------------- answers

_EXT_STATUS = {"phase", "checkpoint_id", "checkpoint_lease"}  # the (ext) lease route's
_ATTEMPT_LISTS = ("blocking_attempts", "completed_unacknowledged_attempts", "executions")


def agent_status(
    report: StatusReport, participant: Participant, checkpoint_id: str | None = None
) -> dict[str, Any]:
    """A status or prepare answer as NeMo RL's checkpoint client (PR #4093) validates it (its
    agent prepare / status models refuse unknown fields): no (ext) fields, every attempt with
    ``generation``, ``parked_boundary_state`` (null: nothing here parks) and ``age_seconds``;
    ``checkpoint_id`` only on status (the id asked about, else the active one)."""
    body = report.model_dump(mode="json", exclude_none=True, exclude=_EXT_STATUS)
    for name in _ATTEMPT_LISTS:
        body[name] = [
            {
                **a,
                "parked_boundary_state": a.get("parked_boundary_state"),
                "age_seconds": participant.age_s((a["rollout_id"], a["attempt_index"])),
            }
            for a in body.get(name, [])
        ]
    if checkpoint_id is not None:
        body["checkpoint_id"] = checkpoint_id
    return body


# ---------------------------------------------------------------- the app


def create_app(
    participant: Participant,
    *,
    token: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: bool = True,
    extensions: Sequence[Extension] = (),
    run_route: bool = True,
) -> FastAPI:
    """The HTTP app. ``token`` guards every control route (one dependency on the control
    router); ``metrics`` serves Prometheus text on ``GET /metrics`` (unauthenticated; counts
    only); ``extensions`` wrap the app in middleware its routes never see (the first
    outermost); ``run_route=False`` leaves ``/run`` to the caller (``--protocol both``, where
    the v2 participant admits each run in front of this one)."""
    auth = bearer_auth(token)
    app = new_app("rl_gym_actors Gym server")
    app.state.participant = participant
    install_error_handlers(app)

    @app.exception_handler(PrepareIncomplete)
    async def _not_ready(request: Request, exc: PrepareIncomplete) -> Response:
        error = json.dumps({"code": exc.code, "detail": exc.detail})
        assert isinstance(exc.body, dict)
        report = status_body(exc.body, exc.active, participant.age_s, listing=listing_of(request))
        return json_response(f'{{"error":{error},"report":{report}}}'.encode(), exc.status or 409)

    async def body(request: Request) -> bytes:
        return unnested(await read_body(request, max_body_bytes))

    # ------------------------------------------------------------ hot routes (plain ASGI)

    async def run(scope: Scope, raw: bytes) -> Answer:
        try:
            row = json.loads(unnested(raw), parse_constant=reject_constant)
        except ValueError as exc:
            raise InvalidRequest(f"body is not JSON: {exc}", status=422) from exc
        answer = await participant.run(run_key(row), row)
        return answer.reply, run_headers(answer)

    async def receipt(scope: Scope, raw: bytes) -> Answer:
        """(ext) ``{"state", "completion_receipt"}`` for a completed or ACKed key."""
        answer = await participant.receipt(query_key(query_params(scope)))
        return dumped(answer), None

    async def completion_receipt(scope: Scope, raw: bytes) -> Answer:
        """The bare receipt, as a real Gym's later participant answers it and NeMo RL's
        checkpoint client (PR #4093) validates it; a key with no receipt to give is 409
        ``completed_execution_acknowledgement_error`` (the real participant's code)."""
        key = query_key(query_params(scope))
        try:
            answer = await participant.receipt(key)
        except GymRejected as exc:
            raise AckRejected(
                f"rollout {key[0]!r} attempt {key[1]} has no completed result receipt ({exc.code})",
                status=409,
            ) from None
        if answer.completion_receipt is None:
            raise AckRejected(
                f"rollout {key[0]!r} attempt {key[1]} has no completed result receipt", status=409
            )
        return dumped(answer.completion_receipt), None

    async def acknowledge(scope: Scope, raw: bytes) -> Answer:
        receipt = parse(CompletionReceipt, unnested(raw))
        return dumped(await participant.acknowledge(receipt)), None

    secret = token.encode()
    hot = [
        HotRoute("GET", CONTROL_PREFIX + "/receipt", receipt, secret, max_body_bytes),
        HotRoute(
            "GET",
            CONTROL_PREFIX + "/completion-receipt",
            completion_receipt,
            secret,
            max_body_bytes,
        ),
        HotRoute("POST", CONTROL_PREFIX + "/acknowledge", acknowledge, secret, max_body_bytes),
    ]
    if run_route:
        hot.insert(0, HotRoute("POST", "/run", run, None, max_body_bytes))
    mount(app, hot)  # the first middleware: inside the metrics and the extensions
    if metrics:
        app.add_middleware(MetricsMiddleware, metrics=GymServerMetrics(participant.snapshot))
    add_extensions(app, extensions)

    @app.get(READY_PATH)
    async def ready(request: Request) -> Response:
        if not participant.ready:
            raise StoreUnavailable("the store is failing its writes", status=503)
        return json_response({"ready": True})

    # ------------------------------------------------------------ control plane

    guarded = [Depends(auth)]  # every control route: the one bearer dependency

    # as a real Gym's control plane serves it: without a token (it names no rollout)
    @app.get(CAPABILITIES_PATH)
    async def capabilities(request: Request) -> Response:
        return json_response(
            Capabilities(
                name=participant.name or Capabilities.model_fields["name"].default,
                features=features(),
                **participant.capabilities(),
            )
        )

    def features() -> list[str]:
        return [
            *FEATURES,
            *route_features(app),
            *(["durable-store"] if participant.store.durable else []),
            *(["checkpoint-lease"] if participant.core.fence.lease_s is not None else []),
            *(["checkpoint-root"] if participant.checkpoint_root is not None else []),
            *(name for extension in extensions for name in extension.features),
        ]

    @app.get(CONTROL_PREFIX + "/status", dependencies=guarded)
    async def status(request: Request) -> Response:
        checkpoint_id = request.query_params.get("checkpoint_id")
        if checkpoint_id is not None and not is_valid_checkpoint_id(checkpoint_id):
            raise InvalidRequest(f"checkpoint_id: invalid {checkpoint_id!r}", status=422)
        report, active = await participant.status(checkpoint_id)
        counts = report.model_dump(mode="json", exclude_none=True, exclude=_EXT_STATUS)
        if (checkpoint_id or report.checkpoint_id) is not None:
            counts["checkpoint_id"] = checkpoint_id or report.checkpoint_id
        body = status_body(counts, active, participant.age_s, listing=listing_of(request))
        return json_response(body.encode())

    @app.get(CONTROL_PREFIX + "/lease", dependencies=guarded)
    async def lease(request: Request) -> Response:
        """(ext) The fence: ``{"phase", "checkpoint_id", "checkpoint_lease"}`` (what status
        carried before it answered exactly NeMo RL's model), and the server's memory:
        ``instance_id`` (per process) and ``store_epoch`` (per state dir)."""
        report, _ = await participant.status(None)
        return json_response(
            {
                **report.model_dump(mode="json", exclude_none=True, include=_EXT_STATUS),
                "instance_id": participant.instance_id,
                "store_epoch": participant.store_epoch,
            }
        )

    @app.post(CONTROL_PREFIX + "/acknowledge-completed", dependencies=guarded)
    async def acknowledge_completed(request: Request) -> Response:
        answer = request.query_params.get(ACK_COUNT_PARAM[0])  # (ext) count=1: the count only
        if answer not in (None, ACK_COUNT_PARAM[1]):
            raise InvalidRequest(f"count: only {ACK_COUNT_PARAM[1]!r}; got {answer!r}", status=422)
        raw = await read_body(request, max_body_bytes)
        # receipts exactly as issued (its parse stops at a nesting too deep for Python: the
        # checked path refuses any past MAX_JSON_DEPTH by name)
        fast = await participant.acknowledge_exact(raw)
        if fast is None:
            batch = parse(AckBatchRequest, unnested(raw))
            acked = await participant.acknowledge_batch(batch.executions)
            fast = acked.model_dump_json(exclude_none=True).encode(), len(batch.executions)
        return json_response({"acknowledged_count": fast[1]} if answer else fast[0])

    @app.post(CONTROL_PREFIX + "/retire", dependencies=guarded)
    async def retire(request: Request) -> Response:
        req = parse(RetireRequest, await body(request))
        return json_response(
            await participant.retire(
                req.checkpoint_id, (req.rollout_id, req.attempt_index), req.deadline_ts
            )
        )

    @app.post(CONTROL_PREFIX + "/retire-batch", dependencies=guarded)
    async def retire_batch(request: Request) -> Response:
        """(ext) Many retires in one call, answered per key in the order sent."""
        raw = await read_body(request, max_body_bytes)
        # by hand, by the thousand (its parse stops at a nesting too deep for Python); else the
        # model, which names what is wrong
        checked = retire_batch_keys(raw)
        if checked is None:
            req = parse(RetireBatchRequest, unnested(raw))
            keys = [(k.rollout_id, k.attempt_index) for k in req.executions]
            checked = req.checkpoint_id, req.deadline_ts, keys
        cid, deadline_ts, keys = checked
        answers = await participant.retire_batch(cid, keys, deadline_ts)
        return json_response(retired_body(keys, answers))

    @app.post(CONTROL_PREFIX + "/prepare", dependencies=guarded)
    async def prepare(request: Request) -> Response:
        req = parse(PhaseRequest, await body(request))
        report = await participant.prepare(req.checkpoint_id, req.deadline_ts)
        return json_response(agent_status(report, participant))

    @app.post(CONTROL_PREFIX + "/commit", dependencies=guarded)
    async def commit(request: Request) -> Response:
        req = parse(CommitRequest, await body(request))
        return json_response(
            await participant.commit(req.checkpoint_id, req.checkpoint_dir, req.deadline_ts)
        )

    @app.post(CONTROL_PREFIX + "/restore", dependencies=guarded)
    async def restore(request: Request) -> Response:
        """As a real Gym's: from idle; the files checked; ``restored_paused`` until resume."""
        req = parse(CommitRequest, await body(request))
        return json_response(
            await participant.restore(req.checkpoint_id, req.checkpoint_dir, req.deadline_ts)
        )

    @app.post(CONTROL_PREFIX + "/resume", dependencies=guarded)
    async def resume(request: Request) -> Response:
        req = parse(PhaseRequest, await body(request))
        return json_response(await participant.resume(req.checkpoint_id))

    return app
