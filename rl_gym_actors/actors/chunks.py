"""Rows to rollout actors in chunks: one Ray call per actor per turn of the event loop.

The orchestrator leases a slot per row as before and awaits :meth:`ChunkSender.run` for the
row's outcome. Rows leased on the same actor within one turn of the loop leave as one
``run_chunk`` call of :class:`~rl_gym_actors.actors.messages.RolloutTask` s, a Ray streaming
generator that hands back a :class:`~rl_gym_actors.actors.messages.ChunkResult` per row as soon
as its rollout ends (bunched when several end together); a lone row goes as a plain ``run``
call, which costs less than a stream of one (its result awaited through
:class:`~rl_gym_actors.actors.completions.Completions`). A failure of the call itself (the actor
died) fails each of its rows that had not ended with that error, exactly as a call per row
would; a row whose waiter was cancelled is skipped when its outcome arrives.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray.exceptions import RayTaskError

from rl_gym_actors.actors.completions import Completions
from rl_gym_actors.actors.messages import ChunkResult, RolloutTask
from rl_gym_actors.errors import PoolClosed
from rl_gym_actors.outcome import Outcome

logger = logging.getLogger(__name__)

_Entry = tuple[RolloutTask, "asyncio.Future[Outcome]"]  # a row and its waiter


class ChunkSender:
    """Collects rows per actor during one loop turn and sends them as one streaming call."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[Any, list[_Entry]]] = {}
        self._scheduled = False
        self._completions = Completions()  # lone calls' results, fewer loop wake-ups
        self._calls: set[asyncio.Task] = set()
        self.calls = 0
        self.rows = 0

    def run(self, handle: Any, task: RolloutTask) -> asyncio.Future[Outcome]:
        """The future outcome of ``handle.run(task)``, sent with this turn's chunk."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        entry = self._pending.get(id(handle))
        if entry is None:
            entry = self._pending[id(handle)] = (handle, [])
        entry[1].append((task, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for handle, entries in pending.values():
            live = [(task, fut) for task, fut in entries if not fut.done()]
            if not live:
                continue
            self.calls += 1
            self.rows += len(live)
            task = asyncio.ensure_future(self._send(handle, live))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _send(self, handle: Any, entries: list[_Entry]) -> None:
        futures = [fut for _, fut in entries]
        try:
            if len(entries) == 1:
                # a chunk of one is a plain call: a stream of one item costs more than its reply
                outcome = await self._completions.wait(handle.run.remote(entries[0][0]))
                if not futures[0].done():
                    futures[0].set_result(outcome)
                return
            stream = handle.run_chunk.remote([task for task, _ in entries])
            async for ref in stream:
                results: list[ChunkResult] = await ref
                for result in results:
                    fut = futures[result.position]
                    if fut.done():
                        continue
                    if result.error is not None:
                        fut.set_exception(result.error)
                    elif result.outcome is not None:
                        fut.set_result(result.outcome)
            error: BaseException = PoolClosed(
                "the rollout actor ended a chunk without an outcome for this row"
            )
        except RayTaskError as exc:  # run_rollout raised (a bad argument, or closed)
            error = exc.cause if isinstance(exc.cause, BaseException) else exc
        except Exception as exc:  # the call failed (actor died or unreachable)
            error = exc
        for fut in futures:
            if not fut.done():
                fut.set_exception(error)
