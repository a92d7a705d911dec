"""Where a Gym server keeps what it has promised: completed replies (the exact bytes sent) with their
receipts, ACK fences, tombstones, generations and spent checkpoint ids.

Two stores with one interface:

- :class:`MemoryStore` keeps nothing itself (the participant's memory is the only copy).
- :class:`SqliteStore` (a state dir) writes every record to SQLite (WAL, ``synchronous=FULL``)
  from one writer thread that commits whatever has queued up in one transaction (group commit).

The contract both keep: :meth:`submit` queues records and returns a ticket at once, and
``await wait(ticket)`` returns only when that record and every record submitted before it is
durable. The participant awaits its ticket before it answers, so nothing is ever answered before
it is durable, while the fsync work stays off the event loop.

On open after a crash every key that was running (or parked) is tombstoned: its caller never got
an answer, and the run is gone.

:func:`write_checkpoint` writes a checkpoint's records into ``checkpoint_dir`` and then
``manifest.json`` last (temp file, fsync, rename), so a manifest never names missing records.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import json
import logging
import os
import queue
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol, Union

from rl_gym_actors.protocol import ExecutionKey, ExecutionState, canonical_json

logger = logging.getLogger(__name__)

DB_NAME = "gym-participant.sqlite3"
RECORDS_NAME = "gym-participant-records.jsonl"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "rl_gym_actors/gym-participant-checkpoint/1"


@dataclass(frozen=True, slots=True)
class Execution:
    """One key's record. Immutable: a transition replaces the record, so a record handed to the
    store can never change under it."""

    rollout_id: str
    attempt_index: int
    state: ExecutionState
    generation: int = 0
    reply: bytes | None = None       # the exact reply bytes, kept while completed and un-ACKed
    receipt: bytes | None = None     # canonical JSON of the receipt, kept once completed

    @property
    def key(self) -> ExecutionKey:
        return (self.rollout_id, self.attempt_index)


@dataclass(frozen=True, slots=True)
class SpentCheckpoint:
    """A checkpoint id that ``resume`` spent, with the answer that resume gave."""

    checkpoint_id: str
    answer: bytes


Record = Union[Execution, SpentCheckpoint]


@dataclass
class Loaded:
    """What a store held when it was opened."""

    executions: list[Execution] = field(default_factory=list)
    spent: dict[str, bytes] = field(default_factory=dict)
    recovered: int = 0               # keys tombstoned because they were running at the crash


class StoreFailed(RuntimeError):
    """The store cannot make records durable any more; nothing further may be answered."""


class Store(Protocol):
    durable: bool

    def load(self) -> Loaded: ...
    def submit(self, records: Iterable[Record]) -> int: ...
    async def wait(self, ticket: int) -> None: ...
    def close(self) -> None: ...
    def crash(self) -> None: ...


class MemoryStore:
    """No state dir: the participant's memory is the only copy; every wait returns at once."""

    durable = False

    def load(self) -> Loaded:
        return Loaded()

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
"""

_UPSERT_EXECUTION = "INSERT OR REPLACE INTO executions VALUES (?, ?, ?, ?, ?, ?)"
_UPSERT_SPENT = "INSERT OR REPLACE INTO spent_checkpoints VALUES (?, ?)"
_STOP = object()


class SqliteStore:
    """Records in ``<state_dir>/gym-participant.sqlite3``, written by one group-committing thread."""

    durable = True

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / DB_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.executescript(_SCHEMA)
        self._loaded = self._recover()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._submitted = 0
        self._durable_ticket = 0
        self._failure: BaseException | None = None
        self._crashed = False
        self._waiters: list[tuple[int, int, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._write_loop, name="gym-store-writer",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ open

    def _recover(self) -> Loaded:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        recovered = conn.execute(
            "UPDATE executions SET state = ?, reply = NULL WHERE state IN (?, ?)",
            (ExecutionState.TOMBSTONED.value, ExecutionState.RUNNING.value,
             ExecutionState.PARKED.value)).rowcount
        conn.execute("COMMIT")
        if recovered:
            logger.info("store %s: tombstoned %d executions that were running at the crash",
                        self.path, recovered)
        rows = conn.execute("SELECT rollout_id, attempt_index, state, generation, reply, receipt "
                            "FROM executions").fetchall()
        executions = [Execution(r[0], r[1], ExecutionState(r[2]), r[3], r[4], r[5]) for r in rows]
        spent = dict(conn.execute("SELECT checkpoint_id, answer FROM spent_checkpoints"))
        return Loaded(executions=executions, spent=spent, recovered=recovered)

    def load(self) -> Loaded:
        return self._loaded

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
            if self._failure is not None:
                raise StoreFailed(f"store {self.path} failed: {self._failure}")
            if ticket <= self._durable_ticket:
                return
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            heapq.heappush(self._waiters, (ticket, next(self._order), loop, fut))
        await fut

    def _write_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in batch)
            items = [item for item in batch if item is not _STOP]
            if self._crashed:
                return
            if items:
                self._commit(items)
            if stop:
                return

    def _commit(self, items: list[tuple[int, tuple[Record, ...]]]) -> None:
        executions, spent = [], []
        for _, records in items:
            for r in records:
                if isinstance(r, Execution):
                    executions.append((r.rollout_id, r.attempt_index, r.state.value, r.generation,
                                       r.reply, r.receipt))
                else:
                    spent.append((r.checkpoint_id, r.answer))
        error: BaseException | None = None
        try:
            self._conn.execute("BEGIN")
            if executions:
                self._conn.executemany(_UPSERT_EXECUTION, executions)
            if spent:
                self._conn.executemany(_UPSERT_SPENT, spent)
            self._conn.execute("COMMIT")   # synchronous=FULL: the WAL is fsynced here
        except sqlite3.Error as exc:
            logger.error("store %s: write failed; answering nothing further: %s", self.path, exc)
            error = exc
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        self._publish(items[-1][0], error)

    def _publish(self, ticket: int, error: BaseException | None) -> None:
        with self._lock:
            if error is not None and self._failure is None:
                self._failure = error
            else:
                self._durable_ticket = ticket
            ready = []
            while self._waiters and (self._failure is not None or self._waiters[0][0] <= ticket):
                ready.append(heapq.heappop(self._waiters))
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
        for _, _, loop, fut in ready:
            by_loop.setdefault(loop, []).append(fut)
        failure = self._failure
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, futs, failure, self.path)
            except RuntimeError:   # that loop is closed: nobody is waiting any more
                pass

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        """Write everything submitted, then close."""
        if not self._thread.is_alive():
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()

    def crash(self) -> None:
        """Stop as a kill -9 would: what is not yet committed is lost. For in-process tests."""
        self._crashed = True
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()
        self._publish(self._durable_ticket, RuntimeError("crashed"))   # fail every waiter


def _settle(futs: list[asyncio.Future], failure: BaseException | None, path: Path) -> None:
    for fut in futs:
        if fut.done():
            continue
        if failure is None:
            fut.set_result(None)
        else:
            fut.set_exception(StoreFailed(f"store {path} failed: {failure}"))


def open_store(state_dir: str | os.PathLike[str] | None) -> Store:
    """A durable store in ``state_dir``, or a memory store when it is None."""
    return MemoryStore() if state_dir is None else SqliteStore(state_dir)


# ---------------------------------------------------------------- checkpoint files

def _write_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoint_line(e: Execution) -> bytes:
    """One execution as a line of the checkpoint's records file."""
    receipt = json.loads(e.receipt) if e.receipt is not None else None
    return canonical_json({"rollout_id": e.rollout_id, "attempt_index": e.attempt_index,
                           "state": e.state.value, "execution_generation": e.generation,
                           "completion_receipt": receipt})


def write_checkpoint(checkpoint_dir: str | os.PathLike[str], checkpoint_id: str,
                     executions: Iterable[Execution]) -> dict[str, object]:
    """Write the records, then ``manifest.json`` last. Returns the commit answer
    ``{"records": n, "manifest_digest": sha256 of manifest.json}``. Raises OSError."""
    directory = Path(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [_checkpoint_line(e) for e in sorted(executions, key=lambda e: e.key)]
    records = b"".join(line + b"\n" for line in lines)
    _write_file(directory / RECORDS_NAME, records)
    manifest = canonical_json({"format": MANIFEST_FORMAT, "checkpoint_id": checkpoint_id,
                               "records": len(lines), "records_file": RECORDS_NAME,
                               "records_sha256": hashlib.sha256(records).hexdigest()})
    _write_file(directory / MANIFEST_NAME, manifest)
    _fsync_dir(directory)
    return {"records": len(lines), "manifest_digest": hashlib.sha256(manifest).hexdigest()}
