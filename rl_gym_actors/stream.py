"""A stream of rows run as rollouts, outcomes taken as each ends: :class:`Stream`.

``Orchestrator.stream(rows)`` / ``astream(rows)`` yield ``(index, outcome)`` (an
:class:`IndexedOutcome`) as each rollout ends; ``run_batch`` is the collected stream. An open
stream (``astream`` of an async iterable) takes each row as it arrives (:meth:`Stream.add`), so a
trainer can keep a fixed number in flight across steps. Stopping a stream before its end
abandons the rest exactly as ``fail_fast`` does (each running try is retired, and one that had
finished is adopted and its result kept for the rollout's next row); an outcome that ended but
was not taken is kept the same way.

A stream lives on the orchestrator's loop; it runs each row with a
:class:`~rl_gym_actors.dispatch.RowRunner` and tells the rollout memory when a dispatch begins
and ends.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.dispatch import Batch, RowRunner
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.received import Received
from rl_gym_actors.rows import RowItem, RowPlanner


class IndexedOutcome(NamedTuple):
    """One streamed outcome and the index of its row (its position in the rows fed)."""

    index: int  # type: ignore[assignment]  # shadows tuple.index: the public name of the field
    outcome: Outcome


class Stream:
    """One stream on the orchestrator's loop: rows dispatched as they come, outcomes queued as
    their rollouts end, taken in bunches by :meth:`next`."""

    def __init__(
        self,
        runner: RowRunner,
        planner: RowPlanner,
        memory: RolloutMemory,
        fail_fast: bool,
        bar: Any,
        received: Received | None = None,
    ) -> None:
        self._runner, self._planner, self._memory, self._bar = runner, planner, memory, bar
        self._received = received or Received()  # what was handed out (snapshot()'s counts)
        self._batch = Batch(fail_fast)
        self._tasks: set[asyncio.Task] = set()
        self._ended: list[IndexedOutcome] = []
        self._wake = asyncio.Event()
        self._rows_done = False
        self._error: BaseException | None = None
        self._stopped = False
        self._cancelled = False
        self.fed = 0

    def dispatch(self, item: RowItem) -> None:
        self._memory.take(item.rollout_id, item.plan)  # answered from a result, or running
        task = asyncio.ensure_future(self._runner.run(item, self._batch, self._bar))
        self._tasks.add(task)
        if item.ready is None:
            self._batch.waiting[item.rollout_id] = task
        task.add_done_callback(functools.partial(self._on_end, item))
        self.fed += 1

    async def add(self, row: Mapping[str, Any]) -> None:
        """One more row (checked now; ConfigError when malformed)."""
        if self._rows_done or self._stopped:
            raise ConfigError("this stream takes no more rows")
        self.dispatch(self._planner.plan_one(self.fed, row))

    def end_of_rows_now(self, error: BaseException | None = None) -> None:
        self._rows_done = True
        if error is not None and self._error is None:
            self._error = error
        self._wake.set()

    async def end_of_rows(self, error: BaseException | None = None) -> None:
        self.end_of_rows_now(error)

    def _on_end(self, item: RowItem, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._batch.waiting.pop(item.rollout_id, None)
        if item.ready is None:
            # the one end of the dispatch, also when its task was cancelled before it began
            self._memory.end(item.rollout_id, item.plan, item.news, lost=item.lost)
        if task.cancelled():
            pass
        elif task.exception() is not None:
            if self._error is None:
                self._error = task.exception()
        else:
            self._ended.append(IndexedOutcome(item.index, task.result()))
        self._wake.set()

    async def next(self) -> list[IndexedOutcome] | None:
        """The outcomes that ended since the last call (waiting for one); None at the end."""
        while True:
            if self._error is not None:
                raise self._error
            if self._ended:
                ended, self._ended = self._ended, []
                self._received.add(o.outcome for o in ended)
                return ended
            if self._rows_done and not self._tasks:
                return None
            self._wake.clear()
            await self._wake.wait()

    async def collect(self) -> list[Outcome]:
        """Every outcome, in row order (``run_batch``); stops the stream. A caller that gives up
        (cancellation) cancels every row: each running rollout retires its try."""
        outcomes: list[Outcome | None] = [None] * self.fed
        try:
            while (ended := await self.next()) is not None:
                for index, outcome in ended:
                    outcomes[index] = outcome
        except BaseException:
            self.cancel()
            raise
        finally:
            await self.stop(())
        done = [o for o in outcomes if o is not None]
        assert len(done) == self.fed, "a stream ran to its end without every row's outcome"
        return done

    def cancel(self) -> None:
        """The caller gave up: cancel every row (a running rollout retires its try)."""
        self._cancelled = True
        for task in list(self._tasks):
            task.cancel()

    async def stop(self, untaken: Iterable[IndexedOutcome]) -> None:
        """End the stream: what still runs is abandoned as ``fail_fast`` does; outcomes that
        ended but were not taken keep their results for their rollouts' next rows."""
        if self._stopped:
            return
        self._stopped = True
        self._rows_done = True
        untaken = list(untaken)
        self._received.add((o.outcome for o in untaken), -1)  # returned by next(), not taken
        if self._tasks and not self._cancelled:
            self._runner.stop(self._batch)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._batch.abandons:
            await asyncio.gather(*self._batch.abandons, return_exceptions=True)
        for _, outcome in (*untaken, *self._ended):
            self._memory.keep(outcome)
        self._ended = []
        if self._bar is not None:
            self._bar.close()
