"""Where a Gym server keeps what it has promised: completed replies (the exact bytes sent) with
their receipts, ACK fences, tombstones, generations, spent checkpoint ids and the checkpoint fence.

Two stores with one interface:

- :class:`MemoryStore` keeps nothing itself (the participant's memory is the only copy).
- :class:`SqliteStore` (a state dir) writes every record to SQLite (WAL, ``synchronous=FULL``)
  from one writer thread that commits whatever has queued up in one transaction (group commit).

The contract both keep: :meth:`submit` queues records and returns a ticket at once, and
``await wait(ticket)`` returns only when that record and every record submitted before it is
durable. The participant awaits its ticket before it answers, so nothing is ever answered before
it is durable, while the fsync work stays off the event loop.

A write that fails (any exception, never only SQLite's) fails the waiters of that transaction
with :class:`StoreFailed` and keeps its records to write again, first thing in the next
transaction (and at least every :data:`RETRY_S` seconds); the writer thread never dies. After
:data:`BROKEN_AFTER` failed writes in a row the store is ``broken``: a wait fails at once, and
the participant refuses what would write, until a retry succeeds.

On open after a crash every key that was running (or parked) is tombstoned: its caller never got
an answer, and the run is gone.

The files a commit writes are :mod:`rl_gym_actors.gym.checkpoint_files`'.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import os
import queue
import sqlite3
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rl_gym_actors.gym.fence import CheckpointPhase, FenceState
from rl_gym_actors.protocol import ExecutionKey, ExecutionState

logger = logging.getLogger(__name__)

DB_NAME = "gym-participant.sqlite3"
RETRY_S = 0.5  # a failed write is tried again at least this often
BROKEN_AFTER = 3  # failed writes in a row after which the store counts as broken


@dataclass(frozen=True, slots=True)
class Execution:
    """One key's record. Immutable: a transition replaces the record, so a record handed to the
    store can never change under it."""

    rollout_id: str
    attempt_index: int
    state: ExecutionState
    generation: int = 0
    reply: bytes | None = None  # the exact reply bytes, kept while completed and un-ACKed
    receipt: bytes | None = None  # canonical JSON of the receipt, kept once completed

    @property
    def key(self) -> ExecutionKey:
        return (self.rollout_id, self.attempt_index)


@dataclass(frozen=True, slots=True)
class SpentCheckpoint:
    """A checkpoint id that ``resume`` (or a lease expiry) spent, with resume's answer."""

    checkpoint_id: str
    answer: bytes


@dataclass(frozen=True, slots=True)
class FenceRecord:
    """The checkpoint fence as it stands (one row, replaced on each change)."""

    state: FenceState


Record = Execution | SpentCheckpoint | FenceRecord


def _identity(record: Record) -> tuple[Any, ...]:
    """Records with the same identity replace each other (the later one wins)."""
    if isinstance(record, Execution):
        return ("e", record.rollout_id, record.attempt_index)
    if isinstance(record, SpentCheckpoint):
        return ("s", record.checkpoint_id)
    return ("f",)


@dataclass
class Loaded:
    """What a store held when it was opened."""

    executions: list[Execution] = field(default_factory=list)
    spent: dict[str, bytes] = field(default_factory=dict)
    recovered: int = 0  # keys tombstoned because they were running at the crash
    fence: FenceState | None = None


class StoreFailed(RuntimeError):
    """Records could not be made durable: the waiting request must not be answered as done.
    ``broken``: the store has failed several writes in a row (refuse at once until it heals)."""

    def __init__(self, message: str, *, broken: bool = False) -> None:
        super().__init__(message)
        self.broken = broken


class Store(Protocol):
    durable: bool

    @property
    def healthy(self) -> bool: ...
    @property
    def broken(self) -> bool: ...
    def load(self) -> Loaded: ...
    def lookup(self, key: ExecutionKey) -> Execution | None: ...
    def submit(self, records: Iterable[Record]) -> int: ...
    async def wait(self, ticket: int) -> None: ...
    def close(self) -> None: ...
    def crash(self) -> None: ...


class MemoryStore:
    """No state dir: the participant's memory is the only copy; every wait returns at once."""

    durable = False
    healthy = True
    broken = False

    def load(self) -> Loaded:
        return Loaded()

    def lookup(self, key: ExecutionKey) -> Execution | None:
        return None

    def submit(self, records: Iterable[Record]) -> int:
        return 0

    async def wait(self, ticket: int) -> None:
        return None

    def close(self) -> None:
        return None

    def crash(self) -> None:
        return None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    rollout_id TEXT NOT NULL,
    attempt_index INTEGER NOT NULL,
    state TEXT NOT NULL,
    generation INTEGER NOT NULL,
    reply BLOB,
    receipt BLOB,
    PRIMARY KEY (rollout_id, attempt_index)
);
CREATE TABLE IF NOT EXISTS spent_checkpoints (
    checkpoint_id TEXT PRIMARY KEY,
    answer BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS fence (
    one INTEGER PRIMARY KEY CHECK (one = 0),
    phase TEXT NOT NULL,
    active TEXT,
    answers BLOB NOT NULL,
    lease_until REAL
);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

_UPSERT_EXECUTION = "INSERT OR REPLACE INTO executions VALUES (?, ?, ?, ?, ?, ?)"
_UPSERT_SPENT = "INSERT OR REPLACE INTO spent_checkpoints VALUES (?, ?)"
_UPSERT_FENCE = "INSERT OR REPLACE INTO fence VALUES (0, ?, ?, ?, ?)"
_SELECT_EXECUTION = (
    "SELECT rollout_id, attempt_index, state, generation, reply, receipt FROM executions"
)
_STOP = object()


def _execution(row: tuple) -> Execution:
    return Execution(row[0], row[1], ExecutionState(row[2]), row[3], row[4], row[5])


class SqliteStore:
    """Records in ``<state_dir>/gym-participant.sqlite3``, written by one group-committing
    thread."""

    durable = True

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / DB_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.executescript(_SCHEMA)
        self.epoch = self._epoch()
        self._loaded = self._recover()
        self._reader: sqlite3.Connection | None = None  # lookups, from the event loop
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._submitted = 0
        self._durable_ticket = 0  # every ticket up to here is durable
        self._processed_ticket = 0  # every ticket up to here was tried
        self._pending: dict[tuple[Any, ...], Record] = {}  # failed, to write again
        self._failures = 0  # failed writes in a row
        self.transactions = 0  # committed transactions (one fsync each)
        self.records_written = 0
        self._last_error: BaseException | None = None
        self._crashed = False
        self._waiters: list[tuple[int, int, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._order = itertools.count()
        self._thread = threading.Thread(
            target=self._write_loop, name="gym-store-writer", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------ open

    def _epoch(self) -> str:
        """(ext) The store epoch: a uuid written once into a fresh state dir, the same for
        every server that opens it later; a client that sees it change knows the server lost
        what it held."""
        self._conn.execute(
            "INSERT OR IGNORE INTO meta VALUES ('store_epoch', ?)", (uuid.uuid4().hex,)
        )
        row = self._conn.execute("SELECT value FROM meta WHERE name = 'store_epoch'").fetchone()
        return str(row[0])

    def _recover(self) -> Loaded:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        recovered = conn.execute(
            "UPDATE executions SET state = ?, reply = NULL WHERE state IN (?, ?)",
            (
                ExecutionState.TOMBSTONED.value,
                ExecutionState.RUNNING.value,
                ExecutionState.PARKED.value,
            ),
        ).rowcount
        conn.execute("COMMIT")
        if recovered:
            logger.info(
                "store %s: tombstoned %d executions that were running at the crash",
                self.path,
                recovered,
            )
        executions = [_execution(r) for r in conn.execute(_SELECT_EXECUTION)]
        spent = dict(conn.execute("SELECT checkpoint_id, answer FROM spent_checkpoints"))
        fence = None
        row = conn.execute("SELECT phase, active, answers, lease_until FROM fence").fetchone()
        if row is not None:
            fence = FenceState(CheckpointPhase(row[0]), row[1], json.loads(row[2]), row[3])
        return Loaded(executions=executions, spent=spent, recovered=recovered, fence=fence)

    def load(self) -> Loaded:
        return self._loaded

    def lookup(self, key: ExecutionKey) -> Execution | None:
        """The durable record of ``key`` (for keys the participant no longer keeps in memory)."""
        if self._reader is None:
            self._reader = sqlite3.connect(self.path, check_same_thread=False)
        row = self._reader.execute(
            _SELECT_EXECUTION + " WHERE rollout_id = ? AND attempt_index = ?", key
        ).fetchone()
        return None if row is None else _execution(row)

    # ------------------------------------------------------------ health

    @property
    def healthy(self) -> bool:
        """Everything submitted so far that was tried is durable."""
        return not self._pending and not self._crashed

    @property
    def broken(self) -> bool:
        """Several writes in a row failed (or the store crashed): refuse at once."""
        return self._crashed or self._failures >= BROKEN_AFTER

    def _error(self) -> StoreFailed:
        return StoreFailed(
            f"store {self.path}: write failed: {self._last_error!r}", broken=self.broken
        )

    # ------------------------------------------------------------ writing

    def submit(self, records: Iterable[Record]) -> int:
        records = tuple(records)
        with self._lock:
            if records:
                self._submitted += 1
                # under the lock: queue order is ticket order, which makes wait() a barrier
                self._queue.put((self._submitted, records))
            return self._submitted

    async def wait(self, ticket: int) -> None:
        with self._lock:
            if ticket <= self._durable_ticket:
                return
            if self.broken or ticket <= self._processed_ticket:
                raise self._error()  # tried and failed: not durable yet
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            heapq.heappush(self._waiters, (ticket, next(self._order), loop, fut))
        await fut

    def _write_loop(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=RETRY_S if self._pending else None)
            except queue.Empty:
                first = None  # time to write the failed records again
            batch = [] if first is None else [first]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in batch)
            items = [item for item in batch if item is not _STOP]
            if self._crashed:
                return
            try:
                if items or self._pending:
                    self._commit(items)
            except BaseException:  # never let the writer die: log and go on
                logger.exception("store %s: writer step failed", self.path)
            if stop:
                return

    def _commit(self, items: list[tuple[int, tuple[Record, ...]]]) -> None:
        records = dict(self._pending)
        for _, batch in items:
            for r in batch:
                records[_identity(r)] = r
        last = items[-1][0] if items else self._processed_ticket
        try:
            self._write(list(records.values()))
        except Exception as exc:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            with self._lock:
                self._pending = records
                self._failures += 1
                self._last_error = exc
            logger.error(
                "store %s: write of %d records failed (%d in a row); they are kept "
                "and written again: %r",
                self.path,
                len(records),
                self._failures,
                exc,
            )
            self._publish(last, ok=False)
            return
        with self._lock:
            if self._pending:
                logger.warning("store %s: writes work again", self.path)
            self._pending = {}
            self._failures = 0
            self._durable_ticket = last
        self._publish(last, ok=True)

    def _write(self, records: list[Record]) -> None:
        """One transaction with every record (synchronous=FULL: fsynced at COMMIT)."""
        executions, spent, fence = [], [], None
        for r in records:
            if isinstance(r, Execution):
                executions.append(
                    (r.rollout_id, r.attempt_index, r.state.value, r.generation, r.reply, r.receipt)
                )
            elif isinstance(r, SpentCheckpoint):
                spent.append((r.checkpoint_id, r.answer))
            else:
                fence = r.state
        conn = self._conn
        conn.execute("BEGIN")
        if executions:
            conn.executemany(_UPSERT_EXECUTION, executions)
        if spent:
            conn.executemany(_UPSERT_SPENT, spent)
        if fence is not None:
            conn.execute(
                _UPSERT_FENCE,
                (
                    fence.phase.value,
                    fence.active,
                    json.dumps(fence.answers).encode(),
                    fence.lease_until,
                ),
            )
        conn.execute("COMMIT")
        self.transactions += 1
        self.records_written += len(records)

    def _publish(self, ticket: int, *, ok: bool) -> None:
        with self._lock:
            self._processed_ticket = max(self._processed_ticket, ticket)
            ready = []
            while self._waiters and (self._crashed or self._waiters[0][0] <= ticket):
                ready.append(heapq.heappop(self._waiters))
            failure = None if ok else self._error()
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
        for _, _, loop, fut in ready:
            by_loop.setdefault(loop, []).append(fut)
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, futs, failure)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        """Write everything submitted, then close."""
        if not self._thread.is_alive():
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()
        if self._reader is not None:
            self._reader.close()

    def crash(self) -> None:
        """Stop as a kill -9 would: what is not yet committed is lost. For in-process tests."""
        self._crashed = True
        self._last_error = RuntimeError("crashed")
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()
        self._publish(self._processed_ticket, ok=False)  # fail every waiter


def _settle(futs: list[asyncio.Future], failure: StoreFailed | None) -> None:
    for fut in futs:
        if fut.done():
            continue
        if failure is None:
            fut.set_result(None)
        else:
            fut.set_exception(failure)


def open_store(state_dir: str | os.PathLike[str] | None) -> Store:
    """A durable store in ``state_dir``, or a memory store when it is None."""
    return MemoryStore() if state_dir is None else SqliteStore(state_dir)
