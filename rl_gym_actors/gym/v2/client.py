"""Async client of one participant's v2 checkpoint routes (``/ng-control/v1/checkpoint/*``).

:class:`V2Client` rides on a :class:`~rl_gym_actors.gym.transport.GymTransport` (any
protocol's client, e.g. a ``GymClient``): its control pool, its bearer token, its dead-endpoint
health and its retry policy; the data plane (``/run``) stays that client's. Every method takes
an absolute ``deadline_ts``; the body carries it less a margin so the server answers before our
timeout fires.

Errors are typed by code (:mod:`rl_gym_actors.errors`): ``stale_checkpoint`` -> StaleCheckpoint,
``checkpoint_conflict`` -> CheckpointConflict, ``invalid_phase`` -> InvalidPhase,
``deadline_exceeded`` -> CheckpointDeadlinePassed, ``stale_attempt`` -> StaleAttempt,
``admission_closed`` -> AdmissionClosed, ``restart_in_scope`` -> RestartInScope,
``rollout_id_required`` -> RolloutIdRequired, ``unauthorized`` -> Unauthorized,
``invalid_checkpoint_state`` -> CheckpointStateInvalid, ``checkpoint_error`` -> CheckpointRejected;
FastAPI's own 422 -> InvalidRequest; no answer -> ConnectionLost / DeadlineExceeded.

Which calls repeat themselves inside their deadline: status, renew, retire, forget and resume
(idempotent: a retire runs again and finds nothing left to stop; a resumed id answers
``idempotent``); prepare, commit and restore only on a lost connection (the server replays a
recorded result for the same id, and a prepare waits on the server until its deadline).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rl_gym_actors.config import checkpoint_id_arg
from rl_gym_actors.errors import ConfigError, InvalidRequest
from rl_gym_actors.gym.answers import encode, model_of, ok
from rl_gym_actors.gym.retry import RetryOn, check_deadline
from rl_gym_actors.gym.transport import GymTransport
from rl_gym_actors.gym.v2.wire import (
    KEPT_ROUTE,
    MAX_KEPT_LISTED,
    REPLAY_ONLY_PARAM,
    ROUTE_PREFIX,
    CheckpointRequest,
    CommitAnswer,
    CommitRequest,
    EpisodeId,
    ForgetAnswer,
    ForgetRequest,
    KeptAnswer,
    PrepareAnswer,
    RenewAnswer,
    RestoreAnswer,
    RestoreRequest,
    ResumeAnswer,
    RetireAnswer,
    RetireRequest,
    StatusAnswer,
)
from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD

A = TypeVar("A", bound=BaseModel)


def episodes_arg(episodes: Iterable[EpisodeId | tuple[str, int]]) -> list[EpisodeId]:
    """Episode ids from EpisodeIds or (rollout_id, attempt) pairs; ConfigError on a bad one."""
    out: list[EpisodeId] = []
    for item in episodes:
        if isinstance(item, EpisodeId):
            out.append(item)
            continue
        try:
            rollout_id, attempt = item
            out.append(EpisodeId(rollout_id=rollout_id, attempt=attempt))
        except (TypeError, ValueError, ValidationError) as exc:
            raise ConfigError(f"invalid episode id {item!r}: {exc}") from exc
    return out


class V2Client:
    """The v2 checkpoint routes of one participant server (see the module docstring)."""

    def __init__(self, gym: GymTransport) -> None:
        if not isinstance(gym, GymTransport):
            raise ConfigError(f"V2Client needs a GymTransport, got {type(gym).__name__}")
        self.gym = gym

    def __reduce__(self):
        return (V2Client, (self.gym,))

    def __repr__(self) -> str:
        return f"V2Client({self.gym.endpoint.label!r})"

    @property
    def label(self) -> str:
        return self.gym.endpoint.label

    @property
    def endpoint(self) -> Any:
        """The server's :class:`~rl_gym_actors.config.GymEndpoint` (as a GymClient's)."""
        return self.gym.endpoint

    async def status(self, *, deadline_ts: float) -> StatusAnswer:
        """``GET /status``: kind, instance, phase, active id, lease, retired marks, readiness."""
        check_deadline(deadline_ts)

        async def attempt(try_deadline: float) -> StatusAnswer:
            answer = await self.gym._send(
                "GET", ROUTE_PREFIX + "/status", control=True, deadline_ts=try_deadline
            )
            return model_of(StatusAnswer, answer)

        return await self.gym._with_retry(attempt, RetryOn.IDEMPOTENT, deadline_ts, "v2 status")

    async def kept(self, *, deadline_ts: float, limit: int = MAX_KEPT_LISTED) -> KeptAnswer | None:
        """(ext) ``GET /kept`` on our server: the kept replies' capture keys (sorted, at most
        ``limit``) and their count; None from a server without the route (a real Gym keeps no
        reply)."""
        check_deadline(deadline_ts)

        async def attempt(try_deadline: float) -> KeptAnswer:
            answer = await self.gym._send(
                "GET",
                ROUTE_PREFIX + KEPT_ROUTE,
                control=True,
                params={"limit": str(limit)},
                deadline_ts=try_deadline,
            )
            return model_of(KeptAnswer, answer)

        try:
            return await self.gym._with_retry(attempt, RetryOn.IDEMPOTENT, deadline_ts, "v2 kept")
        except InvalidRequest as exc:
            if exc.status in (404, 405):
                return None
            raise

    async def prepare(self, checkpoint_id: str, *, deadline_ts: float) -> PrepareAnswer:
        """Close admission and wait (on the server, until ``deadline_ts``) for readiness. An answer
        whose phase is not ``prepared`` names the blockers; admission stays closed until resume."""
        return await self._call(
            "prepare", PrepareAnswer, CheckpointRequest, deadline_ts, checkpoint_id=checkpoint_id
        )

    async def renew(self, checkpoint_id: str, *, deadline_ts: float) -> RenewAnswer:
        """Extend the lease of the open checkpoint to ``deadline_ts`` + the server's grace."""
        return await self._call(
            "renew", RenewAnswer, CheckpointRequest, deadline_ts, checkpoint_id=checkpoint_id
        )

    async def retire(
        self,
        checkpoint_id: str,
        episodes: Iterable[EpisodeId | tuple[str, int]],
        *,
        deadline_ts: float,
    ) -> RetireAnswer:
        """Refuse these attempts (and earlier ones) until forget, stop their work, free their
        state. Allowed while idle and after a restore; ``checkpoint_id`` only fences."""
        episode_ids = episodes_arg(episodes)
        if not episode_ids:
            raise ConfigError("retire needs at least one episode")
        return await self._call(
            "retire",
            RetireAnswer,
            RetireRequest,
            deadline_ts,
            checkpoint_id=checkpoint_id,
            episode_ids=episode_ids,
        )

    async def forget(
        self, checkpoint_id: str, rollout_ids: Iterable[str], *, deadline_ts: float
    ) -> ForgetAnswer:
        """Drop the retired marks of rollouts finished for good."""
        ids = sorted(set(rollout_ids))
        if not ids:
            raise ConfigError("forget needs at least one rollout id")
        return await self._call(
            "forget",
            ForgetAnswer,
            ForgetRequest,
            deadline_ts,
            checkpoint_id=checkpoint_id,
            rollout_ids=ids,
        )

    async def commit(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        episodes: Iterable[EpisodeId | tuple[str, int]] | None,
        *,
        deadline_ts: float,
        stop: bool = False,
    ) -> CommitAnswer:
        """Write the prepared state of ``episodes`` (None: all) under ``checkpoint_dir``."""
        return await self._call(
            "commit",
            CommitAnswer,
            CommitRequest,
            deadline_ts,
            checkpoint_id=checkpoint_id,
            checkpoint_dir=checkpoint_dir,
            episode_ids=None if episodes is None else episodes_arg(episodes),
            stop=stop,
        )

    async def restore(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        episodes: Iterable[EpisodeId | tuple[str, int]],
        *,
        deadline_ts: float,
    ) -> RestoreAnswer:
        """Install the records of ``episodes`` (checkpointed attempts) as their next attempts."""
        return await self._call(
            "restore",
            RestoreAnswer,
            RestoreRequest,
            deadline_ts,
            checkpoint_id=checkpoint_id,
            checkpoint_dir=checkpoint_dir,
            episode_ids=episodes_arg(episodes),
        )

    async def resume(self, checkpoint_id: str, *, deadline_ts: float) -> ResumeAnswer:
        """Reopen admission (also the abort); a resumed id answers ``idempotent``."""
        return await self._call(
            "resume", ResumeAnswer, CheckpointRequest, deadline_ts, checkpoint_id=checkpoint_id
        )

    async def kept_reply(
        self, row: Mapping[str, Any], *, rollout_id: str, attempt: int, deadline_ts: float
    ) -> Any:
        """(ext) ``POST /run?replay_only=1`` on our server: the attempt's kept reply (the agent
        never runs); ``NotCompleted`` when none is kept (it runs, or never started),
        ``StaleAttempt`` when it was retired. Repeated inside the deadline (it starts nothing)."""
        check_deadline(deadline_ts)
        data = encode({**row, ROLLOUT_ID_FIELD: rollout_id, ATTEMPT_INDEX_FIELD: attempt})
        gym = self.gym

        async def once(try_deadline: float) -> Any:
            answer = await gym._send(
                "POST",
                "/run",
                control=False,
                data=data,
                params={REPLAY_ONLY_PARAM: "1"},
                deadline_ts=try_deadline,
            )
            return ok(answer)

        return await gym._with_retry(once, RetryOn.IDEMPOTENT, deadline_ts, "v2 kept reply")

    async def _call(
        self,
        operation: str,
        answer_model: type[A],
        request_model: type[CheckpointRequest],
        deadline_ts: float,
        **fields: Any,
    ) -> A:
        checkpoint_id_arg(fields["checkpoint_id"])
        check_deadline(deadline_ts)
        try:
            request_model(deadline_ts=deadline_ts, **fields)
        except ValidationError as exc:
            raise ConfigError(f"invalid v2 {operation} request: {exc}") from exc
        kind = (
            RetryOn.TRANSPORT
            if operation in ("prepare", "commit", "restore")
            else RetryOn.IDEMPOTENT
        )
        gym = self.gym

        async def attempt(try_deadline: float) -> A:
            body = request_model(deadline_ts=gym.wire_deadline(try_deadline), **fields)
            answer = await gym._send(
                "POST",
                f"{ROUTE_PREFIX}/{operation}",
                control=True,
                data=encode(body.model_dump(mode="json")),
                deadline_ts=try_deadline,
            )
            return model_of(answer_model, answer)

        return await gym._with_retry(attempt, kind, deadline_ts, f"v2 {operation}")
