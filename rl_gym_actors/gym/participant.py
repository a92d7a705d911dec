"""The server-side state of Gym executions, apart from HTTP.

Per key (rollout_id, attempt_index) an :class:`~rl_gym_actors.gym.store.Execution` in one of the
states of :class:`~rl_gym_actors.protocol.ExecutionState`:

    (unknown) --run--> running --agent returns--> completed --ACK--> acknowledged
                          |  \\--agent raises / retire / restart--> tombstoned
    (unknown) --retire--> tombstoned

A key starts at most once (every state after ``running`` refuses a new start), so its
``execution_generation`` is 1. Parked states exist in the model and the counts, but nothing
parks in this server.

Decide, then do: :class:`ParticipantCore` is synchronous and pure (no clock, no I/O, no asyncio).
Each call validates, makes its transition at once, and queues the records the transition needs
made durable (:meth:`ParticipantCore.take_records`). :class:`Participant` is the thin async shell:
it runs each agent call as its own task (a caller that disconnects never cancels it), waits in
prepare, cancels a run on retire, writes checkpoint files, and awaits the store before every
answer, so nothing is answered before it is durable. Rejections are the typed errors of
:mod:`rl_gym_actors.errors` with the HTTP status to answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rl_gym_actors.errors import (AckRejected, AdmissionClosed, AgentFailed, DuplicateExecution,
                                  GymError, GymRejected, NotCompleted, StaleAttempt,
                                  UnknownExecution)
from rl_gym_actors.gym.fence import CheckpointFence
from rl_gym_actors.gym.store import (Execution, MemoryStore, Record, SpentCheckpoint, Store,
                                     StoreFailed, write_checkpoint)
from rl_gym_actors.protocol import (CompletionReceipt, ExecutionKey, ExecutionState, StatusReport,
                                    canonical_json, prepare_incomplete_detail)

logger = logging.getLogger(__name__)

Agent = Callable[[dict[str, Any]], Awaitable[Any]]

S = ExecutionState
_ACTIVE = (S.RUNNING, S.PARKED, S.COMPLETED)       # not yet released; listed by status


class PrepareIncomplete(GymRejected):
    """409 ``agent_prepare_incomplete``: prepare is not ready. ``body`` is the full status."""

    code = "agent_prepare_incomplete"


class ServerUnavailable(GymError):
    """503: the server is shutting down or its store failed; nothing was answered."""

    code = "unavailable"


@dataclass(frozen=True, slots=True)
class Replay:
    """``/run`` of a completed key: the stored reply bytes; the agent does not run."""

    reply: bytes


@dataclass(frozen=True, slots=True)
class Start:
    """``/run`` of a new key: run the agent as this generation."""

    generation: int


def _label(key: ExecutionKey) -> str:
    return f"({key[0]!r}, {key[1]})"


class ParticipantCore:
    """Every decision of the participant, synchronously. Not thread-safe: one owner (one loop)."""

    def __init__(self, executions: Iterable[Execution] = (),
                 spent: dict[str, bytes] | None = None) -> None:
        self._all: dict[ExecutionKey, Execution] = {}
        self._active: dict[ExecutionKey, Execution] = {}
        self._counts: Counter[ExecutionState] = Counter()
        self._records: list[Record] = []
        self.fence = CheckpointFence(spent)
        self.agent_starts = 0
        for e in executions:
            self._put(e, durable=False)

    # ------------------------------------------------------------ bookkeeping

    def _put(self, e: Execution, *, durable: bool = True) -> None:
        old = self._all.get(e.key)
        if old is not None:
            self._counts[old.state] -= 1
        self._counts[e.state] += 1
        self._all[e.key] = e
        if e.state in _ACTIVE:
            self._active[e.key] = e
        else:
            self._active.pop(e.key, None)
        if durable:
            self._records.append(e)

    def take_records(self) -> list[Record]:
        """The records the decisions since the last call need made durable, in order."""
        records, self._records = self._records, []
        return records

    def get(self, key: ExecutionKey) -> Execution | None:
        return self._all.get(key)

    def executions(self) -> list[Execution]:
        return list(self._all.values())

    def count(self, state: ExecutionState) -> int:
        return self._counts[state]

    @property
    def settled(self) -> bool:
        """Nothing runs and nothing is parked without a boundary: prepare stops waiting."""
        return self._counts[S.RUNNING] == 0 and self._counts[S.PARKED] == 0

    # ------------------------------------------------------------ data plane

    def begin_run(self, key: ExecutionKey) -> Replay | Start:
        """Decide a ``/run``, in PROTOCOL.md's order."""
        e = self._all.get(key)
        if e is not None:
            if e.state in (S.ACKNOWLEDGED, S.TOMBSTONED):
                raise StaleAttempt(f"execution {_label(key)} is {e.state.value}", status=409)
            if e.state is S.COMPLETED:
                return Replay(e.reply or b"")
            raise DuplicateExecution(f"execution {_label(key)} is {e.state.value}", status=409)
        if not self.fence.admission_open:
            raise AdmissionClosed(f"admission is closed: checkpoint {self.fence.active!r} is "
                                  f"{self.fence.phase.value}; wait for its resume", status=409)
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

    def receipt(self, key: ExecutionKey) -> bytes:
        """The (ext) receipt answer, as bytes: byte-identical for as long as the key is kept."""
        e = self._all.get(key)
        if e is None:
            raise UnknownExecution(f"execution {_label(key)} was never seen", status=404)
        if e.state in (S.RUNNING, S.PARKED):
            raise NotCompleted(f"execution {_label(key)} is {e.state.value}", status=409)
        if e.state is S.TOMBSTONED:
            raise StaleAttempt(f"execution {_label(key)} is tombstoned", status=409)
        return (b'{"state":"' + e.state.value.encode() + b'","completion_receipt":'
                + (e.receipt or b"null") + b"}")

    # ------------------------------------------------------------ ACK and retire

    def _ackable(self, receipt: CompletionReceipt) -> Execution:
        key = receipt.key
        e = self._all.get(key)
        if e is None:
            raise AckRejected(f"execution {_label(key)} is unknown", status=409)
        if e.state not in (S.COMPLETED, S.ACKNOWLEDGED):
            raise AckRejected(f"execution {_label(key)} is {e.state.value}, not completed",
                              status=409)
        stored = json.loads(e.receipt or b"{}")
        given = receipt.model_dump(mode="json")
        differ = sorted(k for k in set(stored) | set(given) if stored.get(k) != given.get(k))
        if differ:
            raise AckRejected(f"receipt of {_label(key)} differs from the stored one in "
                              f"{', '.join(differ)}", status=409)
        return e

    def acknowledge(self, receipt: CompletionReceipt) -> dict[str, bool]:
        e = self._ackable(receipt)
        if e.state is S.ACKNOWLEDGED:
            return {"acknowledged": False, "idempotent": True}
        self._put(replace(e, state=S.ACKNOWLEDGED, reply=None))
        return {"acknowledged": True, "idempotent": False}

    def acknowledge_batch(self, receipts: Sequence[CompletionReceipt]) -> dict[str, Any]:
        """All or nothing: every receipt is checked before any key is released."""
        checked = [self._ackable(r) for r in receipts]
        for e in checked:
            if e.state is S.COMPLETED:
                self._put(replace(e, state=S.ACKNOWLEDGED, reply=None))
        return {"acknowledged": [r.model_dump(mode="json") for r in receipts]}

    def retire(self, checkpoint_id: str | None, key: ExecutionKey) -> tuple[dict[str, bool], bool]:
        """The retire answer, and whether a running agent call must be cancelled."""
        self.fence.check_lenient(checkpoint_id)
        e = self._all.get(key)
        no = {"retired": False, "tombstoned": False, "completed_unacknowledged": False}
        if e is None:
            self._put(Execution(key[0], key[1], S.TOMBSTONED, generation=0))
            return {**no, "tombstoned": True}, False
        if e.state in (S.RUNNING, S.PARKED):
            self._put(replace(e, state=S.TOMBSTONED))
            return {**no, "retired": True, "tombstoned": True}, True
        if e.state is S.COMPLETED:
            return {**no, "completed_unacknowledged": True}, False     # only an ACK releases it
        if e.state is S.TOMBSTONED:
            return {**no, "tombstoned": True}, False
        return {**no, "acknowledged": True}, False                       # (ext) already released

    # ------------------------------------------------------------ status and checkpoints

    def _info(self, e: Execution) -> dict[str, Any]:
        return {"rollout_id": e.rollout_id, "attempt_index": e.attempt_index,
                "state": e.state.value, "execution_generation": e.generation,
                "completion_receipt": json.loads(e.receipt) if e.receipt else None}

    def report(self) -> dict[str, Any]:
        """The status object of PROTOCOL.md (plus (ext) ``phase`` and ``checkpoint_id``)."""
        c = self._counts
        # nothing here parks at a boundary, so every parked execution counts as without one
        parked_without = c[S.PARKED]
        active = [self._info(e) for e in sorted(self._active.values(), key=lambda e: e.key)]
        completed = [a for a in active if a["state"] == S.COMPLETED.value]
        return {
            "state": "accepting" if self.fence.admission_open else "preparing",
            "ready_to_commit": c[S.RUNNING] == 0 and parked_without == 0 and c[S.COMPLETED] == 0,
            "running": c[S.RUNNING], "parked": c[S.PARKED], "parked_with_boundary": 0,
            "parked_without_boundary": parked_without,
            "completed_unacknowledged": c[S.COMPLETED],
            "acknowledged_completed": c[S.ACKNOWLEDGED],
            "active": len(active), "blocking_attempts": active,
            "completed_unacknowledged_attempts": completed, "executions": active,
            "phase": self.fence.phase.value, "checkpoint_id": self.fence.active,
        }

    def status(self, checkpoint_id: str | None) -> dict[str, Any]:
        self.fence.check_lenient(checkpoint_id)
        return self.report()

    def begin_prepare(self, checkpoint_id: str) -> dict[str, Any] | None:
        """Close admission. The recorded answer of a repeated ready prepare, else None: then
        wait until :attr:`settled` (or the deadline) and call :meth:`finish_prepare`."""
        recorded = self.fence.recorded(checkpoint_id, "prepare")
        if recorded is None:
            self.fence.advance(checkpoint_id, "prepare")
        return recorded

    def finish_prepare(self, checkpoint_id: str) -> dict[str, Any]:
        """Ready: the status (recorded for repeats). Not ready: raises ``PrepareIncomplete``."""
        recorded = self.fence.recorded(checkpoint_id, "prepare")
        if recorded is not None:
            return recorded
        report = self.report()
        if not report["ready_to_commit"]:
            raise PrepareIncomplete(_incomplete_detail(report), status=409, body=report)
        self.fence.advance(checkpoint_id, "prepared", report)
        return report

    def begin_commit(self, checkpoint_id: str) -> tuple[dict[str, Any] | None, list[Execution]]:
        """The recorded answer of a repeated commit, or the records to write."""
        recorded = self.fence.recorded(checkpoint_id, "commit")
        if recorded is not None:
            return recorded, []
        self.fence.check(checkpoint_id, "commit")
        return None, self.executions()

    def finish_commit(self, checkpoint_id: str, answer: dict[str, Any]) -> dict[str, Any]:
        recorded = self.fence.recorded(checkpoint_id, "commit")
        if recorded is not None:
            return recorded
        self.fence.advance(checkpoint_id, "commit", answer)
        return answer

    def resume(self, checkpoint_id: str) -> dict[str, Any]:
        """Reopen admission and spend the id. ``released``: parked executions let go (none)."""
        recorded = self.fence.recorded(checkpoint_id, "resume")
        if recorded is not None:
            return recorded
        answer = {"state": "accepting", "released": 0}
        self.fence.advance(checkpoint_id, "resume", answer)
        self._records.append(SpentCheckpoint(checkpoint_id, self.fence.spent[checkpoint_id]))
        return answer


def _incomplete_detail(report: dict[str, Any]) -> str:
    return prepare_incomplete_detail(StatusReport.model_validate(report))


def encode_reply(key: ExecutionKey, generation: int, reply: Any) -> tuple[bytes, bytes]:
    """The exact reply bytes to send and keep, and the receipt's canonical bytes.

    The digest is taken from the reply as the caller will parse it (the bytes round-tripped), so
    the caller's digest of what it received always matches. Raises TypeError or ValueError for a
    reply that is not strict JSON.
    """
    raw = json.dumps(reply, separators=(",", ":"), allow_nan=False).encode("utf-8")
    receipt = CompletionReceipt.for_reply(key[0], key[1], generation, json.loads(raw))
    return raw, canonical_json(receipt.model_dump(mode="json"))


@dataclass(frozen=True, slots=True)
class RunAnswer:
    reply: bytes
    replayed: bool


class Participant:
    """The async shell around :class:`ParticipantCore` for one server's event loop.

    ``agent`` is an async callable row -> reply (see :mod:`rl_gym_actors.gym.agents`); ``store``
    defaults to memory; ``clock`` gives Unix time for ``deadline_ts``.
    """

    def __init__(self, agent: Agent, store: Store | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.store: Store = store or MemoryStore()
        loaded = self.store.load()
        self.core = ParticipantCore(loaded.executions, loaded.spent)
        self.recovered = loaded.recovered
        self._clock = clock
        self._runs: dict[ExecutionKey, asyncio.Task] = {}
        self._changed = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._closing = False

    async def _durable(self) -> None:
        """Make what was decided durable before answering (a barrier on every earlier record)."""
        try:
            await self.store.wait(self.store.submit(self.core.take_records()))
        except StoreFailed as exc:
            raise ServerUnavailable(str(exc), status=503) from exc

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------ data plane

    async def run(self, key: ExecutionKey, row: dict[str, Any]) -> RunAnswer:
        """``/run``: the stored reply of a completed key, else the agent's reply."""
        if self._closing:
            raise ServerUnavailable("the server is shutting down", status=503)
        decision = self.core.begin_run(key)
        if isinstance(decision, Replay):
            await self._durable()
            return RunAnswer(decision.reply, replayed=True)
        task = asyncio.create_task(self._execute(key, decision.generation, row),
                                   name=f"gym-run-{key[0]}-{key[1]}")
        self._runs[key] = task
        try:
            # shield: the caller going away (which cancels this handler) never cancels the run
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():         # retired before its first step: the run never began
                raise self._cancelled(key) from None
            raise

    def _cancelled(self, key: ExecutionKey) -> GymError:
        if self._closing:
            return ServerUnavailable("the server shut down during the run", status=503)
        return StaleAttempt(f"execution {_label(key)} was retired while it ran", status=409)

    async def _execute(self, key: ExecutionKey, generation: int, row: dict[str, Any]) -> RunAnswer:
        try:
            await self._durable()        # a started key is tombstoned after a crash: record it
            try:
                reply = await self.agent(row)
                raw, receipt = encode_reply(key, generation, reply)
            except Exception as exc:
                logger.info("agent failed for %s: %s", _label(key), exc, exc_info=True)
                self.core.fail_run(key, generation)
                await self._durable()
                raise AgentFailed(f"{type(exc).__name__}: {exc}", status=500) from exc
            self.core.finish_run(key, generation, raw, receipt)
            await self._durable()
            return RunAnswer(raw, replayed=False)
        except asyncio.CancelledError:
            # only retire and shutdown cancel this task: answer its caller with what happened,
            # so that the caller cannot mistake it for its own cancellation
            raise self._cancelled(key) from None
        finally:
            if self._runs.get(key) is asyncio.current_task():
                del self._runs[key]
            self._notify()

    def receipt(self, key: ExecutionKey) -> Awaitable[bytes]:
        return self._answer(self.core.receipt, key)

    async def _answer(self, decide: Callable[..., Any], *args: Any) -> Any:
        answer = decide(*args)
        await self._durable()
        return answer

    # ------------------------------------------------------------ control plane

    def acknowledge(self, receipt: CompletionReceipt) -> Awaitable[dict[str, bool]]:
        return self._answer(self.core.acknowledge, receipt)

    def acknowledge_batch(self, receipts: Sequence[CompletionReceipt]) -> Awaitable[dict]:
        return self._answer(self.core.acknowledge_batch, receipts)

    def status(self, checkpoint_id: str | None) -> Awaitable[dict[str, Any]]:
        return self._answer(self.core.status, checkpoint_id)

    async def retire(self, checkpoint_id: str, key: ExecutionKey) -> dict[str, bool]:
        answer, cancel = self.core.retire(checkpoint_id, key)
        task = self._runs.pop(key, None) if cancel else None
        if task is not None:
            task.cancel()
        await self._durable()
        self._notify()
        return answer

    async def prepare(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Any]:
        """Close admission; wait until nothing runs or ``deadline_ts``; ready or 409."""
        recorded = self.core.begin_prepare(checkpoint_id)
        if recorded is not None:
            return recorded
        fence = self.core.fence
        # wait while runs go on and this checkpoint is still the active one (a resume ends it)
        while not self.core.settled and fence.active == checkpoint_id and not self._closing:
            left = deadline_ts - self._clock()
            if left <= 0:
                break
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout=left)
            except TimeoutError:
                break
        if self._closing:
            raise ServerUnavailable("the server is shutting down", status=503)
        report = self.core.finish_prepare(checkpoint_id)
        await self._durable()
        return report

    async def commit(self, checkpoint_id: str, checkpoint_dir: str) -> dict[str, Any]:
        """Write the records, then ``manifest.json`` last, into ``checkpoint_dir``."""
        async with self._commit_lock:        # one writer of checkpoint files at a time
            recorded, executions = self.core.begin_commit(checkpoint_id)
            if recorded is not None:
                return recorded
            await self._durable()
            try:
                answer = await asyncio.to_thread(write_checkpoint, checkpoint_dir,
                                                 checkpoint_id, executions)
            except OSError as exc:
                raise GymRejected(f"cannot write {checkpoint_dir!r}: {exc}", status=409,
                                  code="commit_failed") from exc
            return self.core.finish_commit(checkpoint_id, answer)

    async def resume(self, checkpoint_id: str) -> dict[str, Any]:
        answer = self.core.resume(checkpoint_id)
        await self._durable()
        self._notify()                   # a prepare still waiting for this id ends now
        return answer

    def capabilities(self) -> dict[str, Any]:
        return {"phase": self.core.fence.phase.value, "durable": self.store.durable,
                "checkpoint_id": self.core.fence.active}

    # ------------------------------------------------------------ lifecycle

    def snapshot(self) -> dict[str, Any]:
        """Counts for tests, the CLI and metrics (a copy; safe to read from another thread)."""
        c = self.core
        return {"running": c.count(S.RUNNING), "parked": c.count(S.PARKED),
                "completed_unacknowledged": c.count(S.COMPLETED),
                "acknowledged": c.count(S.ACKNOWLEDGED), "tombstoned": c.count(S.TOMBSTONED),
                "agent_starts": c.agent_starts, "phase": c.fence.phase.value,
                "recovered": self.recovered}

    async def stop_runs(self) -> None:
        """Cancel every agent call; their callers get 503. Their keys stay running in the store,
        so a restart on the same state dir tombstones them."""
        self._closing = True
        self._notify()                   # waiting prepares end now
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
