"""Every decision of an agent-checkpoint participant, synchronously: no clock, no I/O, no asyncio.

Per key (rollout_id, attempt_index) an :class:`~rl_gym_actors.gym.store.Execution` whose state
moves only as :mod:`rl_gym_actors.gym.agent_checkpoint.machine`'s table says, and one
:class:`~rl_gym_actors.gym.fence.CheckpointFence` for the checkpoint phases.

A key starts at most once (every state after ``running`` refuses a new start), so its
``execution_generation`` is 1. The records of settled keys (ACKed or tombstoned) leave memory for
the compact :class:`~rl_gym_actors.gym.agent_checkpoint.settled.SettledKeys` at the second
committed checkpoint after they settled (so a key stays fully answerable for at least one
checkpoint interval), and at once when loaded from a store; their full records stay in a durable
store, which answers for them when asked.

Each call validates, makes its transition at once, queues the records the transition needs made
durable (:meth:`ParticipantCore.take_records`), and answers with the wire models of
:mod:`rl_gym_actors.protocol`. Rejections are the typed errors of :mod:`rl_gym_actors.errors`
with the HTTP status to answer. The async shell is
:class:`~rl_gym_actors.gym.agent_checkpoint.participant.Participant`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rl_gym_actors.errors import AckRejected, AdmissionClosed, GymRejected
from rl_gym_actors.gym.agent_checkpoint.machine import Event, State, next_state
from rl_gym_actors.gym.agent_checkpoint.settled import SETTLED, SettledKeys
from rl_gym_actors.gym.fence import RESUMED, CheckpointFence, Expired, FenceState
from rl_gym_actors.gym.store import Execution, FenceRecord, Record, SpentCheckpoint
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
    RestoreAnswer,
    ResumeAnswer,
    RetireAnswer,
    StatusReport,
    prepare_incomplete_detail,
)

S = ExecutionState
_ACTIVE = (S.RUNNING, S.PARKED, S.COMPLETED)  # not yet released; listed by status
_LEASE_WRITE_SLACK_S = 1.0  # a renewed lease is written when it moved at least this much

# retire's answer by the key's state before it (the table says where the key goes)
_RETIRE_ANSWERS: dict[State, RetireAnswer] = {
    None: RetireAnswer(retired=False, tombstoned=True),
    S.RUNNING: RetireAnswer(retired=True, tombstoned=True),
    S.PARKED: RetireAnswer(retired=True, tombstoned=True),
    S.COMPLETED: RetireAnswer(retired=False, tombstoned=False, completed_unacknowledged=True),
    S.TOMBSTONED: RetireAnswer(retired=False, tombstoned=True),
    S.ACKNOWLEDGED: RetireAnswer(retired=False, tombstoned=False, acknowledged=True),
}


class PrepareIncomplete(GymRejected):
    """409 ``agent_prepare_incomplete``: prepare is not ready. ``body`` is the status's counts,
    ``active`` the records it lists (the route writes them out)."""

    code = "agent_prepare_incomplete"
    active: Sequence[Execution] = ()


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
        # states entered by this process's decisions (restored records do not count): counters
        # that never go back and never count what a previous process did
        self.entered: Counter[ExecutionState] = Counter()
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
            if old is None or old.state is not e.state:
                self.entered[e.state] += 1

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
        before = self.state_of(key)
        after = next_state(key, before, Event.RUN)
        if before is S.COMPLETED:  # a replay: completed keys are always in memory
            e = self._all[key]
            return Replay(e.reply or b"", e.receipt or b"")
        if not self.fence.admission_open:
            raise AdmissionClosed(
                f"admission is closed: checkpoint {self.fence.active!r} is "
                f"{self.fence.phase.value}; wait for its resume",
                status=409,
            )
        self._put(Execution(key[0], key[1], after, generation=1))
        self.agent_starts += 1
        return Start(generation=1)

    def is_running(self, key: ExecutionKey, generation: int) -> bool:
        e = self._all.get(key)
        return e is not None and e.state is S.RUNNING and e.generation == generation

    def _ended(self, key: ExecutionKey, generation: int, event: Event) -> ExecutionState:
        """The state an ending agent call (``FINISH`` or ``FAIL``) leaves; a call of another
        generation than the running one ended a run that was retired meanwhile."""
        e = self._all.get(key)
        state = self.state_of(key)
        if state is S.RUNNING and e is not None and e.generation != generation:
            state = S.TOMBSTONED
        return next_state(key, state, event)

    def finish_run(self, key: ExecutionKey, generation: int, reply: bytes, receipt: bytes) -> None:
        """The agent returned: keep the reply. Raises ``StaleAttempt`` if retired meanwhile."""
        after = self._ended(key, generation, Event.FINISH)
        self._put(replace(self._all[key], state=after, reply=reply, receipt=receipt))

    def fail_run(self, key: ExecutionKey, generation: int) -> None:
        """The agent raised: tombstone the key (unless retire already did)."""
        after = self._ended(key, generation, Event.FAIL)
        if self.is_running(key, generation):
            self._put(replace(self._all[key], state=after))

    def receipt(self, key: ExecutionKey) -> ReceiptAnswer:
        """The (ext) receipt answer: the same for as long as the key is kept."""
        next_state(key, self.state_of(key), Event.RECEIPT)
        e = self._record(key)
        assert e is not None  # the table refuses a key never seen
        # an ACKed key compacted without a durable store has no receipt any more
        return ReceiptAnswer(state=e.state.value, completion_receipt=_receipt(e.receipt))

    # ------------------------------------------------------------ ACK and retire

    def _ackable(self, receipt: CompletionReceipt) -> Execution:
        key = receipt.key
        next_state(key, self.state_of(key), Event.ACK)
        e = self._record(key)
        assert e is not None  # the table refuses a key never seen
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
        after = next_state(e.key, e.state, Event.ACK)
        if after is e.state:
            return AckAnswer(acknowledged=False, idempotent=True)
        self._put(replace(e, state=after, reply=None))
        return AckAnswer(acknowledged=True, idempotent=False)

    def acknowledge_batch(self, receipts: Sequence[CompletionReceipt]) -> AckBatchAnswer:
        """All or nothing: every receipt is checked before any key is released."""
        checked = [self._ackable(r) for r in receipts]
        for e in checked:
            after = next_state(e.key, e.state, Event.ACK)
            if after is not e.state:
                self._put(replace(e, state=after, reply=None))
        return AckBatchAnswer(acknowledged=list(receipts))

    def acknowledge_exact(
        self, keys: Sequence[ExecutionKey], match: Callable[[list[bytes]], bool]
    ) -> list[bytes] | None:
        """Batch ACK's fast path: every key completed, and ``match`` true of their stored
        receipts (in order): ACKed, those returned; else None, nothing changed."""
        found = [e for e in map(self._all.get, keys) if e is not None and e.state is S.COMPLETED]
        stored = [e.receipt for e in found if e.receipt is not None]
        if not stored or len(stored) != len(keys) or not match(stored):
            return None
        ack = next_state(found[0].key, S.COMPLETED, Event.ACK)  # the checked path's transition
        for e in found:
            self._put(Execution(e.rollout_id, e.attempt_index, ack, e.generation, None, e.receipt))
        return stored

    def retire(self, checkpoint_id: str | None, key: ExecutionKey) -> tuple[RetireAnswer, bool]:
        """The retire answer, and whether a running agent call must be cancelled."""
        if checkpoint_id is None:
            self.fence.check_lenient(checkpoint_id)
        else:
            self.fence.check_retire(checkpoint_id)
        before = self.state_of(key)
        after = next_state(key, before, Event.RETIRE)
        if before is None:
            self._put(Execution(key[0], key[1], after, generation=0))
        elif after is not before:
            self._put(replace(self._all[key], state=after))
        return _RETIRE_ANSWERS[before], before in (S.RUNNING, S.PARKED)

    # ------------------------------------------------------------ status and checkpoints

    def is_active(self, key: ExecutionKey) -> bool:
        """Whether a status lists ``key`` (running, parked or completed, not yet released)."""
        return key in self._active

    def active_count(self) -> int:
        return len(self._active)

    def active(self) -> list[Execution]:
        """The records a status lists, by key: a snapshot (a transition replaces a record)."""
        return sorted(self._active.values(), key=lambda e: e.key)

    def report(self, *, listed: bool = True) -> StatusReport:
        """The status object (plus (ext) phase, checkpoint_id, lease); ``listed=False``: counts."""
        c = self._counts
        # nothing here parks at a boundary, so every parked execution counts as without one
        parked_without = c[S.PARKED]
        active = [
            AttemptInfo(
                rollout_id=e.rollout_id,
                attempt_index=e.attempt_index,
                state=e.state.value,
                generation=e.generation,
                completion_receipt=_receipt(e.receipt),
            )
            for e in (self.active() if listed else ())
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
            active=len(self._active),
            blocking_attempts=active,
            completed_unacknowledged_attempts=completed,
            executions=active,
            phase=fence.phase.value,
            checkpoint_id=fence.active,
            checkpoint_lease=lease,
        )

    def status(self, checkpoint_id: str | None, *, listed: bool = True) -> StatusReport:
        self.fence.check_lenient(checkpoint_id)
        return self.report(listed=listed)

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
        report = self.report(listed=False)
        if not report.ready_to_commit:
            refused = PrepareIncomplete(
                prepare_incomplete_detail(report),
                status=409,
                body=report.model_dump(mode="json", exclude_none=True),
            )
            refused.active = self.active()
            raise refused
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

    def begin_restore(self, checkpoint_id: str) -> RestoreAnswer | None:
        """The recorded answer of a repeated restore, or None: then read the files and call
        :meth:`finish_restore` (a restore is taken only while idle)."""
        recorded = self.fence.recorded(checkpoint_id, "restore")
        if recorded is not None:
            return RestoreAnswer.model_validate(recorded)
        self.fence.check(checkpoint_id, "restore")
        return None

    def finish_restore(self, checkpoint_id: str, answer: RestoreAnswer) -> RestoreAnswer:
        """Close admission until resume (``restored_paused``) and record the answer. The
        executions themselves are this server's store's: nothing is loaded back."""
        recorded = self.fence.recorded(checkpoint_id, "restore")
        if recorded is not None:
            return RestoreAnswer.model_validate(recorded)
        self.fence.advance(checkpoint_id, "restore", answer.model_dump(mode="json"))
        self._fence_changed()
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
