"""Async client of one Gym agent server: the data plane ``/run`` and the checkpoint control plane.

Every method takes ``deadline_ts``, an absolute Unix time; the call's timeout is derived from it
and ``DeadlineExceeded`` is raised when it passes. Every non-2xx answer becomes the typed error
from :func:`rl_gym_actors.errors.gym_error`; transport failures become ``ConnectionLost``.
Idempotent calls retry inside their deadline (see :mod:`rl_gym_actors.gym.retry`); ``run`` never
does.

Coping with a real Gym server (docs/PROTOCOL.md, section 7):

- FastAPI's default 422 body ``{"detail": [...]}`` -> ``InvalidRequest``; a 401 with
  ``{"detail": "..."}`` -> ``Unauthorized``.
- On ``/run``, any 5xx is the server or its agent failing (a real Gym answers an agent that
  raised, and a run that ``retire`` cancelled, with a 500 whose body is a JSON string or plain
  text): ``AgentFailed`` carrying the status and the body's text. The caller retires the try
  next, which confirms it did not complete. No answer at all stays ``ConnectionLost``. On a
  control call, a non-JSON 5xx is ``ConnectionLost`` carrying the text (repeated if idempotent).
- Its prepare 409 carries counts only; :meth:`GymClient.prepare` then reads the lists from
  ``status``.

Dead and frozen servers (see :mod:`rl_gym_actors.gym.health`): calls that get no answer at all
(refused, or a quick control call that times out) count against the endpoint; after a few in a
row it is marked down and every call raises ``EndpointDown`` at once, carrying the last cause,
until a background probe gets an answer again.

A ``checkpoint_conflict`` whose body does not name the checkpoint id in the way is completed
from ``capabilities`` when the server has that route, so ``CheckpointConflict.active_checkpoint_id``
says what to abort.

Connection pools: ``/run`` calls hold a connection for as long as the agent works, so the
control plane has its own small pool and a retire or ACK never queues behind long runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ValidationError

from rl_gym_actors.config import GymEndpoint, checkpoint_id_arg
from rl_gym_actors.errors import (
    AgentFailed,
    CheckpointConflict,
    ConfigError,
    ConnectionLost,
    DeadlineExceeded,
    GymError,
    PoolClosed,
    ProtocolViolation,
    RlGymError,
    gym_error,
)
from rl_gym_actors.gym import health as _health
from rl_gym_actors.gym.retry import (
    DEFAULT_RETRY,
    Clock,
    RetryOn,
    RetryPolicy,
    call_with_retry,
    check_deadline,
    remaining,
)
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    CAPABILITIES_PATH,
    CONTROL_PREFIX,
    RECEIPT_HEADER,
    REPLAYED_HEADER,
    ROLLOUT_ID_FIELD,
    AckAnswer,
    AckBatchAnswer,
    AckBatchRequest,
    Capabilities,
    CommitAnswer,
    CommitRequest,
    CompletionReceipt,
    PhaseRequest,
    ReceiptAnswer,
    ResumeAnswer,
    RetireAnswer,
    RetireRequest,
    StatusReport,
    is_valid_rollout_id,
    result_digest,
)

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

PREPARE_INCOMPLETE = "agent_prepare_incomplete"
_TEXT_LIMIT = 2000  # characters of a non-JSON body kept in an error


@dataclass(frozen=True, slots=True)
class RunResult:
    """What ``/run`` answered: the agent's reply (usually a dict), whether the server replayed a
    stored reply (the (ext) ``x-gym-replayed`` header; always False on a server without it), the
    raw bytes of the body, and the completion receipt when the server sent it beside the answer
    (the (ext) ``x-gym-completion-receipt`` header, the receipt's JSON; None without it, or when
    it is no receipt: then it is fetched as from any server)."""

    reply: Any
    replayed: bool
    raw: bytes = field(repr=False)
    receipt: CompletionReceipt | None = None

    @property
    def digest(self) -> str:
        """The reply's canonical digest, to compare with a receipt's ``result_digest``."""
        return result_digest(self.reply)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    raw: bytes
    replayed: bool
    url: str
    receipt: str | None = None  # the raw (ext) receipt header of a /run answer


# ---------------------------------------------------------------- answers -> values or errors


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")[:_TEXT_LIMIT]


def _validation_summary(items: list[Any]) -> str:
    parts = []
    for item in items:
        if isinstance(item, Mapping):
            loc = ".".join(str(p) for p in item.get("loc", ()) or ())
            parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", item)))
        else:
            parts.append(str(item))
    return "; ".join(parts)


def error_for_response(status: int, raw: bytes, *, url: str = "") -> RlGymError:
    """The typed error for a non-2xx answer (pure).

    ``{"error": {"code", "detail"}}`` maps by code; FastAPI's ``{"detail": "..."}`` and
    ``{"detail": [...]}`` map by status (401 -> Unauthorized, 422 -> InvalidRequest); a 5xx whose
    body is not a JSON object is ``ConnectionLost`` (see the module docstring).
    """
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if status >= 500:
            return ConnectionLost(
                f"HTTP {status} without a JSON error body: {_text(raw)!r}", url=url
            )
        return gym_error(status, None, _text(raw), url=url, body=None)
    err = body.get("error")
    if isinstance(err, Mapping):
        code = err.get("code") if isinstance(err.get("code"), str) else None
        return gym_error(status, code, str(err.get("detail", "")), url=url, body=body)
    detail = body.get("detail")
    if isinstance(detail, list):
        return gym_error(
            status,
            "invalid_request" if status == 422 else None,
            _validation_summary(detail),
            url=url,
            body=body,
        )
    return gym_error(status, None, "" if detail is None else str(detail), url=url, body=body)


def run_failure(status: int, raw: bytes, *, url: str = "") -> AgentFailed:
    """A 5xx answer to ``/run`` (pure): the agent or its server failed. The text is the error
    body's ``detail``, a JSON string body itself (a real Gym's exception repr), or the plain text."""
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, Mapping) and isinstance(err.get("detail"), str):
        text = err["detail"]
    elif isinstance(body, str):
        text = body
    else:
        text = _text(raw)
    return AgentFailed(
        text[:_TEXT_LIMIT], status=status, url=url, body=body if isinstance(body, dict) else None
    )


def _json(answer: _Answer) -> Any:
    try:
        return json.loads(answer.raw)
    except ValueError as exc:
        raise ProtocolViolation(
            f"{answer.url}: HTTP {answer.status} body is not JSON: {_text(answer.raw)!r}"
        ) from exc


def _model(model: type[M], data: Any, url: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProtocolViolation(f"{url}: answer is no {model.__name__}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class _Incomplete:
    report: StatusReport | None  # None: the 409 carried counts only


def _prepare_incomplete(answer: _Answer) -> _Incomplete | None:
    """A prepare 409 ``agent_prepare_incomplete`` as a value; None for any other answer."""
    try:
        body = json.loads(answer.raw)
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, Mapping) or err.get("code") != PREPARE_INCOMPLETE:
        return None
    if isinstance(body.get("report"), Mapping):
        report = _model(StatusReport, body["report"], answer.url)
        return _Incomplete(report.model_copy(update={"ready_to_commit": False}))
    logger.debug("%s: prepare 409 without a report (%s)", answer.url, err.get("detail"))
    return _Incomplete(None)


def _header_receipt(answer: _Answer) -> CompletionReceipt | None:
    """The (ext) receipt sent beside a 2xx ``/run`` answer; None when absent or malformed (the
    caller then fetches it, as from a server without the header)."""
    if answer.receipt is None:
        return None
    try:
        return CompletionReceipt.model_validate_json(answer.receipt)
    except ValidationError:
        logger.warning("%s: ignoring a malformed %s header", answer.url, RECEIPT_HEADER)
        return None


def _ok(answer: _Answer) -> Any:
    """The JSON of a 2xx answer; the typed error of any other."""
    if not 200 <= answer.status < 300:
        raise error_for_response(answer.status, answer.raw, url=answer.url)
    return _json(answer)


# ---------------------------------------------------------------- argument checks


def _rollout_key(rollout_id: str, attempt_index: int) -> None:
    if not is_valid_rollout_id(rollout_id):
        raise ConfigError(f"invalid rollout_id {rollout_id!r}")
    if not isinstance(attempt_index, int) or isinstance(attempt_index, bool) or attempt_index < 0:
        raise ConfigError(f"attempt_index must be an int >= 0, got {attempt_index!r}")


def _request_model(model: type[M], **fields: Any) -> M:
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ConfigError(f"invalid {model.__name__}: {exc}") from exc


def _receipt(value: CompletionReceipt | Mapping[str, Any]) -> CompletionReceipt:
    if isinstance(value, CompletionReceipt):
        return value
    try:
        return CompletionReceipt.model_validate(value)
    except ValidationError as exc:
        raise ConfigError(f"invalid completion receipt: {exc}") from exc


def _encode(body: Any) -> bytes:
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"request body is not JSON-serializable: {exc}") from exc


def _restore(endpoint: GymEndpoint, options: dict[str, Any]) -> GymClient:
    return GymClient(endpoint, **options)


# ---------------------------------------------------------------- the client


class GymClient:
    """Async client of one Gym server; one per process or actor, shared by its coroutines.

    Construct it anywhere (it pickles as its construction arguments, without a passed-in
    ``session``); the connection pools are created on first use inside the running event loop,
    and the client stays bound to that loop. ``limit`` caps concurrent ``/run`` connections,
    ``control_limit`` the control plane's. ``keepalive_s`` is kept below common server idle
    timeouts so that a ``/run`` (a POST, never retried) rarely meets a connection the server has
    already closed. A passed-in ``session`` serves both planes and is never closed by the client.
    """

    def __init__(
        self,
        endpoint: GymEndpoint,
        *,
        session: aiohttp.ClientSession | None = None,
        limit: int = 100,
        control_limit: int = 16,
        retry: RetryPolicy = DEFAULT_RETRY,
        keepalive_s: float = 2.0,
        clock: Clock = time.time,
        down_after: int = _health.THRESHOLD,
        down_span_s: float = _health.SPAN_S,
        probe_every_s: float = _health.PROBE_EVERY_S,
    ) -> None:
        if not isinstance(endpoint, GymEndpoint):
            raise ConfigError(f"endpoint must be a GymEndpoint, got {type(endpoint).__name__}")
        if limit < 1 or control_limit < 1:
            raise ConfigError("limit and control_limit must be >= 1")
        self.endpoint = endpoint
        self.retry = retry
        self._options = dict(
            limit=limit,
            control_limit=control_limit,
            retry=retry,
            keepalive_s=keepalive_s,
            clock=clock,
            down_after=down_after,
            down_span_s=down_span_s,
            probe_every_s=probe_every_s,
        )
        self._clock = clock
        self.health = _health.EndpointHealth(
            endpoint.label, threshold=down_after, span_s=down_span_s, clock=clock
        )
        self._probe_every_s = probe_every_s
        self._probe: asyncio.Task | None = None
        self._probed_at = 0.0
        self._given = session
        self._data: aiohttp.ClientSession | None = None
        self._control: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def __reduce__(self):
        return (_restore, (self.endpoint, dict(self._options)))

    def __repr__(self) -> str:
        return f"GymClient({self.endpoint.label!r})"

    async def __aenter__(self) -> GymClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pools this client created. Later calls raise ``PoolClosed``."""
        self._closed = True
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        owned = [s for s in (self._data, self._control) if s is not None]
        self._data = self._control = None
        for session in owned:
            await session.close()

    # ------------------------------------------------------------ data plane

    async def run(
        self, row: Mapping[str, Any], *, rollout_id: str, attempt_index: int, deadline_ts: float
    ) -> RunResult:
        """``POST /run`` for the key (rollout_id, attempt_index). Never retried.

        Raises ``StaleAttempt``, ``DuplicateExecution``, ``AdmissionClosed``, ``AgentFailed``
        (any 5xx: the agent or its server failed; ``status`` and ``detail`` say how);
        ``ConnectionLost`` or ``DeadlineExceeded`` when no answer came (Gym may still finish the
        run: retire the try next, and its answer says whether to adopt or cancel).
        """
        return await self._run(row, rollout_id, attempt_index, deadline_ts, RetryOn.NOTHING)

    async def replay(
        self, row: Mapping[str, Any], *, rollout_id: str, attempt_index: int, deadline_ts: float
    ) -> RunResult:
        """``POST /run`` for a key known to be completed and not ACKed (retire answered
        ``completed_unacknowledged``, or a receipt said ``completed``): the server answers the
        stored reply and the agent does not run, so this call is retried. Do not use it for a
        key whose state is unknown: that would start an execution."""
        return await self._run(row, rollout_id, attempt_index, deadline_ts, RetryOn.IDEMPOTENT)

    async def _run(
        self,
        row: Mapping[str, Any],
        rollout_id: str,
        attempt_index: int,
        deadline_ts: float,
        kind: RetryOn,
    ) -> RunResult:
        _rollout_key(rollout_id, attempt_index)
        if not isinstance(row, Mapping):
            raise ConfigError(f"row must be a mapping, got {type(row).__name__}")
        for name, value in ((ROLLOUT_ID_FIELD, rollout_id), (ATTEMPT_INDEX_FIELD, attempt_index)):
            if name in row and row[name] != value:
                raise ConfigError(f"row carries {name}={row[name]!r}, the call says {value!r}")
        data = _encode({**row, ROLLOUT_ID_FIELD: rollout_id, ATTEMPT_INDEX_FIELD: attempt_index})

        async def attempt(try_deadline: float) -> RunResult:
            answer = await self._send(
                "POST", "/run", control=False, data=data, deadline_ts=try_deadline
            )
            if answer.status >= 500 and kind is RetryOn.NOTHING:
                raise run_failure(answer.status, answer.raw, url=answer.url)
            return RunResult(
                reply=_ok(answer),
                replayed=answer.replayed,
                raw=answer.raw,
                receipt=_header_receipt(answer),
            )

        return await self._with_retry(
            attempt, kind, deadline_ts, f"run {rollout_id}/{attempt_index}"
        )

    # ------------------------------------------------------------ control plane

    async def receipt(
        self, rollout_id: str, attempt_index: int, *, deadline_ts: float
    ) -> ReceiptAnswer:
        """(ext) The completion receipt of a completed or ACKed key; retried inside the one
        deadline. Raises ``NotCompleted``, ``StaleAttempt`` or ``UnknownExecution``."""
        _rollout_key(rollout_id, attempt_index)
        params = {"rollout_id": rollout_id, "attempt_index": str(attempt_index)}
        return await self._control_call(
            ReceiptAnswer,
            "GET",
            "/receipt",
            params=params,
            deadline_ts=deadline_ts,
            kind=RetryOn.IDEMPOTENT,
        )

    async def acknowledge(
        self, receipt: CompletionReceipt | Mapping[str, Any], *, deadline_ts: float
    ) -> AckAnswer:
        """ACK one completed execution by its receipt. Raises ``AckRejected`` when the key is
        unknown, not completed, or any receipt field differs."""
        body = _receipt(receipt).model_dump(mode="json", exclude_none=True)
        return await self._control_call(
            AckAnswer,
            "POST",
            "/acknowledge",
            body=body,
            deadline_ts=deadline_ts,
            kind=RetryOn.IDEMPOTENT,
        )

    async def acknowledge_completed(
        self, receipts: Iterable[CompletionReceipt | Mapping[str, Any]], *, deadline_ts: float
    ) -> AckBatchAnswer:
        """ACK a batch, all or nothing (at least one receipt, keys unique)."""
        request = _request_model(AckBatchRequest, executions=[_receipt(r) for r in receipts])
        answer = await self._control_call(
            AckBatchAnswer,
            "POST",
            "/acknowledge-completed",
            body=request.model_dump(mode="json", exclude_none=True),
            deadline_ts=deadline_ts,
            kind=RetryOn.IDEMPOTENT,
        )
        sent = {r.key for r in request.executions}
        if not {r.key for r in answer.acknowledged} <= sent:
            raise ProtocolViolation(
                f"{self.endpoint.label}: acknowledge-completed answered keys it was not sent"
            )
        return answer

    async def retire(
        self, rollout_id: str, attempt_index: int, *, checkpoint_id: str, deadline_ts: float
    ) -> RetireAnswer:
        """Give up on a try: a running one is cancelled (``retired``), an unknown one tombstoned,
        a completed and un-ACKed one refused (``completed_unacknowledged``: adopt it)."""
        _rollout_key(rollout_id, attempt_index)
        return await self._phase_call(
            RetireAnswer,
            RetireRequest,
            "/retire",
            deadline_ts,
            RetryOn.IDEMPOTENT,
            checkpoint_id=checkpoint_id,
            rollout_id=rollout_id,
            attempt_index=attempt_index,
        )

    async def status(self, checkpoint_id: str, *, deadline_ts: float) -> StatusReport:
        """The participant's status, as seen for ``checkpoint_id``."""
        checkpoint_id_arg(checkpoint_id)
        return await self._control_call(
            StatusReport,
            "GET",
            "/status",
            params={"checkpoint_id": checkpoint_id},
            deadline_ts=deadline_ts,
            kind=RetryOn.IDEMPOTENT,
        )

    async def prepare(self, checkpoint_id: str, *, deadline_ts: float) -> StatusReport:
        """Close admission and wait (server side, until shortly before ``deadline_ts``) for
        readiness. Not ready is a value, not an error: ``ready_to_commit`` False, with the
        blockers from the (ext) ``report`` of the 409, or else read from ``status``."""
        checkpoint_id_arg(checkpoint_id)

        async def attempt(try_deadline: float) -> StatusReport | None:
            body = _request_model(
                PhaseRequest,
                checkpoint_id=checkpoint_id,
                deadline_ts=self.retry.wire_deadline(try_deadline, self._clock()),
            )
            answer = await self._send(
                "POST",
                CONTROL_PREFIX + "/prepare",
                control=True,
                data=_encode(body.model_dump(mode="json")),
                deadline_ts=try_deadline,
            )
            if answer.status == 409:
                incomplete = _prepare_incomplete(answer)
                if incomplete is not None:
                    return incomplete.report
            return _model(StatusReport, _ok(answer), answer.url)

        report = await self._with_retry(
            attempt, RetryOn.TRANSPORT, deadline_ts, f"prepare {checkpoint_id}"
        )
        if report is None:
            # a real Gym's 409 carries counts only: the keys and receipts come from status
            status = await self.status(checkpoint_id, deadline_ts=deadline_ts)
            return status.model_copy(update={"ready_to_commit": False})
        return report

    async def commit(
        self, checkpoint_id: str, checkpoint_dir: str, *, deadline_ts: float
    ) -> CommitAnswer:
        """Write the participant's records into ``checkpoint_dir`` (manifest last). Only after a
        ready prepare; raises ``CheckpointNotReady`` otherwise."""
        return await self._phase_call(
            CommitAnswer,
            CommitRequest,
            "/commit",
            deadline_ts,
            RetryOn.TRANSPORT,
            checkpoint_id=checkpoint_id,
            checkpoint_dir=str(checkpoint_dir),
        )

    async def resume(self, checkpoint_id: str, *, deadline_ts: float) -> ResumeAnswer:
        """Reopen admission (also the way to abort); the checkpoint id is spent afterwards."""
        return await self._phase_call(
            ResumeAnswer,
            PhaseRequest,
            "/resume",
            deadline_ts,
            RetryOn.IDEMPOTENT,
            checkpoint_id=checkpoint_id,
        )

    async def capabilities(self, *, deadline_ts: float) -> Capabilities | None:
        """(ext) What the server supports; ``None`` when it lacks the route (a real Gym)."""
        try:
            return await self._control_call(
                Capabilities,
                "GET",
                CAPABILITIES_PATH,
                deadline_ts=deadline_ts,
                kind=RetryOn.IDEMPOTENT,
                prefixed=False,
            )
        except GymError as exc:
            if exc.status in (404, 405):
                return None
            raise

    # ------------------------------------------------------------ plumbing

    async def _phase_call(
        self,
        answer_model: type[M],
        request_model: type[BaseModel],
        path: str,
        deadline_ts: float,
        kind: RetryOn,
        **fields: Any,
    ) -> M:
        checkpoint_id_arg(fields["checkpoint_id"])
        _request_model(request_model, deadline_ts=check_deadline(deadline_ts), **fields)

        async def attempt(try_deadline: float) -> M:
            body = request_model(
                deadline_ts=self.retry.wire_deadline(try_deadline, self._clock()), **fields
            )
            answer = await self._send(
                "POST",
                CONTROL_PREFIX + path,
                control=True,
                data=_encode(body.model_dump(mode="json")),
                deadline_ts=try_deadline,
            )
            return _model(answer_model, _ok(answer), answer.url)

        return await self._with_retry(attempt, kind, deadline_ts, path.lstrip("/"))

    async def _control_call(
        self,
        answer_model: type[M],
        method: str,
        path: str,
        *,
        deadline_ts: float,
        kind: RetryOn,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        prefixed: bool = True,
    ) -> M:
        data = None if body is None else _encode(body)
        full = CONTROL_PREFIX + path if prefixed else path

        async def attempt(try_deadline: float) -> M:
            answer = await self._send(
                method, full, control=True, data=data, params=params, deadline_ts=try_deadline
            )
            return _model(answer_model, _ok(answer), answer.url)

        return await self._with_retry(attempt, kind, deadline_ts, path.lstrip("/"))

    async def _with_retry(self, attempt, kind: RetryOn, deadline_ts: float, what: str):
        deadline_ts = check_deadline(deadline_ts)
        try:
            return await call_with_retry(
                attempt,
                kind=kind,
                policy=self.retry,
                deadline_ts=deadline_ts,
                clock=self._clock,
                what=f"{self.endpoint.label} {what}",
            )
        except CheckpointConflict as exc:
            if exc.active_checkpoint_id is None:
                exc.active_checkpoint_id = await self._holder(deadline_ts)
            raise

    async def _holder(self, deadline_ts: float) -> str | None:
        """The checkpoint id holding the server, from capabilities; None when unknown."""
        try:
            caps = await self.capabilities(deadline_ts=min(deadline_ts, self._clock() + 2.0))
        except RlGymError:
            return None
        if caps is None:
            return None
        named = caps.model_dump()  # NeMo RL's name, then our server's older one
        holder = named.get("active_checkpoint_id") or named.get("checkpoint_id")
        return holder if isinstance(holder, str) and holder else None

    def _session(self, control: bool) -> aiohttp.ClientSession:
        if self._closed:
            raise PoolClosed(f"GymClient for {self.endpoint.label} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise ConfigError(
                "a GymClient is bound to the event loop that first used it; "
                "create one client per event loop"
            )
        if self._given is not None:
            return self._given
        # creating a session does not await, so two coroutines cannot both create one
        if control:
            if self._control is None:
                self._control = self._new_session(self._options["control_limit"])
            return self._control
        if self._data is None:
            self._data = self._new_session(self._options["limit"])
        return self._data

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limit, limit_per_host=0, keepalive_timeout=self._options["keepalive_s"]
        )
        # our own asyncio.timeout bounds each try; no aiohttp timeout competes with it
        return aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), raise_for_status=False
        )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        control: bool,
        deadline_ts: float,
        data: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> _Answer:
        """One HTTP exchange, bounded by ``deadline_ts``; any status comes back as an answer."""
        url = self.endpoint.url + path
        left = remaining(deadline_ts, self._clock())
        if left <= 0:
            raise DeadlineExceeded(f"{method} {path}: deadline passed before the call", url=url)
        session = self._session(control)
        if self.health.down:
            self._ensure_probe()  # whatever ended the last probe, one runs now
            if self._clock() - self._probed_at > 2 * self._probe_every_s + _health.PROBE_TIMEOUT_S:
                # the background probe has not run for a while (an event loop that only runs
                # while the actor serves a call: a Ray generator method's): probe here, once
                await self._probe_now(left)
            self.health.check(f"{method} {path}", url)
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        token = self.endpoint.resolved_token if control else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with asyncio.timeout(left):
                async with session.request(
                    method, url, data=data, params=params, headers=headers
                ) as resp:
                    raw = await resp.read()
                    replayed = resp.headers.get(REPLAYED_HEADER, "").strip() == "1"
                    answer = _Answer(
                        resp.status, raw, replayed, url, resp.headers.get(RECEIPT_HEADER)
                    )
        except TimeoutError as exc:  # ours, or aiohttp's (a passed-in session's timeouts)
            lost = DeadlineExceeded(f"{method} {path}: no answer within {left:.3f}s", url=url)
            # a control call the server answers at once that gets nothing: a frozen server;
            # /run and prepare may wait on purpose, so they never count
            if control and not path.endswith("/prepare"):
                self._failed(lost)
            raise lost from exc
        except (aiohttp.ClientError, OSError, RuntimeError) as exc:
            if self._closed or session.closed:
                raise PoolClosed(
                    f"the session of the GymClient for {self.endpoint.label} is "
                    f"closed ({method} {path})"
                ) from exc
            if isinstance(exc, RuntimeError):
                raise
            lost = ConnectionLost(f"{method} {path}: {type(exc).__name__}: {exc}", url=url)
            if isinstance(exc, aiohttp.ClientConnectorError):
                self._failed(lost)  # never reached the server (refused, no route)
            raise lost from exc
        self.health.succeeded()
        return answer

    def _failed(self, exc: BaseException) -> None:
        if self.health.failed(exc):
            logger.warning("%s marked down: %s", self.endpoint.label, exc)
            self._ensure_probe()

    async def _probe_now(self, budget_s: float) -> None:
        self._probed_at = self._clock()  # concurrent calls do not probe as well
        try:
            await asyncio.wait_for(self._probe_once(), min(_health.PROBE_TIMEOUT_S, budget_s))
        except Exception as exc:  # no answer: still down
            logger.debug("probe of %s: %r", self.endpoint.label, exc)
            return
        if self.health.succeeded():
            logger.warning("%s is up again", self.endpoint.label)

    def _ensure_probe(self) -> None:
        if (self._probe is None or self._probe.done()) and not self._closed:
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        """While the endpoint is down: ask for capabilities every ``probe_every_s`` on a fresh
        connection, each ask bounded by asyncio itself; any HTTP answer marks it up again."""
        self._probed_at = self._clock()
        while self.health.down and not self._closed:
            await asyncio.sleep(self._probe_every_s)
            await self._probe_now(_health.PROBE_TIMEOUT_S)

    async def _probe_once(self) -> None:
        """One bare HTTP exchange on a connection of its own (none of the pools' state): any
        status line is an answer."""
        url = urlsplit(self.endpoint.url)
        port = url.port or (443 if url.scheme == "https" else 80)
        reader, writer = await asyncio.open_connection(
            url.hostname, port, ssl=url.scheme == "https" or None
        )
        try:
            writer.write(
                f"GET {url.path.rstrip('/')}{CAPABILITIES_PATH} HTTP/1.1\r\n"
                f"Host: {url.netloc}\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
        if not line.startswith(b"HTTP/"):
            raise ConnectionLost(f"probe: no HTTP answer ({line[:40]!r})", url=self.endpoint.url)
