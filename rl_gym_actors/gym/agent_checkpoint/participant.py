"""The server-side state of Gym executions, apart from HTTP.

Per key (rollout_id, attempt_index) an :class:`~rl_gym_actors.gym.store.Execution` in one of the
states of :class:`~rl_gym_actors.protocol.ExecutionState`:

    (unknown) --run--> running --agent returns--> completed --ACK--> acknowledged
                          |  \\--agent raises / retire / restart--> tombstoned
    (unknown) --retire--> tombstoned

A key starts at most once (every state after ``running`` refuses a new start), so its
``execution_generation`` is 1. Parked states exist in the model and the counts, but nothing
parks in this server. The records of settled keys (ACKed or tombstoned) leave memory for the
compact :class:`~rl_gym_actors.gym.agent_checkpoint.settled.SettledKeys` at the second committed
checkpoint after they settled (so a key stays fully answerable for at least one checkpoint
interval), and at once when loaded from a store; their full records stay in a durable store,
which answers for them when asked.

Decide, then do: :class:`ParticipantCore` is synchronous and pure (no clock, no I/O, no asyncio).
Each call validates, makes its transition at once, queues the records the transition needs
made durable (:meth:`ParticipantCore.take_records`), and answers with the wire models of
:mod:`rl_gym_actors.protocol`. :class:`Participant` is the thin async shell: it runs each agent
call as its own task (a caller that disconnects never cancels it), waits in prepare, cancels a
run on retire, writes checkpoint files, keeps the checkpoint lease, and awaits the store before
every answer, so nothing is answered before it is durable. Rejections are the typed errors of
:mod:`rl_gym_actors.errors` with the HTTP status to answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rl_gym_actors.errors import (
    AckRejected,
    AdmissionClosed,
    AgentFailed,
    DuplicateExecution,
    GymError,
    GymRejected,
    InvalidRequest,
    NotCompleted,
    StaleAttempt,
    UnknownExecution,
)
from rl_gym_actors.gym.agent_checkpoint.settled import SETTLED, SettledKeys
from rl_gym_actors.gym.agents import LineagedReply
from rl_gym_actors.gym.fence import RESUMED, CheckpointFence, Expired, FenceState
from rl_gym_actors.gym.store import (
    Execution,
    FenceRecord,
    MemoryStore,
    Record,
    SpentCheckpoint,
    Store,
    StoreFailed,
    confine,
    write_checkpoint,
)
from rl_gym_actors.protocol import (
    AckAnswer,
    AckBatchAnswer,
    AttemptInfo,
    CommitAnswer,
    CompletionReceipt,
    ExecutionKey,
    ExecutionState,
    ExpiredCheckpoint,
    LeaseInfo,
    ModelLineage,
    ReceiptAnswer,
    ResumeAnswer,
    RetireAnswer,
    StatusReport,
    prepare_incomplete_detail,
)

logger = logging.getLogger(__name__)

Agent = Callable[[dict[str, Any]], Awaitable[Any]]

S = ExecutionState
_ACTIVE = (S.RUNNING, S.PARKED, S.COMPLETED)  # not yet released; listed by status
_LEASE_WRITE_SLACK_S = 1.0  # a renewed lease is written when it moved at least this much
START_WRITE_DELAY_S = 0.002  # a run's start record waits this long to share a write


class PrepareIncomplete(GymRejected):
    """409 ``agent_prepare_incomplete``: prepare is not ready. ``body`` is the full status."""

    code = "agent_prepare_incomplete"


class ServerUnavailable(GymError):
    """503: the server is shutting down; nothing was answered."""

    code = "unavailable"


class StoreWriteFailed(GymError):
    """503: the store could not make this request's records durable (they are written again
    with the next write); the request was not answered as done."""

    code = "store_write_failed"


class StoreUnavailable(GymError):
    """503: the store has failed several writes in a row; requests that write are refused at
    once until a retry succeeds (``GET /ready`` says which)."""

    code = "store_unavailable"


@dataclass(frozen=True, slots=True)
class Replay:
    """``/run`` of a completed key: the stored reply bytes and receipt; the agent does not run."""

    reply: bytes
    receipt: bytes


@dataclass(frozen=True, slots=True)
class Start:
    """``/run`` of a new key: run the agent as this generation."""

    generation: int


def _label(key: ExecutionKey) -> str:
    return f"({key[0]!r}, {key[1]})"


def _receipt(raw: bytes | None) -> CompletionReceipt | None:
    return None if raw is None else CompletionReceipt.model_validate_json(raw)


class ParticipantCore:
    """Every decision of the participant, synchronously. Not thread-safe: one owner (one loop).

    ``lookup`` finds the durable record of a key that left memory (None: not kept).
    """

    def __init__(
        self,
        executions: Iterable[Execution] = (),
        spent: dict[str, bytes] | None = None,
        *,
        fence: FenceState | None = None,
        lease_s: float | None = None,
        lookup: Callable[[ExecutionKey], Execution | None] | None = None,
    ) -> None:
        self._all: dict[ExecutionKey, Execution] = {}
        self._active: dict[ExecutionKey, Execution] = {}
        self._settled = SettledKeys()
        self._settling: list[ExecutionKey] = []  # settled since the last commit
        self._to_compact: list[ExecutionKey] = []  # settled before it: compacted at the next one
        self._counts: Counter[ExecutionState] = Counter()
        self._records: list[Record] = []
        self._lookup = lookup or (lambda key: None)
        self.fence = CheckpointFence(
            {cid: json.loads(answer) for cid, answer in (spent or {}).items()}, lease_s=lease_s
        )
        if fence is not None:
            self.fence.restore(fence)
        self.agent_starts = 0
        for e in executions:
            self._put(e, durable=False)
        self.compact(list(self._all))
        self._settling = []

    # ------------------------------------------------------------ bookkeeping

    def _put(self, e: Execution, *, durable: bool = True) -> None:
        old = self._all.get(e.key)
        if old is not None:
            self._counts[old.state] -= 1
        if e.state in SETTLED and (old is None or old.state not in SETTLED):
            self._settling.append(e.key)
        self._counts[e.state] += 1
        self._all[e.key] = e
        if e.state in _ACTIVE:
            self._active[e.key] = e
        else:
            self._active.pop(e.key, None)
        if durable:
            self._records.append(e)

    def _fence_changed(self) -> None:
        self._records.append(FenceRecord(self.fence.state()))

    def take_records(self) -> list[Record]:
        """The records the decisions since the last call need made durable, in order."""
        records, self._records = self._records, []
        return records

    def get(self, key: ExecutionKey) -> Execution | None:
        """The key's record while it is kept in memory."""
        return self._all.get(key)

    def state_of(self, key: ExecutionKey) -> ExecutionState | None:
        e = self._all.get(key)
        return e.state if e is not None else self._settled.state_of(key)

    def executions(self) -> list[Execution]:
        """The records kept in memory (settled keys compacted away are not among them)."""
        return list(self._all.values())

    def count(self, state: ExecutionState) -> int:
        return self._counts[state]

    @property
    def settled(self) -> bool:
        """Nothing runs and nothing is parked without a boundary: prepare stops waiting."""
        return self._counts[S.RUNNING] == 0 and self._counts[S.PARKED] == 0

    def compact(self, keys: Iterable[ExecutionKey]) -> int:
        """Move those of ``keys`` that are settled out of memory into the compact fence.
        How many moved."""
        moved: dict[ExecutionState, list[ExecutionKey]] = {state: [] for state in SETTLED}
        for key in keys:
            e = self._all.get(key)
            if e is not None and e.state in SETTLED:
                moved[e.state].append(key)
        self._settled.add_all(moved)
        for keys in moved.values():
            for key in keys:
                del self._all[key]
        return sum(len(keys) for keys in moved.values())

    def _settled_record(self, key: ExecutionKey) -> Execution | None:
        """A compacted key's record: from the durable store, else a receipt-less stand-in."""
        state = self._settled.state_of(key)
        if state is None:
            return None
        e = self._lookup(key)
        return e if e is not None else Execution(key[0], key[1], state)

    def _record(self, key: ExecutionKey) -> Execution | None:
        e = self._all.get(key)
        return e if e is not None else self._settled_record(key)

    # ------------------------------------------------------------ data plane

    def begin_run(self, key: ExecutionKey) -> Replay | Start:
        """Decide a ``/run``, in the contract's order."""
        e = self._all.get(key)
        state = e.state if e is not None else self._settled.state_of(key)
        if state is not None:
            if state in SETTLED:
                raise StaleAttempt(f"execution {_label(key)} is {state.value}", status=409)
            if state is S.COMPLETED:
                return Replay(e.reply or b"", e.receipt or b"")
            raise DuplicateExecution(f"execution {_label(key)} is {state.value}", status=409)
        if not self.fence.admission_open:
            raise AdmissionClosed(
                f"admission is closed: checkpoint {self.fence.active!r} is "
                f"{self.fence.phase.value}; wait for its resume",
                status=409,
            )
        self._put(Execution(key[0], key[1], S.RUNNING, generation=1))
        self.agent_starts += 1
        return Start(generation=1)

    def is_running(self, key: ExecutionKey, generation: int) -> bool:
        e = self._all.get(key)
        return e is not None and e.state is S.RUNNING and e.generation == generation

    def finish_run(self, key: ExecutionKey, generation: int, reply: bytes, receipt: bytes) -> None:
        """The agent returned: keep the reply. Raises ``StaleAttempt`` if retired meanwhile."""
        if not self.is_running(key, generation):
            raise StaleAttempt(f"execution {_label(key)} was retired while it ran", status=409)
        self._put(replace(self._all[key], state=S.COMPLETED, reply=reply, receipt=receipt))

    def fail_run(self, key: ExecutionKey, generation: int) -> None:
        """The agent raised: tombstone the key (unless retire already did)."""
        if self.is_running(key, generation):
            self._put(replace(self._all[key], state=S.TOMBSTONED))

    def receipt(self, key: ExecutionKey) -> ReceiptAnswer:
        """The (ext) receipt answer: the same for as long as the key is kept."""
        e = self._record(key)
        if e is None:
            raise UnknownExecution(f"execution {_label(key)} was never seen", status=404)
        if e.state in (S.RUNNING, S.PARKED):
            raise NotCompleted(f"execution {_label(key)} is {e.state.value}", status=409)
        if e.state is S.TOMBSTONED:
            raise StaleAttempt(f"execution {_label(key)} is tombstoned", status=409)
        # an ACKed key compacted without a durable store has no receipt any more
        return ReceiptAnswer(state=e.state.value, completion_receipt=_receipt(e.receipt))

    # ------------------------------------------------------------ ACK and retire

    def _ackable(self, receipt: CompletionReceipt) -> Execution:
        key = receipt.key
        e = self._record(key)
        if e is None:
            raise AckRejected(f"execution {_label(key)} is unknown", status=409)
        if e.state not in (S.COMPLETED, S.ACKNOWLEDGED):
            raise AckRejected(
                f"execution {_label(key)} is {e.state.value}, not completed", status=409
            )
        if e.receipt is None:  # ACKed, compacted, nothing durable to compare with
            return e
        stored = json.loads(e.receipt)
        given = receipt.wire()
        differ = sorted(k for k in set(stored) | set(given) if stored.get(k) != given.get(k))
        if differ:
            raise AckRejected(
                f"receipt of {_label(key)} differs from the stored one in {', '.join(differ)}",
                status=409,
            )
        return e

    def acknowledge(self, receipt: CompletionReceipt) -> AckAnswer:
        e = self._ackable(receipt)
        if e.state is S.ACKNOWLEDGED:
            return AckAnswer(acknowledged=False, idempotent=True)
        self._put(replace(e, state=S.ACKNOWLEDGED, reply=None))
        return AckAnswer(acknowledged=True, idempotent=False)

    def acknowledge_batch(self, receipts: Sequence[CompletionReceipt]) -> AckBatchAnswer:
        """All or nothing: every receipt is checked before any key is released."""
        checked = [self._ackable(r) for r in receipts]
        for e in checked:
            if e.state is S.COMPLETED:
                self._put(replace(e, state=S.ACKNOWLEDGED, reply=None))
        return AckBatchAnswer(acknowledged=list(receipts))

    def retire(self, checkpoint_id: str | None, key: ExecutionKey) -> tuple[RetireAnswer, bool]:
        """The retire answer, and whether a running agent call must be cancelled."""
        self.fence.check_lenient(checkpoint_id)
        state = self.state_of(key)
        if state is None:
            self._put(Execution(key[0], key[1], S.TOMBSTONED, generation=0))
            return RetireAnswer(retired=False, tombstoned=True), False
        if state in (S.RUNNING, S.PARKED):
            self._put(replace(self._all[key], state=S.TOMBSTONED))
            return RetireAnswer(retired=True, tombstoned=True), True
        if state is S.COMPLETED:  # only an ACK releases it
            return RetireAnswer(
                retired=False, tombstoned=False, completed_unacknowledged=True
            ), False
        if state is S.TOMBSTONED:
            return RetireAnswer(retired=False, tombstoned=True), False
        return RetireAnswer(retired=False, tombstoned=False, acknowledged=True), False

    # ------------------------------------------------------------ status and checkpoints

    def report(self) -> StatusReport:
        """The status object (plus (ext) ``phase``, ``checkpoint_id`` and the lease)."""
        c = self._counts
        # nothing here parks at a boundary, so every parked execution counts as without one
        parked_without = c[S.PARKED]
        active = [
            AttemptInfo(
                rollout_id=e.rollout_id,
                attempt_index=e.attempt_index,
                state=e.state.value,
                execution_generation=e.generation,
                completion_receipt=_receipt(e.receipt),
            )
            for e in sorted(self._active.values(), key=lambda e: e.key)
        ]
        completed = [a for a in active if a.state == S.COMPLETED.value]
        fence = self.fence
        lease = None
        if fence.lease_s is not None:
            last = fence.last_expired
            lease = LeaseInfo(
                lease_s=fence.lease_s,
                lease_until=fence.lease_until,
                last_expired=None
                if last is None
                else ExpiredCheckpoint(
                    checkpoint_id=last.checkpoint_id,
                    phase=last.phase.value,
                    lease_until=last.lease_until,
                    expired_at=last.at,
                ),
            )
        return StatusReport(
            state="accepting" if fence.admission_open else "preparing",
            ready_to_commit=c[S.RUNNING] == 0 and parked_without == 0 and c[S.COMPLETED] == 0,
            running=c[S.RUNNING],
            parked=c[S.PARKED],
            parked_with_boundary=0,
            parked_without_boundary=parked_without,
            completed_unacknowledged=c[S.COMPLETED],
            acknowledged_completed=c[S.ACKNOWLEDGED],
            active=len(active),
            blocking_attempts=active,
            completed_unacknowledged_attempts=completed,
            executions=active,
            phase=fence.phase.value,
            checkpoint_id=fence.active,
            checkpoint_lease=lease,
        )

    def status(self, checkpoint_id: str | None) -> StatusReport:
        self.fence.check_lenient(checkpoint_id)
        return self.report()

    def begin_prepare(self, checkpoint_id: str) -> StatusReport | None:
        """Close admission. The recorded answer of a repeated ready prepare, else None: then
        wait until :attr:`settled` (or the deadline) and call :meth:`finish_prepare`."""
        recorded = self.fence.recorded(checkpoint_id, "prepare")
        if recorded is not None:
            return StatusReport.model_validate(recorded)
        self.fence.advance(checkpoint_id, "prepare")
        self._fence_changed()
        return None

    def finish_prepare(self, checkpoint_id: str) -> StatusReport:
        """Ready: the status (recorded for repeats). Not ready: raises ``PrepareIncomplete``."""
        recorded = self.fence.recorded(checkpoint_id, "prepare")
        if recorded is not None:
            return StatusReport.model_validate(recorded)
        report = self.report()
        if not report.ready_to_commit:
            raise PrepareIncomplete(
                prepare_incomplete_detail(report),
                status=409,
                body=report.model_dump(mode="json", exclude_none=True),
            )
        self.fence.advance(
            checkpoint_id, "prepared", report.model_dump(mode="json", exclude_none=True)
        )
        self._fence_changed()
        return report

    def begin_commit(self, checkpoint_id: str) -> tuple[CommitAnswer | None, list[Execution]]:
        """The recorded answer of a repeated commit, or the records to write."""
        recorded = self.fence.recorded(checkpoint_id, "commit")
        if recorded is not None:
            return CommitAnswer.model_validate(recorded), []
        self.fence.check(checkpoint_id, "commit")
        return None, self.executions()

    def finish_commit(self, checkpoint_id: str, answer: CommitAnswer) -> CommitAnswer:
        """Record the commit, then compact: keys settled before the previous commit leave
        memory."""
        recorded = self.fence.recorded(checkpoint_id, "commit")
        if recorded is not None:
            return CommitAnswer.model_validate(recorded)
        self.fence.advance(checkpoint_id, "commit", answer.model_dump(mode="json"))
        self._fence_changed()
        self.compact(self._to_compact)
        self._to_compact, self._settling = self._settling, []
        return answer

    def resume(self, checkpoint_id: str) -> ResumeAnswer:
        """Reopen admission and spend the id. ``released``: parked executions let go (none)."""
        recorded = self.fence.recorded(checkpoint_id, "resume")
        if recorded is not None:
            return ResumeAnswer.model_validate(recorded)
        self.fence.advance(checkpoint_id, "resume", dict(RESUMED))
        self._spent(checkpoint_id)
        return ResumeAnswer.model_validate(RESUMED)

    def _spent(self, checkpoint_id: str) -> None:
        answer = json.dumps(self.fence.spent[checkpoint_id], separators=(",", ":")).encode()
        self._records += [SpentCheckpoint(checkpoint_id, answer), FenceRecord(self.fence.state())]

    # ------------------------------------------------------------ the lease

    def renew(self, checkpoint_id: str | None, deadline_ts: float | None, now: float) -> bool:
        """A control call for ``checkpoint_id``: move its lease. Whether the move is recorded
        (a small move is not written, so a restart may see the lease up to a second early)."""
        before = self.fence.lease_until
        if not self.fence.renew(checkpoint_id, deadline_ts, now):
            return False
        after = self.fence.lease_until
        if before is None or after is None or abs(after - before) >= _LEASE_WRITE_SLACK_S:
            self._fence_changed()
            return True
        return False

    def expire(self, now: float) -> Expired | None:
        """Abort the active checkpoint if its lease ran out (the id is spent)."""
        expired = self.fence.expire(now)
        if expired is not None:
            self._spent(expired.checkpoint_id)
        return expired


def encode_reply(
    key: ExecutionKey, generation: int, reply: Any, lineage: ModelLineage | None = None
) -> tuple[bytes, bytes]:
    """The exact reply bytes to send and keep, and the receipt's canonical bytes.

    The digest is taken from the reply as the caller will parse it (the bytes round-tripped), so
    the caller's digest of what it received always matches. Raises TypeError or ValueError for a
    reply that is not strict JSON.
    """
    raw = json.dumps(reply, separators=(",", ":"), allow_nan=False).encode("utf-8")
    receipt = CompletionReceipt.for_reply(key[0], key[1], generation, json.loads(raw), lineage)
    return raw, receipt.canonical()


@dataclass(frozen=True, slots=True)
class RunAnswer:
    reply: bytes
    replayed: bool
    receipt: bytes  # the receipt's canonical JSON


class Participant:
    """The async shell around :class:`ParticipantCore` for one server's event loop.

    ``agent`` is an async callable row -> reply (see :mod:`rl_gym_actors.gym.agents`); ``store``
    defaults to memory; ``clock`` gives Unix time for ``deadline_ts`` and the lease;
    ``lease_s`` (None: no lease) is how long past its deadline a checkpoint id holds admission
    without a call; ``checkpoint_root`` (None: anywhere) confines commit's ``checkpoint_dir``.
    """

    def __init__(
        self,
        agent: Agent,
        store: Store | None = None,
        *,
        clock: Callable[[], float] = time.time,
        lease_s: float | None = None,
        checkpoint_root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.agent = agent
        self.store: Store = store or MemoryStore()
        loaded = self.store.load()
        self.core = ParticipantCore(
            loaded.executions,
            loaded.spent,
            fence=loaded.fence,
            lease_s=lease_s,
            lookup=self.store.lookup,
        )
        self.recovered = loaded.recovered
        self.checkpoint_root = checkpoint_root
        self._clock = clock
        self._runs: dict[ExecutionKey, asyncio.Task] = {}
        self._changed = asyncio.Condition()
        self._commit_lock = asyncio.Lock()
        self._lease_timer: asyncio.TimerHandle | None = None
        self._closing = False
        fence = self.core.fence
        if fence.active is not None and lease_s is not None and fence.lease_until is None:
            self.core.renew(fence.active, None, clock())  # a lease from now on

    async def _durable(self) -> None:
        """Make what was decided durable before answering (a barrier on every earlier record)."""
        try:
            await self.store.wait(self.store.submit(self.core.take_records()))
        except StoreFailed as exc:
            cls = StoreUnavailable if exc.broken else StoreWriteFailed
            raise cls(str(exc), status=503) from exc

    def _admit(self) -> None:
        """Before a decision that writes: refuse at once when shutting down or the store is
        broken, and let an expired lease go first."""
        if self._closing:
            raise ServerUnavailable("the server is shutting down", status=503)
        if self.store.broken:
            raise StoreUnavailable("the store is failing its writes; try again later", status=503)
        self._expire()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------ the lease

    def _renew(self, checkpoint_id: str | None, deadline_ts: float | None) -> None:
        self.core.renew(checkpoint_id, deadline_ts, self._clock())
        self._arm_lease_timer()

    def _arm_lease_timer(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None
        until = self.core.fence.lease_until
        if until is None:
            return
        loop = asyncio.get_running_loop()
        self._lease_timer = loop.call_later(
            max(0.0, until - self._clock()) + 0.01, self._on_lease_timer
        )

    def _on_lease_timer(self) -> None:
        self._lease_timer = None
        if self._expire():
            asyncio.ensure_future(self._after_expiry())
        elif self.core.fence.lease_until is not None:
            self._arm_lease_timer()

    async def _after_expiry(self) -> None:
        try:
            await self._durable()
        except GymError as exc:
            logger.error("the lease expiry could not be written: %s", exc)
        await self._notify()

    def _expire(self) -> bool:
        expired = self.core.expire(self._clock())
        if expired is None:
            return False
        logger.warning(
            "checkpoint lease expired: checkpoint_id=%s phase=%s lease_until=%.3f; admission "
            "reopened and the id is spent",
            expired.checkpoint_id,
            expired.phase.value,
            expired.lease_until,
            extra={
                "event": "checkpoint_lease_expired",
                "checkpoint_id": expired.checkpoint_id,
                "phase": expired.phase.value,
                "lease_until": expired.lease_until,
            },
        )
        return True

    async def start(self) -> None:
        """In the serving loop, before the first request: arm the lease timer of a
        checkpoint that was active when the server last stopped."""
        self._arm_lease_timer()

    # ------------------------------------------------------------ data plane

    async def run(self, key: ExecutionKey, row: dict[str, Any]) -> RunAnswer:
        """``/run``: the stored reply of a completed key, else the agent's reply."""
        self._admit()
        decision = self.core.begin_run(key)
        if isinstance(decision, Replay):
            await self._durable()
            return RunAnswer(decision.reply, replayed=True, receipt=decision.receipt)
        task = asyncio.create_task(
            self._execute(key, decision.generation, row), name=f"gym-run-{key[0]}-{key[1]}"
        )
        self._runs[key] = task
        try:
            # shield: the caller going away (which cancels this handler) never cancels the run
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # retired before its first step: the run never began
                raise self._cancelled(key) from None
            raise

    def _cancelled(self, key: ExecutionKey) -> GymError:
        if self._closing:
            return ServerUnavailable("the server shut down during the run", status=503)
        return StaleAttempt(f"execution {_label(key)} was retired while it ran", status=409)

    async def _execute(self, key: ExecutionKey, generation: int, row: dict[str, Any]) -> RunAnswer:
        # The start record goes to the store with whatever is written next, and at the latest
        # START_WRITE_DELAY_S after the start: an agent that finishes sooner costs one write
        # (the store folds start and completion of one key into one row), a longer one has its
        # start durable, so a restart tombstones it. Nothing is answered before it is durable.
        flush = asyncio.get_running_loop().call_later(START_WRITE_DELAY_S, self._flush)
        try:
            try:
                reply = await self.agent(row)
                lineage = None
                if isinstance(reply, LineagedReply):
                    reply, lineage = reply.reply, reply.lineage
                raw, receipt = encode_reply(key, generation, reply, lineage)
            except Exception as exc:
                logger.info("agent failed for %s: %r", _label(key), exc, exc_info=True)
                self.core.fail_run(key, generation)
                await self._durable()
                raise AgentFailed(repr(exc), status=500) from exc
            finally:
                flush.cancel()
            self.core.finish_run(key, generation, raw, receipt)
            # a failed write answers 5xx; the records are written again with the next write,
            # and a replay of the key answers only once they are
            await self._durable()
            return RunAnswer(raw, replayed=False, receipt=receipt)
        except asyncio.CancelledError:
            # only retire and shutdown cancel this task: answer its caller with what happened,
            # so that the caller cannot mistake it for its own cancellation
            raise self._cancelled(key) from None
        finally:
            if self._runs.get(key) is asyncio.current_task():
                del self._runs[key]
            await self._notify()

    def _flush(self) -> None:
        """Hand what was decided to the store now, without waiting for it."""
        records = self.core.take_records()
        if records:
            self.store.submit(records)

    async def receipt(self, key: ExecutionKey) -> ReceiptAnswer:
        answer = self.core.receipt(key)
        await self._durable()
        return answer

    # ------------------------------------------------------------ control plane

    async def acknowledge(self, receipt: CompletionReceipt) -> AckAnswer:
        self._admit()
        answer = self.core.acknowledge(receipt)
        await self._durable()
        return answer

    async def acknowledge_batch(self, receipts: Sequence[CompletionReceipt]) -> AckBatchAnswer:
        self._admit()
        answer = self.core.acknowledge_batch(receipts)
        await self._durable()
        return answer

    async def status(self, checkpoint_id: str | None) -> StatusReport:
        self._expire()
        answer = self.core.status(checkpoint_id)
        self._renew(checkpoint_id, None)
        await self._durable()
        return answer

    async def retire(
        self, checkpoint_id: str, key: ExecutionKey, deadline_ts: float | None = None
    ) -> RetireAnswer:
        self._admit()
        answer, cancel = self.core.retire(checkpoint_id, key)
        self._renew(checkpoint_id, deadline_ts)
        task = self._runs.pop(key, None) if cancel else None
        if task is not None:
            task.cancel()
        await self._durable()
        await self._notify()
        return answer

    async def prepare(self, checkpoint_id: str, deadline_ts: float) -> StatusReport:
        """Close admission; wait until nothing runs or ``deadline_ts``; ready or 409."""
        self._admit()
        recorded = self.core.begin_prepare(checkpoint_id)
        self._renew(checkpoint_id, deadline_ts)
        if recorded is not None:
            return recorded
        fence = self.core.fence

        def done() -> bool:  # runs ended, or this checkpoint is no longer the active one
            return self.core.settled or fence.active != checkpoint_id or self._closing

        left = deadline_ts - self._clock()
        if left > 0:
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(done), timeout=left)
            except TimeoutError:
                pass
        if self._closing:
            raise ServerUnavailable("the server is shutting down", status=503)
        self._expire()
        try:
            report = self.core.finish_prepare(checkpoint_id)
        finally:
            await self._durable()
        return report

    async def commit(
        self, checkpoint_id: str, checkpoint_dir: str, deadline_ts: float | None = None
    ) -> CommitAnswer:
        """Write the records, then ``manifest.json`` last, into ``checkpoint_dir``."""
        try:
            directory = confine(self.checkpoint_root, checkpoint_dir)
        except ValueError as exc:
            raise InvalidRequest(f"checkpoint_dir: {exc}", status=422) from exc
        async with self._commit_lock:  # one writer of checkpoint files at a time
            self._admit()
            recorded, executions = self.core.begin_commit(checkpoint_id)
            self._renew(checkpoint_id, deadline_ts)
            if recorded is not None:
                return recorded
            await self._durable()
            try:
                written = await asyncio.to_thread(
                    write_checkpoint, directory, checkpoint_id, executions
                )
            except OSError as exc:
                raise GymRejected(
                    f"cannot write {checkpoint_dir!r}: {exc}", status=409, code="commit_failed"
                ) from exc
            answer = self.core.finish_commit(checkpoint_id, CommitAnswer.model_validate(written))
            self._renew(checkpoint_id, deadline_ts)
            await self._durable()
            return answer

    async def resume(self, checkpoint_id: str) -> ResumeAnswer:
        self._admit()
        answer = self.core.resume(checkpoint_id)
        self._arm_lease_timer()
        await self._durable()
        await self._notify()  # a prepare still waiting for this id ends now
        return answer

    def capabilities(self) -> dict[str, Any]:
        """The fence's side of the capabilities answer."""
        self._expire()
        fence = self.core.fence
        return {
            "phase": fence.phase.value,
            "active_checkpoint_id": fence.active,
            "deadline_ts": fence.lease_until,
        }

    @property
    def ready(self) -> bool:
        """Whether the server can take requests that write (its store works)."""
        return not self._closing and self.store.healthy

    # ------------------------------------------------------------ lifecycle

    def snapshot(self) -> dict[str, Any]:
        """Counts for tests, the CLI and metrics (a copy; safe to read from another thread)."""
        c = self.core
        return {
            "running": c.count(S.RUNNING),
            "parked": c.count(S.PARKED),
            "completed_unacknowledged": c.count(S.COMPLETED),
            "acknowledged": c.count(S.ACKNOWLEDGED),
            "tombstoned": c.count(S.TOMBSTONED),
            "agent_starts": c.agent_starts,
            "phase": c.fence.phase.value,
            "recovered": self.recovered,
        }

    async def stop_runs(self) -> None:
        """Cancel every agent call; their callers get 503. Their keys stay running in the store,
        so a restart on the same state dir tombstones them."""
        self._closing = True
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        await self._notify()  # waiting prepares end now
        tasks = list(self._runs.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        await self.stop_runs()
        close = getattr(self.agent, "aclose", None)
        if close is not None:
            await close()
        await asyncio.to_thread(self.store.close)
