"""The async shell of an agent-checkpoint participant, for one server's event loop.

:class:`Participant` performs what :class:`~rl_gym_actors.gym.agent_checkpoint.core.ParticipantCore`
decides: it runs each agent call as its own task (a caller that disconnects never cancels it),
waits in prepare, cancels a run on retire, writes checkpoint files, keeps the checkpoint lease
(:mod:`.lease`), and awaits the store before every answer, so nothing is answered before it is
durable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rl_gym_actors.errors import (
    GymError,
    GymRejected,
    InvalidRequest,
    StaleAttempt,
)
from rl_gym_actors.gym.agent_checkpoint.bulk import (
    ACK_ENDS,
    ack_body,
    acked_body,
    canonical_pairs,
)
from rl_gym_actors.gym.agent_checkpoint.core import ParticipantCore, Replay, encode_reply
from rl_gym_actors.gym.agent_checkpoint.lease import LeaseTimer
from rl_gym_actors.gym.agent_failure import agent_failure
from rl_gym_actors.gym.agents import LineagedReply
from rl_gym_actors.gym.checkpoint_files import (
    CheckpointUnreadable,
    confine,
    read_checkpoint,
    write_checkpoint,
)
from rl_gym_actors.gym.store import Execution, MemoryStore, Store, StoreFailed
from rl_gym_actors.protocol import (
    AckAnswer,
    AckBatchAnswer,
    CommitAnswer,
    CompletionReceipt,
    ExecutionKey,
    ExecutionState,
    ReceiptAnswer,
    RestoreAnswer,
    ResumeAnswer,
    RetireAnswer,
    StatusReport,
)

logger = logging.getLogger(__name__)

Agent = Callable[[dict[str, Any]], Awaitable[Any]]

S = ExecutionState
START_WRITE_DELAY_S = 0.002  # a run's start record waits this long to share a write
_SINCE_SLACK = 1024  # start times of keys no status lists, at most, beyond as many as it lists


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


def _label(key: ExecutionKey) -> str:
    return f"({key[0]!r}, {key[1]})"


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
        name: str | None = None,
    ) -> None:
        self.agent = agent
        # the agent server's name: capabilities' ``name`` (the participant NeMo RL resolves a
        # row's agent to) and the instance whose files a commit writes (None: unnamed)
        self.name = name
        self._born = time.monotonic()
        # when this process began each run, for status's age_seconds: kept for the keys a status
        # lists (running, parked, completed), pruned as runs begin (:meth:`_began`)
        self._since: dict[ExecutionKey, float] = {}
        self.store: Store = store or MemoryStore()
        # (ext) this process's id, and the store's epoch (its state dir's; in memory: the id)
        self.instance_id = uuid.uuid4().hex
        self.store_epoch = str(getattr(self.store, "epoch", None) or self.instance_id)
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
        self._lease = LeaseTimer(self.core, clock, self._after_expiry)
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

    async def _durable_read(self) -> None:
        """A read-only route's barrier: durable like a write while the store works; while its
        writes fail, the answer is given from memory all the same (what the request itself
        decided, such as a lease move, is queued and written again with the next write that
        succeeds). A checkpoint's writes still fail, so nothing is committed on it."""
        if self.store.broken:
            self.store.submit(self.core.take_records())
            return
        try:
            await self.store.wait(self.store.submit(self.core.take_records()))
        except StoreFailed as exc:
            logger.debug("a read answered while the store fails: %s", exc)

    def _admit(self) -> None:
        """Before a decision that writes: refuse at once when shutting down or the store is
        broken, and let an expired lease go first."""
        if self._closing:
            raise ServerUnavailable("the server is shutting down", status=503)
        if self.store.broken:
            raise StoreUnavailable("the store is failing its writes; try again later", status=503)
        self._lease.expire()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------ the lease

    async def _after_expiry(self) -> None:
        try:
            await self._durable()
        except GymError as exc:
            logger.error("the lease expiry could not be written: %s", exc)
        await self._notify()

    async def start(self) -> None:
        """In the serving loop, before the first request: arm the lease timer of a
        checkpoint that was active when the server last stopped."""
        self._lease.arm()

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
        self._began(key)
        self._runs[key] = task
        try:
            # shield: the caller going away (which cancels this handler) never cancels the run
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # retired before its first step: the run never began
                raise self._cancelled(key) from None
            raise

    def _began(self, key: ExecutionKey) -> None:
        """Note when ``key``'s run began; drop the start times of keys no status lists any more
        (ACKed, tombstoned) once they are as many as the listed ones (amortized O(1) a run)."""
        since = self._since
        since[key] = time.monotonic()
        if len(since) > 2 * self.core.active_count() + _SINCE_SLACK:
            self._since = {k: t for k, t in since.items() if self.core.is_active(k)}

    def knows(self, key: ExecutionKey) -> bool:
        """Whether ``key`` was ever seen (run, retired, or loaded from the store)."""
        return self.core.state_of(key) is not None

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
                raise agent_failure(exc) from exc
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
        await self._durable_read()
        return answer

    # ------------------------------------------------------------ control plane

    async def acknowledge(self, receipt: CompletionReceipt) -> AckAnswer:
        self._admit()
        answer = self.core.acknowledge(receipt)
        await self._durable()
        return answer

    async def acknowledge_exact(self, raw: bytes) -> tuple[bytes, int] | None:
        """The batch ACK's fast path (:mod:`.bulk`): the answer and how many it ACKed, or None
        for the checked path. A body of the stored receipts' bytes as our client splices them
        is compared whole; any other is compared receipt by receipt, canonically."""
        self._admit()
        parsed = ack_body(raw)
        if parsed is None:
            return None
        keys, receipts = parsed
        core = self.core
        acked = core.acknowledge_exact(keys, lambda got: b",".join(got).join(ACK_ENDS) == raw)
        if acked is None:
            pairs = canonical_pairs(keys, receipts)
            if pairs is None:
                return None
            acked = core.acknowledge_exact(keys, lambda got: got == [c for _, c in pairs])
        if acked is None:
            return None
        await self._durable()
        return acked_body(acked), len(acked)

    async def acknowledge_batch(self, receipts: Sequence[CompletionReceipt]) -> AckBatchAnswer:
        self._admit()
        answer = self.core.acknowledge_batch(receipts)
        await self._durable()
        return answer

    async def status(self, checkpoint_id: str | None) -> tuple[StatusReport, list[Execution]]:
        """The status's counts, and the records it lists (taken at the same moment)."""
        self._lease.expire()
        answer = self.core.status(checkpoint_id, listed=False)
        active = self.core.active()
        self._lease.renew(checkpoint_id, None)
        await self._durable_read()
        return answer, active

    async def retire(
        self, checkpoint_id: str | None, key: ExecutionKey, deadline_ts: float | None = None
    ) -> RetireAnswer:
        self._admit()
        answer, cancel = self.core.retire(checkpoint_id, key)
        self._lease.renew(checkpoint_id, deadline_ts)
        task = self._runs.pop(key, None) if cancel else None
        if task is not None:
            task.cancel()
        await self._durable()
        await self._notify()
        return answer

    async def retire_batch(
        self, checkpoint_id: str, keys: Sequence[ExecutionKey], deadline_ts: float | None = None
    ) -> list[RetireAnswer]:
        """(ext) ``retire`` of each key in one decision: one durable write, one notify."""
        self._admit()
        answers = []
        for key in keys:
            answer, cancel = self.core.retire(checkpoint_id, key)
            task = self._runs.pop(key, None) if cancel else None
            if task is not None:
                task.cancel()
            answers.append(answer)
        self._lease.renew(checkpoint_id, deadline_ts)
        await self._durable()
        await self._notify()
        return answers

    async def prepare(self, checkpoint_id: str, deadline_ts: float) -> StatusReport:
        """Close admission; wait until nothing runs or ``deadline_ts``; ready or 409."""
        self._admit()
        recorded = self.core.begin_prepare(checkpoint_id)
        self._lease.renew(checkpoint_id, deadline_ts)
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
        self._lease.expire()
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
            self._lease.renew(checkpoint_id, deadline_ts)
            if recorded is not None:
                return recorded
            await self._durable()
            try:
                written = await asyncio.to_thread(
                    write_checkpoint, directory, checkpoint_id, executions, name=self.name
                )
            except OSError as exc:
                raise GymRejected(
                    f"cannot write {checkpoint_dir!r}: {exc}", status=409, code="commit_failed"
                ) from exc
            answer = self.core.finish_commit(checkpoint_id, CommitAnswer.model_validate(written))
            self._lease.renew(checkpoint_id, deadline_ts)
            await self._durable()
            self._since = {k: t for k, t in self._since.items() if self.core.is_active(k)}
            return answer

    async def restore(
        self, checkpoint_id: str, checkpoint_dir: str, deadline_ts: float | None = None
    ) -> RestoreAnswer:
        """Check this instance's files in ``checkpoint_dir`` and hold admission closed until
        ``resume`` (phase ``restored_paused``), as a real Gym's restore does. The executions
        stay what this server's store holds."""
        try:
            directory = confine(self.checkpoint_root, checkpoint_dir)
        except ValueError as exc:
            raise InvalidRequest(f"checkpoint_dir: {exc}", status=422) from exc
        async with self._commit_lock:
            recorded = self.core.begin_restore(checkpoint_id)
            if recorded is not None:
                return recorded
            try:
                read = await asyncio.to_thread(read_checkpoint, directory, self.name)
            except CheckpointUnreadable as exc:
                raise GymRejected(str(exc), status=409, code="restore_failed") from None
            answer = self.core.finish_restore(checkpoint_id, RestoreAnswer.model_validate(read))
            self._lease.renew(checkpoint_id, deadline_ts)
            await self._durable()
            return answer

    def age_s(self, key: ExecutionKey) -> float:
        """Seconds since ``key``'s run began in this process (a key it did not start: since
        the server started), for status's ``age_seconds``."""
        return round(time.monotonic() - self._since.get(key, self._born), 3)

    async def resume(self, checkpoint_id: str) -> ResumeAnswer:
        self._admit()
        answer = self.core.resume(checkpoint_id)
        self._lease.arm()
        await self._durable()
        await self._notify()  # a prepare still waiting for this id ends now
        return answer

    def capabilities(self) -> dict[str, Any]:
        """The fence's side of the capabilities answer."""
        self._lease.expire()
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
            "completions": c.entered[S.COMPLETED],  # this process's, like agent_starts
            "acknowledgements": c.entered[S.ACKNOWLEDGED],
            "phase": c.fence.phase.value,
            "recovered": self.recovered,
        }

    async def stop_runs(self) -> None:
        """Cancel every agent call; their callers get 503. Their keys stay running in the store,
        so a restart on the same state dir tombstones them."""
        self._closing = True
        self._lease.cancel()
        await self._notify()  # waiting prepares end now
        tasks = list(self._runs.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def crash(self) -> None:
        """Stop writing at once, as a crash would (the server's ``kill``)."""
        self.store.crash()

    async def aclose(self) -> None:
        await self.stop_runs()
        close = getattr(self.agent, "aclose", None)
        if close is not None:
            await close()
        await asyncio.to_thread(self.store.close)
