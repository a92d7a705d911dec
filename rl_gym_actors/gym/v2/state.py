"""(ext) What a v2 participant of ours keeps across a crash: ``gym serve --protocol v2
--state-dir DIR`` writes it to ``DIR/v2-state.sqlite`` (without ``--state-dir`` it lives in
memory only, as a real Gym's does).

- **Kept replies**: a finished episode's reply, by rollout and attempt, until the controller
  retires that attempt or forgets the rollout (written before ``/run`` answers, so a reply lost
  on the wire is replayed after a ``kill -9`` and the agent does not run again).
- **Retired marks**: per rollout, the highest retired attempt (written before retire stops
  anything), until ``forget``: a restart does not readmit a retired attempt.
- **Committed checkpoints**: a commit's answer, by checkpoint id, until that id is resumed, so a
  controller whose commit answer was lost retries it after a restart and gets the same answer.

Phases, the lease, the resumed-id fence, parked and restored episodes stay in memory: a
restarted participant is idle, as NeMo Gym's is after a restart.

Each write runs on one thread of its own, in the order the event loop issued it, and is durable
(SQLite, WAL, ``synchronous=FULL``) before the awaiting call answers. A failed write is 503
``store_write_failed``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_gym_actors.errors import GymError
from rl_gym_actors.gym.v2.wire import EpisodeId

FILE_NAME = "v2-state.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS kept (
    rollout_id TEXT NOT NULL, attempt INTEGER NOT NULL, reply BLOB NOT NULL,
    PRIMARY KEY (rollout_id, attempt));
CREATE TABLE IF NOT EXISTS retired (rollout_id TEXT PRIMARY KEY, mark INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS committed (checkpoint_id TEXT PRIMARY KEY, answer TEXT NOT NULL);
"""


class StateWriteFailed(GymError):
    """503 ``store_write_failed``: the state dir did not take a write (nothing was answered
    as durable)."""

    code = "store_write_failed"


@dataclass
class Loaded:
    kept: dict[str, dict[int, bytes]] = field(default_factory=dict)
    marks: dict[str, int] = field(default_factory=dict)
    committed: dict[str, dict[str, Any]] = field(default_factory=dict)


class V2State:
    """The durable (ext) state of one v2 participant (see the module docstring)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="v2-state")
        self._crashed = threading.Event()

    def load(self) -> Loaded:
        loaded = Loaded()
        for rollout_id, attempt, reply in self._db.execute(
            "SELECT rollout_id, attempt, reply FROM kept"
        ):
            loaded.kept.setdefault(rollout_id, {})[attempt] = bytes(reply)
        loaded.marks = dict(self._db.execute("SELECT rollout_id, mark FROM retired"))
        for checkpoint_id, answer in self._db.execute(
            "SELECT checkpoint_id, answer FROM committed"
        ):
            loaded.committed[checkpoint_id] = json.loads(answer)
        return loaded

    # ------------------------------------------------------------ writes

    async def _write(self, statements: Callable[[sqlite3.Connection], object]) -> None:
        def run() -> None:
            if self._crashed.is_set():
                raise OSError("the state store crashed")
            with self._db:  # one transaction
                self._db.execute("BEGIN")
                statements(self._db)

        try:
            await asyncio.get_running_loop().run_in_executor(self._writer, run)
        except (OSError, sqlite3.Error) as exc:
            raise StateWriteFailed(f"cannot write {self.path}: {exc}", status=503) from exc

    async def keep(self, episode: EpisodeId, reply: bytes) -> None:
        await self._write(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO kept VALUES (?, ?, ?)",
                (episode.rollout_id, episode.attempt, reply),
            )
        )

    async def retire(self, episodes: Iterable[EpisodeId]) -> None:
        """Raise each rollout's mark; drop its kept replies of the retired attempts."""
        rows = [(e.rollout_id, e.attempt) for e in episodes]

        def statements(db: sqlite3.Connection) -> None:
            for rollout_id, attempt in rows:
                db.execute(
                    "INSERT INTO retired VALUES (?, ?) ON CONFLICT (rollout_id) "
                    "DO UPDATE SET mark = max(mark, excluded.mark)",
                    (rollout_id, attempt),
                )
                db.execute(
                    "DELETE FROM kept WHERE rollout_id = ? AND attempt <= ?", (rollout_id, attempt)
                )

        await self._write(statements)

    async def forget(self, rollout_ids: Iterable[str]) -> None:
        ids = [(r,) for r in rollout_ids]

        def statements(db: sqlite3.Connection) -> None:
            db.executemany("DELETE FROM retired WHERE rollout_id = ?", ids)
            db.executemany("DELETE FROM kept WHERE rollout_id = ?", ids)

        await self._write(statements)

    async def committed(self, checkpoint_id: str, answer: dict[str, Any]) -> None:
        body = json.dumps(answer, separators=(",", ":"))
        await self._write(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO committed VALUES (?, ?)", (checkpoint_id, body)
            )
        )

    async def resumed(self, checkpoint_id: str) -> None:
        await self._write(
            lambda db: db.execute("DELETE FROM committed WHERE checkpoint_id = ?", (checkpoint_id,))
        )

    # ------------------------------------------------------------ lifecycle

    def crash(self) -> None:
        """Write nothing more, as a crash would (for in-process restart tests)."""
        self._crashed.set()

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._db.close()
