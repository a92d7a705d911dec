"""A simulated agent that counts what it does, for in-process Gym servers in tests and demos.

Give it to :class:`~rl_gym_actors.testing.gym_process.GymServerThread` as ``agent=``. It runs
:func:`~rl_gym_actors.gym.agents.simulated_agent` (``sleep_s``, ``reward``, ``fail``) and reads
three fields more: ``transient`` (true): the agent raises ``AgentTransientError`` (a failure that
is not the row's, tried again); ``first_try_sleep_s``: extra sleep for attempt 0 only (a first try
that outlives its deadline while the next one is quick); and ``hold`` (true): the run waits, after
its sleeps, until the test calls :meth:`CountingAgent.release` for its rollout (a run that finishes
only once the test says so). It counts agent starts per key and records which runs were cancelled
(retired) and which finished, so a test can say "the agent ran this key once" or "the retired try
was really cancelled".
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

from rl_gym_actors.errors import AgentTransientError
from rl_gym_actors.gym.agents import simulated_agent
from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD, ExecutionKey


class CountingAgent:
    """An async agent callable; thread-safe to read from the test's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.starts: Counter[ExecutionKey] = Counter()
        self.finished: set[ExecutionKey] = set()
        self.cancelled: set[ExecutionKey] = set()
        self.released: set[str] = set()  # rollouts whose held runs may finish

    def release(self, rollout_id: str) -> None:
        """Let the held runs (row field ``hold``) of this rollout finish."""
        with self._lock:
            self.released.add(rollout_id)

    def _held(self, rollout_id: str) -> bool:
        with self._lock:
            return rollout_id not in self.released

    def runs_of(self, rollout_id: str) -> int:
        """How many times the agent started any try of this rollout."""
        with self._lock:
            return sum(n for (rid, _), n in self.starts.items() if rid == rollout_id)

    async def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        key = (str(row.get(ROLLOUT_ID_FIELD)), int(row.get(ATTEMPT_INDEX_FIELD, 0)))
        with self._lock:
            self.starts[key] += 1
        try:
            if key[1] == 0 and float(row.get("first_try_sleep_s", 0)) > 0:
                await asyncio.sleep(float(row["first_try_sleep_s"]))
            if row.get("transient"):  # a failure that is not the row's: tried again
                raise AgentTransientError("the row asked for a transient failure")
            reply = await simulated_agent(row)
            while row.get("hold") is True and self._held(key[0]):
                await asyncio.sleep(0.02)  # released from the test's thread
        except asyncio.CancelledError:
            with self._lock:
                self.cancelled.add(key)
            raise
        with self._lock:
            self.finished.add(key)
        return reply


# One shared instance, so that a server started as a subprocess can load it by name:
# ``rl-gym-actors gym serve --agent rl_gym_actors.testing.counting_agent:agent``.
agent = CountingAgent()


class HeldAgent:
    """An async agent whose runs wait until the test calls :meth:`release`, then answer
    ``reply``: a run that is surely still going while the test acts, and ends when the test
    says (instead of a ``sleep_s`` long enough to outlast the test's steps, then waited out).
    ``started`` counts the runs that began. Cancel-safe: a cancelled run stops waiting."""

    POLL_S = 0.005

    def __init__(self, reply: dict[str, Any] | None = None) -> None:
        self.reply = {"ok": True} if reply is None else reply
        self.started = 0
        self._released = threading.Event()

    def release(self) -> None:
        """Let every held run (and every later one) answer."""
        self._released.set()

    async def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        self.started += 1
        while not self._released.is_set():
            await asyncio.sleep(self.POLL_S)
        return dict(self.reply)
