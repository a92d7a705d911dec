"""The v2 gate's steps over a set of v2 participants (the controller side of NeMo Gym's v2).

- :func:`prepare` runs stage by stage in :data:`PREPARE_ORDER` (environment, model, agent,
  resources) and stops at the first stage with a participant that is not prepared; later stages
  are not called. Environments park first, then the policy model holds its answers so agents
  reach a boundary; resources servers go last because the others call them until they park.
- :func:`resume` runs in the reverse order (no server reopens before those it calls), goes on past
  failures (a participant never reached resumes on its own when its lease runs out), then raises.
- :func:`retire` and :func:`forget` run callers before callees (:data:`RETIRE_ORDER`).
- :func:`commit` and :func:`restore` fan out at once. A restore is all-or-nothing: when any
  participant fails, the replacement attempts are retired everywhere (freeing what was
  installed), every participant is resumed, and the error is raised; the controller then starts
  those rollouts over from their inputs.
- :class:`Renewer` renews the lease while a checkpoint is open, every min(timeout / 3, 10) s.
- :func:`checkpoint` is one whole checkpoint: prepare (with the renewer running), commit scoped to
  the episodes the controller continues less every reported restart, and resume whatever
  happened. A failure is :class:`~rl_gym_actors.errors.CheckpointFailed` naming the blockers of
  each participant that was not ready (at most 100 listed by Gym, the count is full).

Nothing here knows rollouts or ledgers: the caller says which episodes it continues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rl_gym_actors.errors import CheckpointFailed, RlGymError
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import KINDS, CommitAnswer, EpisodeId, PrepareAnswer

logger = logging.getLogger(__name__)
T = TypeVar("T")

PREPARE_ORDER = KINDS  # environment, model, agent, resources
RETIRE_ORDER: tuple[tuple[str, ...], ...] = (("environment",), ("agent",), ("model", "resources"))
MAX_RENEW_EVERY_S = 10.0
CLEANUP_MIN_S = 30.0  # a failed restore's cleanup gets at least this long
RESUME_SLACK_S = 2.0  # a checkpoint with a deadline still resumes within this past it


@dataclass(frozen=True)
class Participant:
    """One v2 participant: its name (unique in the set), kind and client."""

    name: str
    kind: str
    client: V2Client


class CoordinationError(RlGymError):
    """``operation`` failed on some participants: ``failures`` maps each name to its error."""

    def __init__(self, operation: str, failures: Mapping[str, BaseException]) -> None:
        self.operation = operation
        self.failures = {name: f"{type(e).__name__}: {e}" for name, e in failures.items()}
        super().__init__(
            f"{operation} failed on {len(self.failures)} participant(s): "
            + "; ".join(f"{n}: {t}" for n, t in self.failures.items())
        )


def ordered(participants: Iterable[Participant]) -> list[Participant]:
    """Sorted by prepare stage, then name; an unknown kind is refused."""
    parts = list(participants)
    for p in parts:
        if p.kind not in PREPARE_ORDER:
            raise ValueError(f"participant {p.name}: unknown kind {p.kind!r}")
    if len({p.name for p in parts}) != len(parts):
        raise ValueError("participant names must be unique")
    return sorted(parts, key=lambda p: (PREPARE_ORDER.index(p.kind), p.name))


async def _fan_out(
    parts: Sequence[Participant], call: Callable[[Participant], Awaitable[T]]
) -> tuple[dict[str, T], dict[str, BaseException]]:
    results = await asyncio.gather(*(call(p) for p in parts), return_exceptions=True)
    ok: dict[str, T] = {}
    failed: dict[str, BaseException] = {}
    for p, r in zip(parts, results, strict=True):
        if isinstance(r, asyncio.CancelledError):
            raise r
        if isinstance(r, BaseException):
            failed[p.name] = r
        else:
            ok[p.name] = r
    return ok, failed


@dataclass
class PrepareResult:
    prepared: bool
    replies: dict[str, PrepareAnswer] = field(default_factory=dict)

    def restarts(self) -> set[str]:
        """Capture keys of every episode some participant reported as a restart."""
        return {key for a in self.replies.values() for key in a.report.restarts}

    def continued(self, episodes: Iterable[EpisodeId]) -> list[EpisodeId]:
        """The commit scope: ``episodes`` less the restarts."""
        restarts = self.restarts()
        return [e for e in episodes if e.capture_key not in restarts]

    def blockers(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "phase": a.phase.value,
                "blockers": list(a.report.blockers),
                "blocker_count": a.report.blocker_count,
            }
            for name, a in self.replies.items()
            if not a.prepared
        }


async def prepare(
    participants: Sequence[Participant], checkpoint_id: str, *, deadline_ts: float
) -> PrepareResult:
    result = PrepareResult(prepared=True)
    for kind in PREPARE_ORDER:
        stage = [p for p in participants if p.kind == kind]
        if not stage:
            continue
        ok, failed = await _fan_out(
            stage, lambda p: p.client.prepare(checkpoint_id, deadline_ts=deadline_ts)
        )
        if failed:
            raise CoordinationError("prepare", failed)
        result.replies.update(ok)
        if not all(a.prepared for a in ok.values()):
            result.prepared = False
            return result
    return result


async def renew(
    participants: Sequence[Participant], checkpoint_id: str, *, deadline_ts: float
) -> None:
    _, failed = await _fan_out(
        participants, lambda p: p.client.renew(checkpoint_id, deadline_ts=deadline_ts)
    )
    if failed:
        raise CoordinationError("renew", failed)


async def commit(
    participants: Sequence[Participant],
    checkpoint_id: str,
    checkpoint_dirs: Mapping[str, str],
    episodes: Sequence[EpisodeId] | None,
    *,
    deadline_ts: float,
    stop: bool = False,
) -> dict[str, CommitAnswer]:
    ok, failed = await _fan_out(
        participants,
        lambda p: p.client.commit(
            checkpoint_id, checkpoint_dirs[p.name], episodes, deadline_ts=deadline_ts, stop=stop
        ),
    )
    if failed:
        raise CoordinationError("commit", failed)
    return ok


async def resume(
    participants: Sequence[Participant], checkpoint_id: str, *, deadline_ts: float
) -> None:
    failed: dict[str, BaseException] = {}
    for kind in reversed(PREPARE_ORDER):
        stage = [p for p in participants if p.kind == kind]
        if stage:
            _, f = await _fan_out(
                stage, lambda p: p.client.resume(checkpoint_id, deadline_ts=deadline_ts)
            )
            failed.update(f)
    if failed:
        raise CoordinationError("resume", failed)


async def _ordered_calls(
    participants: Sequence[Participant],
    operation: str,
    call: Callable[[Participant], Awaitable[Any]],
) -> None:
    for kinds in RETIRE_ORDER:
        stage = [p for p in participants if p.kind in kinds]
        if stage:
            _, failed = await _fan_out(stage, call)
            if failed:
                raise CoordinationError(operation, failed)


async def retire(
    participants: Sequence[Participant],
    checkpoint_id: str,
    episodes: Sequence[EpisodeId],
    *,
    deadline_ts: float,
) -> None:
    """Refuse, stop and free these attempts everywhere, callers before callees."""
    if episodes:
        await _ordered_calls(
            participants,
            "retire",
            lambda p: p.client.retire(checkpoint_id, episodes, deadline_ts=deadline_ts),
        )


async def forget(
    participants: Sequence[Participant],
    checkpoint_id: str,
    rollout_ids: Iterable[str],
    *,
    deadline_ts: float,
) -> None:
    """Drop the retired marks of rollouts finished for good, callers before callees."""
    ids = sorted(set(rollout_ids))
    if ids:
        await _ordered_calls(
            participants,
            "forget",
            lambda p: p.client.forget(checkpoint_id, ids, deadline_ts=deadline_ts),
        )


async def restore(
    participants: Sequence[Participant],
    checkpoint_id: str,
    checkpoint_dirs: Mapping[str, str],
    episodes: Sequence[EpisodeId],
    *,
    deadline_ts: float,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """All-or-nothing restore of ``episodes`` (checkpointed attempts) everywhere."""
    ok, failed = await _fan_out(
        participants,
        lambda p: p.client.restore(
            checkpoint_id, checkpoint_dirs[p.name], episodes, deadline_ts=deadline_ts
        ),
    )
    if not failed:
        return ok
    error = CoordinationError("restore", failed)
    cleanup_by = max(deadline_ts, clock() + CLEANUP_MIN_S)
    replacements = [e.next_attempt() for e in episodes]
    try:
        await retire(participants, checkpoint_id, replacements, deadline_ts=cleanup_by)
    except RlGymError as exc:
        logger.warning("restore %s: retiring the replacements failed: %s", checkpoint_id, exc)
    try:
        await resume(participants, checkpoint_id, deadline_ts=cleanup_by)
    except RlGymError as exc:
        logger.warning("restore %s: resume after the failure failed: %s", checkpoint_id, exc)
    raise error


def renew_every(timeout_s: float) -> float:
    return max(0.01, min(timeout_s / 3.0, MAX_RENEW_EVERY_S))


class Renewer:
    """Renews the open checkpoint's lease every :func:`renew_every` seconds until stopped; each
    renew asks for a lease to ``now + timeout_s``. A failed renew is logged, not raised: the next
    step fails on its own if the participant is gone."""

    def __init__(
        self,
        participants: Sequence[Participant],
        checkpoint_id: str,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._parts = participants
        self._cid = checkpoint_id
        self._timeout_s = timeout_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.renewals = 0

    async def _loop(self) -> None:
        every = renew_every(self._timeout_s)
        while True:
            await asyncio.sleep(every)
            try:
                await renew(self._parts, self._cid, deadline_ts=self._clock() + self._timeout_s)
                self.renewals += 1
            except RlGymError as exc:
                logger.warning("renewing checkpoint %s failed: %s", self._cid, exc)

    async def __aenter__(self) -> Renewer:
        self._task = asyncio.ensure_future(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass
class CheckpointOutcome:
    checkpoint_id: str
    scope: list[EpisodeId]  # what was committed as continued (restarts left out)
    restarts: list[str]  # capture keys reported as restarts
    commits: dict[str, CommitAnswer]
    renewals: int


async def checkpoint(
    participants: Sequence[Participant],
    checkpoint_id: str,
    checkpoint_dirs: Mapping[str, str],
    continued: Iterable[EpisodeId],
    *,
    timeout_s: float,
    deadline_ts: float | None = None,
    clock: Callable[[], float] = time.time,
    unresumed: Callable[[list[Participant]], None] | None = None,
) -> CheckpointOutcome:
    """One checkpoint (see the module docstring). Every step's deadline is ``now + timeout_s``;
    with ``deadline_ts``, prepare waits until a little before it (room left for the commit),
    commit runs until it, and resume gets :data:`RESUME_SLACK_S` past it. Leases are renewed to
    ``now + timeout_s`` either way. ``unresumed`` is handed the participants whose resume
    failed (a partition): the caller may go on resuming them in the background."""
    parts = ordered(participants)

    def by(stage: str) -> float:
        now = clock()
        if deadline_ts is None:
            return now + timeout_s
        if stage == "prepare":
            return deadline_ts - min(1.0, 0.1 * max(deadline_ts - now, 0.0))
        if stage == "commit":
            return deadline_ts
        return max(deadline_ts, now) + RESUME_SLACK_S

    episodes = list(continued)
    failure: CheckpointFailed | None = None
    outcome: CheckpointOutcome | None = None
    renewer = Renewer(parts, checkpoint_id, timeout_s, clock)
    try:
        async with renewer:
            prepared = await prepare(parts, checkpoint_id, deadline_ts=by("prepare"))
            if not prepared.prepared:
                blockers = prepared.blockers()
                failure = CheckpointFailed(
                    f"checkpoint {checkpoint_id}: not ready on "
                    + ", ".join(
                        f"{n} ({b['blocker_count']} blocker(s), e.g. {b['blockers'][:3]})"
                        for n, b in blockers.items()
                    ),
                    checkpoint_id=checkpoint_id,
                    blockers=blockers,
                )
            else:
                scope = prepared.continued(episodes)
                commits = await commit(
                    parts, checkpoint_id, checkpoint_dirs, scope, deadline_ts=by("commit")
                )
                outcome = CheckpointOutcome(
                    checkpoint_id, scope, sorted(prepared.restarts()), commits, renewer.renewals
                )
    except CoordinationError as exc:
        failure = CheckpointFailed(
            f"checkpoint {checkpoint_id}: {exc}",
            checkpoint_id=checkpoint_id,
            blockers={n: {"error": t} for n, t in exc.failures.items()},
        )
    finally:
        try:
            await resume(parts, checkpoint_id, deadline_ts=by("resume"))
        except CoordinationError as exc:
            if failure is None and outcome is not None:
                logger.warning("checkpoint %s committed but resume failed: %s", checkpoint_id, exc)
            if unresumed is not None:
                unresumed([p for p in parts if p.name in exc.failures])
    if failure is not None:
        raise failure
    assert outcome is not None
    outcome.renewals = renewer.renewals
    return outcome


async def discover_participants(
    clients: Mapping[str, Any], *, deadline_ts: float
) -> list[Participant]:
    """The v2 participants among ``clients`` (name -> GymClient), ordered; a server without the
    v2 routes is refused with ConfigError (it speaks the agent-checkpoint protocol). A server
    with both route sets is taken: the caller asked for v2 coordination."""
    from rl_gym_actors.errors import ConfigError
    from rl_gym_actors.gym.v2.discover import discover_protocol

    found: list[Participant] = []
    for name, gym in clients.items():
        d = await discover_protocol(gym, deadline_ts=deadline_ts)
        if d.kind is None:
            raise ConfigError(f"{name} does not speak the v2 checkpoint protocol")
        found.append(Participant(name, d.kind, V2Client(gym)))
    return ordered(found)


class Forgetter:
    """Forget hygiene: rollouts finished for good (sealed past a committed checkpoint, or
    failed) are collected and forgotten on every participant in batches of ``batch``, so the
    retired marks (and our server's kept replies) stay bounded. A forget refused while a
    checkpoint is open keeps its ids for the next flush."""

    def __init__(
        self,
        participants: Sequence[Participant],
        *,
        batch: int = 500,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self._parts = participants
        self._batch = batch
        self._timeout_s = timeout_s
        self._clock = clock
        self._pending: set[str] = set()
        self.forgotten = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def add(self, rollout_ids: Iterable[str], checkpoint_id: str) -> None:
        self._pending.update(rollout_ids)
        if len(self._pending) >= self._batch:
            await self.flush(checkpoint_id)

    async def flush(self, checkpoint_id: str) -> bool:
        """Forget everything pending; False (kept for later) when some participant refused."""
        ids = sorted(self._pending)
        try:
            await forget(
                self._parts, checkpoint_id, ids, deadline_ts=self._clock() + self._timeout_s
            )
        except CoordinationError as exc:
            logger.info("forget of %d rollouts deferred: %s", len(ids), exc)
            return False
        self._pending.difference_update(ids)
        self.forgotten += len(ids)
        return True
