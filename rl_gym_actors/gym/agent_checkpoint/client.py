"""Async client of one Gym agent server: the data plane ``/run`` and the checkpoint control plane.

Every method takes ``deadline_ts``, an absolute Unix time; the call's timeout is derived from it
and ``DeadlineExceeded`` is raised when it passes. Every non-2xx answer becomes the typed error
from :func:`rl_gym_actors.errors.gym_error`; transport failures become ``ConnectionLost``.
Idempotent calls retry inside their deadline (see :mod:`rl_gym_actors.gym.retry`); ``run`` never
does.

Coping with a real Gym server (docs/PROTOCOL.md, section 7; the answers' mapping is
:mod:`rl_gym_actors.gym.answers`):

- On ``/run``, any 5xx is the server or its agent failing (a real Gym answers an agent that
  raised, and a run that ``retire`` cancelled, with a 500 whose body is a JSON string or plain
  text): ``AgentFailed`` carrying the status and the body's text. The caller retires the try
  next, which confirms it did not complete. Not so a 503 ``too_many_connections``: the server
  refused the connection before it read the request, so the run is sent again within its
  deadline, then raises ``ServerBusy`` (infrastructure: nothing ran). No answer at all stays
  ``ConnectionLost``. On a
  control call, a non-JSON 5xx is ``ConnectionLost`` carrying the text (repeated if idempotent).
- Its prepare 409 carries counts only; :meth:`GymClient.prepare` then reads the lists from
  ``status``.

Pools, deadlines, dead and frozen servers, and the mapping of aiohttp's exceptions are the
shared :class:`~rl_gym_actors.gym.transport.GymTransport`'s.

A ``checkpoint_conflict`` whose body does not name the checkpoint id in the way is completed
from ``capabilities`` when the server has that route, so ``CheckpointConflict.active_checkpoint_id``
says what to abort.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from rl_gym_actors.config import checkpoint_id_arg
from rl_gym_actors.errors import (
    CheckpointConflict,
    ConfigError,
    GymError,
    ProtocolViolation,
    RlGymError,
)
from rl_gym_actors.gym.agent_checkpoint.client_answers import (
    RunResult,
    as_receipt,
    check_key,
    header_receipt,
    prepare_incomplete,
)
from rl_gym_actors.gym.agent_checkpoint.client_bulk import BulkCalls
from rl_gym_actors.gym.answers import (
    build_request,
    encode,
    error_for_response,
    model_of,
    ok,
    run_failure,
)
from rl_gym_actors.gym.retry import RetryOn, check_deadline
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    CAPABILITIES_PATH,
    CONTROL_PREFIX,
    MAX_RETIRE_BATCH,
    REPLAYED_HEADER,
    ROLLOUT_ID_FIELD,
    AckAnswer,
    AckBatchAnswer,
    AckBatchRequest,
    Capabilities,
    CommitAnswer,
    CommitRequest,
    CompletionReceipt,
    LeaseAnswer,
    PhaseRequest,
    ReceiptAnswer,
    ResumeAnswer,
    RetireAnswer,
    RetireBatchAnswer,
    RetireKeyAnswer,
    RetireRequest,
    StatusReport,
)

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# re-exported: the pure answer mappings are part of this client's API
__all__ = ["GymClient", "RunResult", "error_for_response", "run_failure"]


class GymClient(BulkCalls):
    """Async client of one Gym server speaking the agent-checkpoint protocol; one per process
    or actor, shared by its coroutines. Construction, pickling, pools and loop binding are
    :class:`~rl_gym_actors.gym.transport.GymTransport`'s; the listings and wire-form ACKs
    :class:`~rl_gym_actors.gym.agent_checkpoint.client_bulk.BulkCalls`'."""

    _features: frozenset[str] | None = None  # the server's capabilities, once asked
    _epoch: str | None = None  # (ext) the server's store epoch, as first seen

    # ------------------------------------------------------------ data plane

    async def run(
        self, row: Mapping[str, Any], *, rollout_id: str, attempt_index: int, deadline_ts: float
    ) -> RunResult:
        """``POST /run`` for the key (rollout_id, attempt_index). Never retried, but for a
        refusal that says the agent never ran (``ServerBusy``).

        Raises ``StaleAttempt``, ``DuplicateExecution``, ``AdmissionClosed``, ``AgentFailed``
        (any 5xx: the agent or its server failed; ``status`` and ``detail`` say how);
        ``ServerBusy`` when the server refused every connection (503 ``too_many_connections``,
        sent again with backoff until the deadline: the agent never ran);
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
        check_key(rollout_id, attempt_index)
        if not isinstance(row, Mapping):
            raise ConfigError(f"row must be a mapping, got {type(row).__name__}")
        for name, value in ((ROLLOUT_ID_FIELD, rollout_id), (ATTEMPT_INDEX_FIELD, attempt_index)):
            if name in row and row[name] != value:
                raise ConfigError(f"row carries {name}={row[name]!r}, the call says {value!r}")
        data = encode({**row, ROLLOUT_ID_FIELD: rollout_id, ATTEMPT_INDEX_FIELD: attempt_index})

        async def attempt(try_deadline: float) -> RunResult:
            answer = await self._send(
                "POST", "/run", control=False, data=data, deadline_ts=try_deadline
            )
            if answer.status >= 500 and kind is RetryOn.NOTHING:
                raise run_failure(answer.status, answer.raw, url=answer.url)
            return RunResult(
                reply=ok(answer),
                replayed=answer.headers.get(REPLAYED_HEADER, "").strip() == "1",
                raw=answer.raw,
                receipt=header_receipt(answer),
            )

        return await self._with_retry(
            attempt, kind, deadline_ts, f"run {rollout_id}/{attempt_index}"
        )

    # ------------------------------------------------------------ control plane

    async def receipt(
        self, rollout_id: str, attempt_index: int, *, deadline_ts: float
    ) -> ReceiptAnswer:
        """The completion receipt of a completed (or, from our server, ACKed) key; retried
        inside the one deadline. Our server (it lists the ``receipt`` route in its features)
        is asked on (ext) ``/receipt``; any other server on ``/completion-receipt``, the bare
        receipt of a real Gym's later participant (a server without that route answers 404:
        ``InvalidRequest``, and the caller reads receipts from a listing). Raises
        ``NotCompleted``, ``StaleAttempt``, ``UnknownExecution`` or, from a real Gym,
        ``AckRejected`` (``completed_execution_acknowledgement_error``: no receipt to give)."""
        check_key(rollout_id, attempt_index)
        params = {"rollout_id": rollout_id, "attempt_index": str(attempt_index)}
        if await self.offers("receipt", deadline_ts=deadline_ts):
            return await self._control_call(
                ReceiptAnswer,
                "GET",
                "/receipt",
                params=params,
                deadline_ts=deadline_ts,
                kind=RetryOn.IDEMPOTENT,
            )
        bare = await self._control_call(
            CompletionReceipt,
            "GET",
            "/completion-receipt",
            params=params,
            deadline_ts=deadline_ts,
            kind=RetryOn.IDEMPOTENT,
        )
        return ReceiptAnswer(state="completed", completion_receipt=bare)

    async def acknowledge(
        self, receipt: CompletionReceipt | Mapping[str, Any], *, deadline_ts: float
    ) -> AckAnswer:
        """ACK one completed execution by its receipt. Raises ``AckRejected`` when the key is
        unknown, not completed, or any receipt field differs."""
        body = as_receipt(receipt).model_dump(mode="json", exclude_none=True)
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
        request = build_request(AckBatchRequest, executions=[as_receipt(r) for r in receipts])
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
        check_key(rollout_id, attempt_index)
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

    async def retire_batch(
        self, keys: Sequence[tuple[str, int]], *, checkpoint_id: str, deadline_ts: float
    ) -> list[RetireKeyAnswer]:
        """(ext) ``retire`` of many keys in one call, answered per key in the order sent; only
        for a server that offers ``retire-batch`` (see :meth:`offers`). The body is written by
        hand (keys checked here, as its model would), the answer read by its model."""
        checkpoint_id_arg(checkpoint_id)
        for rollout_id, attempt_index in keys:
            check_key(rollout_id, attempt_index)
        sent = [tuple(k) for k in keys]
        if not 0 < len(sent) <= MAX_RETIRE_BATCH or len(set(sent)) != len(sent):
            raise ConfigError(f"retire-batch: 1 to {MAX_RETIRE_BATCH} keys, each once")
        executions = [{"rollout_id": r, "attempt_index": i} for r, i in sent]
        check_deadline(deadline_ts)

        async def attempt(try_deadline: float) -> RetireBatchAnswer:
            body = {
                "schema_version": 1,
                "checkpoint_id": checkpoint_id,
                "deadline_ts": self.wire_deadline(try_deadline),
                "executions": executions,
            }
            answer = await self._send(
                "POST",
                CONTROL_PREFIX + "/retire-batch",
                control=True,
                data=encode(body),
                deadline_ts=try_deadline,
            )
            return model_of(RetireBatchAnswer, answer)

        answer = await self._with_retry(attempt, RetryOn.IDEMPOTENT, deadline_ts, "retire-batch")
        if [a.key for a in answer.retired] != sent:
            raise ProtocolViolation(f"{self.endpoint.label}: retire-batch answered other keys")
        return answer.retired

    async def offers(self, feature: str, *, deadline_ts: float) -> bool:
        """(ext) Whether the server lists ``feature`` in its capabilities (asked once and kept;
        a server without the route offers nothing)."""
        if self._features is None:
            try:
                caps = await self.capabilities(deadline_ts=deadline_ts)
            except RlGymError:
                return False  # not kept: asked again next time
            self._features = frozenset(caps.features) if caps is not None else frozenset()
        return feature in self._features

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
            answer = await self._send_prepare(checkpoint_id, try_deadline)
            if answer.status == 409:
                incomplete = prepare_incomplete(answer)
                if incomplete is not None:
                    return incomplete.report
            return model_of(StatusReport, answer)

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

    async def epoch_change(self, *, deadline_ts: float) -> tuple[str, str] | None:
        """(ext) ``(first, now)`` when the server's store epoch is not the first one this
        client saw (it lost what it held; the new one is remembered from then on); None when
        unchanged, or not reported (a real Gym: no ``/lease`` route)."""
        try:
            lease = await self._control_call(
                LeaseAnswer, "GET", "/lease", deadline_ts=deadline_ts, kind=RetryOn.IDEMPOTENT
            )
        except GymError as exc:
            if exc.status in (404, 405):
                return None
            raise
        first, now = self._epoch, lease.store_epoch
        if now is None or first == now:
            return None
        self._epoch = now
        return None if first is None else (first, now)

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
        build_request(request_model, deadline_ts=check_deadline(deadline_ts), **fields)

        async def attempt(try_deadline: float) -> M:
            body = request_model(deadline_ts=self.wire_deadline(try_deadline), **fields)
            answer = await self._send(
                "POST",
                CONTROL_PREFIX + path,
                control=True,
                data=encode(body.model_dump(mode="json")),
                deadline_ts=try_deadline,
            )
            return model_of(answer_model, answer)

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
        data = None if body is None else encode(body)
        full = CONTROL_PREFIX + path if prefixed else path

        async def attempt(try_deadline: float) -> M:
            answer = await self._send(
                method, full, control=True, data=data, params=params, deadline_ts=try_deadline
            )
            return model_of(answer_model, answer)

        return await self._with_retry(attempt, kind, deadline_ts, path.lstrip("/"))

    async def _with_retry(self, attempt, kind: RetryOn, deadline_ts: float, what: str):
        deadline_ts = check_deadline(deadline_ts)
        try:
            return await super()._with_retry(attempt, kind, deadline_ts, what)
        except CheckpointConflict as exc:
            if exc.active_checkpoint_id is None:
                exc.active_checkpoint_id = await self._holder(deadline_ts)
            raise

    async def active_checkpoint_id(self, *, deadline_ts: float) -> str | None:
        """The checkpoint id that holds the server now (from capabilities); None when none
        does or the server does not say."""
        return await self._holder(deadline_ts)

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
