"""One long-lived :meth:`Orchestrator.astream` that every rollout of the drop-in is fed into.

The drop-in starts a rollout per row as RL's streams ask for them, and a rollout outlives the
stream that asked (a cancelled stream's rows wait for RL's re-dispatch), so rows arrive one by
one, from many streams, at any time. :class:`RolloutFeed` keeps one orchestrator stream open
over a queue of rows: :meth:`run` queues a row and waits for its outcome, matched by the stream's
index (the row's position in what was fed). Should the stream end (a row the orchestrator refuses
ends it with ConfigError; its other rollouts are abandoned), the waiting rollouts fail with
:class:`FeedClosed` (infrastructure: RL re-dispatches them) and the next row opens a new stream; the
drop-in checks rows before feeding them so that this stays rare. :meth:`aclose` ends it, abandoning
what is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD


def check_json(row: Mapping[str, Any]) -> None:
    """ConfigError unless the row is strict JSON (no NaN), as the orchestrator requires."""
    try:
        json.dumps(row, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"row {row.get(ROLLOUT_ID_FIELD)} is not JSON: {exc}") from None


class FeedClosed(RuntimeError):
    """The orchestrator stream ended before this rollout's outcome came."""


class _Feed:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Mapping[str, Any] | None] = asyncio.Queue()
        self.waiting: dict[int, asyncio.Future[Outcome]] = {}
        self.fed = 0
        self.task: asyncio.Task[None] | None = None

    async def rows(self) -> AsyncIterator[Mapping[str, Any]]:
        while (row := await self.queue.get()) is not None:
            yield row


class RolloutFeed:
    """See the module docstring. One event loop."""

    def __init__(self, orch: Any) -> None:
        self._orch = orch
        self._feed: _Feed | None = None
        self.streams = 0  # orchestrator streams opened

    def _open(self) -> _Feed:
        feed = self._feed
        if feed is None or feed.task is None or feed.task.done():
            feed = self._feed = _Feed()
            # a context of its own: RL cancelling the Ray call that fed a row must not end it
            feed.task = asyncio.create_task(
                self._consume(feed), name="rlga-nemo-rl-feed", context=contextvars.Context()
            )
            self.streams += 1
        return feed

    async def _consume(self, feed: _Feed) -> None:
        error: BaseException | None = None
        try:
            async with contextlib.aclosing(self._orch.astream(feed.rows())) as stream:
                async for index, outcome in stream:
                    waiter = feed.waiting.pop(index, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(outcome)
        except asyncio.CancelledError:
            error = FeedClosed("the drop-in is shutting down")
            raise
        except Exception as exc:  # handed to every rollout still waiting on this stream
            error = exc
        finally:
            # infrastructure to RL (the row itself may be fine): it re-dispatches them
            closed = FeedClosed(f"the orchestrator stream ended: {error!r}")
            for waiter in feed.waiting.values():
                if not waiter.done():
                    waiter.set_exception(closed)
            feed.waiting.clear()

    async def run(self, row: Mapping[str, Any]) -> Outcome:
        """Feed one row; its outcome once its rollout has ended."""
        feed = self._open()
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        feed.waiting[feed.fed] = waiter
        feed.fed += 1
        feed.queue.put_nowait(row)
        return await waiter

    async def aclose(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None and feed.task is not None and not feed.task.done():
            feed.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feed.task
